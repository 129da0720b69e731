//! `ExecutionManager::find` for JIT code against the raw v2 map lookup, and image
//! lookup in a table of 100,000 functions.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use jitmap::heap::JitKind;
use jitmap::image::{ImageFunction, ImageInfo, ImageMethod};
use jitmap::{CodeInfo, ExecutionManager, HeapConfig};
use jitmap_testkit::rng::Rng;
use jitmap_testkit::workload::method_size;

fn manager(c: &mut Criterion) {
    let mut group = c.benchmark_group("manager");
    let m = ExecutionManager::new(4);
    let heap = m
        .create_heap(HeapConfig {
            span: 256 << 20,
            ..HeapConfig::default()
        })
        .unwrap();
    let mut rng = Rng::new(11);
    let refs: Vec<_> = (0..20_000)
        .map(|id| {
            let size = method_size(&mut rng, 128 << 10);
            heap.reserve(size)
                .unwrap()
                .publish(CodeInfo::new(id, "m", JitKind::Baseline))
                .unwrap()
        })
        .collect();
    let ips: Vec<usize> = (0..4096)
        .map(|_| {
            let r = refs[rng.below(refs.len() as u64) as usize];
            r.start() + rng.below(r.size()) as usize
        })
        .collect();
    let reader = m.register_reader().unwrap();
    let guard = m.pin(&reader).unwrap();
    let (map, base) = (heap.map(), heap.base());
    group.bench_function("raw_v2_map", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % ips.len();
            map.find(black_box((ips[i] - base) as u64))
        })
    });
    group.bench_function("jit_find", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % ips.len();
            guard.find(black_box(ips[i])).map(|b| b.start())
        })
    });
    group.bench_function("jit_find_method_id", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % ips.len();
            guard.find(black_box(ips[i])).map(|b| b.method_id())
        })
    });

    let base = 0x6000_0000_0000;
    let functions: Vec<ImageFunction> = (0..100_000u32)
        .map(|i| ImageFunction {
            begin: i * 64,
            end: i * 64 + 48,
            unwind: Box::new([]),
        })
        .collect();
    let methods = (0..100_000u32)
        .step_by(2)
        .map(|i| ImageMethod {
            entry: i * 64,
            method_id: u64::from(i),
            gc: None,
            debug: vec![],
            name: String::new(),
        })
        .collect();
    m.load_image(ImageInfo {
        base,
        size: 100_000 * 64,
        functions,
        methods,
        hot_cold: vec![],
        thunks: None,
    })
    .unwrap();
    let image_ips: Vec<usize> = (0..4096)
        .map(|_| base + rng.below(100_000) as usize * 64 + rng.below(48) as usize)
        .collect();
    group.bench_function("image_find_100k", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % image_ips.len();
            guard.find(black_box(image_ips[i])).map(|b| b.method_id())
        })
    });
    group.finish();
}

criterion_group!(benches, manager);
criterion_main!(benches);
