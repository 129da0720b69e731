//! Code-heap benchmarks: publish and publish+free cost by method size (and
//! what evaluating a method's `.eh_frame` into unwind rows adds), and
//! `CodeHeap::find` against the raw v2 map lookup it is built on.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use jitmap::heap::{EhFrame, JitKind};
use jitmap::perf::{PerfConfig, PerfMode};
use jitmap::{CodeHeap, CodeInfo, Domain, HeapConfig, MapVersion, Reservation};
use jitmap_testkit::frameless::{FRAME_POINTER_CFI, eh_frame};
use jitmap_testkit::rng::Rng;
use jitmap_testkit::workload::method_size;

const SIZES: [(u64, &str); 4] = [
    (64, "64B"),
    (1 << 10, "1KiB"),
    (64 << 10, "64KiB"),
    (1 << 20, "1MiB"),
];
const BATCH: usize = 32;

fn heap(version: MapVersion) -> CodeHeap {
    let domain = Domain::new(4);
    CodeHeap::new(
        HeapConfig {
            span: 256 << 20,
            version,
            ..HeapConfig::default()
        },
        &domain,
    )
    .unwrap()
}

/// The time `iters` publishes of `size`-byte methods take, each with the
/// info `info_for` gives its reservation: reservations made and freed
/// outside the timed region, in batches so the clock's own cost is spread
/// thin.
fn timed_publishes(
    heap: &CodeHeap,
    size: u64,
    iters: u64,
    info_for: impl Fn(&Reservation<'_>) -> CodeInfo,
) -> Duration {
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(BATCH as u64) as usize;
        let reservations: Vec<_> = (0..n).map(|_| heap.reserve(size).unwrap()).collect();
        let infos: Vec<_> = reservations.iter().map(&info_for).collect();
        let t = Instant::now();
        let refs: Vec<_> = reservations
            .into_iter()
            .zip(infos)
            .map(|(r, i)| r.publish(i).unwrap())
            .collect();
        total += t.elapsed();
        for r in refs {
            heap.free(r).unwrap();
        }
        left -= n as u64;
    }
    total
}

fn write(c: &mut Criterion) {
    let mut group = c.benchmark_group("write");
    for version in [MapVersion::V1, MapVersion::V2] {
        let heap = heap(version);
        let info = CodeInfo::new(1, "bench::method", JitKind::Optimized);
        for (size, label) in SIZES {
            group.bench_function(BenchmarkId::new(format!("publish/{version}"), label), |b| {
                b.iter_custom(|iters| timed_publishes(&heap, size, iters, |_| info.clone()))
            });
            group.bench_function(
                BenchmarkId::new(format!("reserve_publish_free/{version}"), label),
                |b| {
                    b.iter(|| {
                        let r = heap.reserve(size).unwrap();
                        heap.free(r.publish(info.clone()).unwrap()).unwrap();
                    })
                },
            );
        }
    }
    // A method's `.eh_frame` is evaluated into unwind rows when it is
    // published: the same 64-byte publish without and with one (four CFI
    // rows, as `push rbp; mov rbp, rsp; ...; pop rbp; ret` has).
    let heap = heap(MapVersion::V2);
    for (label, cfi) in [("without .eh_frame", false), ("with .eh_frame", true)] {
        group.bench_function(BenchmarkId::new("publish/v2/64B", label), |b| {
            b.iter_custom(|iters| {
                timed_publishes(&heap, 64, iters, |r| CodeInfo {
                    eh_frame: cfi.then(|| EhFrame {
                        frame: eh_frame(r.address(), 64, FRAME_POINTER_CFI),
                        header: Box::new([]),
                    }),
                    ..CodeInfo::new(1, "bench::method", JitKind::Optimized)
                })
            })
        });
    }
    group.finish();
}

fn find(c: &mut Criterion) {
    let mut group = c.benchmark_group("heap_find");
    let heap = heap(MapVersion::V2);
    let mut rng = Rng::new(3);
    let mut refs = Vec::new();
    for id in 0..20_000 {
        let size = method_size(&mut rng, 128 << 10);
        refs.push(
            heap.reserve(size)
                .unwrap()
                .publish(CodeInfo::new(id, "m", JitKind::Baseline))
                .unwrap(),
        );
    }
    let ips: Vec<usize> = (0..4096)
        .map(|_| {
            let r = refs[rng.below(refs.len() as u64) as usize];
            r.start() + rng.below(r.size()) as usize
        })
        .collect();
    let reader = heap.domain().register().unwrap();
    let guard = reader.pin().unwrap();
    let base = heap.base();
    let map = heap.map();
    group.bench_function("raw_v2_map", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % ips.len();
            map.find(black_box((ips[i] - base) as u64))
        })
    });
    group.bench_function("code_heap", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % ips.len();
            heap.find(&guard, black_box(ips[i]))
                .unwrap()
                .map(|b| b.start())
        })
    });
    group.bench_function("pin_unpin", |b| {
        b.iter(|| drop(black_box(reader.pin().unwrap())))
    });
    group.finish();
}

/// Publish + free of a 64-byte method with profiler output off and on (jitdump and
/// perf map, real files), side by side. `burst`: 256 pairs timed on the writer
/// thread, the queue drained outside the timed region (what a compiler thread
/// waits). `sustained`: back to back, so the queue's backpressure makes the file
/// writing the limit.
fn perf_output(c: &mut Criterion) {
    let mut group = c.benchmark_group("perf_output");
    let dir = std::env::temp_dir().join(format!("jitmap-bench-perf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let info = CodeInfo::new(1, "bench::method", JitKind::Optimized);
    for on in [false, true] {
        let label = if on { "on" } else { "off" };
        let heap = heap(MapVersion::V2);
        let _output = on.then(|| {
            PerfConfig {
                mode: PerfMode::Both,
                dir: dir.clone(),
            }
            .install(heap.listeners())
            .unwrap()
        });
        let cycle = || {
            let r = heap.reserve(64).unwrap();
            heap.free(r.publish(info.clone()).unwrap()).unwrap();
        };
        group.bench_function(BenchmarkId::new("burst", label), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    let n = left.min(256);
                    let t = Instant::now();
                    (0..n).for_each(|_| cycle());
                    total += t.elapsed();
                    heap.listeners().flush();
                    left -= n;
                }
                total
            })
        });
        group.bench_function(BenchmarkId::new("sustained", label), |b| b.iter(cycle));
        heap.listeners().flush();
    }
    group.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, write, find, perf_output);
criterion_main!(benches);
