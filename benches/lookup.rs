//! Lookup benchmarks, every structure side by side (see `jitmap_sim::fixture`):
//! - `tail_of_method`: the last byte of one method, 64 B to 64 MiB;
//! - `random_ip`: uniformly random code addresses in 100,000 methods;
//! - `concurrent`: manager lookups by 1 and 2 readers, with and without a writer
//!   churning publish and free in the same heap.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use jitmap::ExecutionManager;
use jitmap_sim::compare::{RANDOM_METHODS, TAIL_SIZES, size_label, throughput};
use jitmap_sim::fixture::{Fixture, Structure, realistic_sizes};
use jitmap_sim::rng::Rng;

fn tail_of_method(c: &mut Criterion) {
    let mut group = c.benchmark_group("tail_of_method");
    for size in TAIL_SIZES {
        let manager = ExecutionManager::new(4);
        let fixture = Fixture::new(&manager, &[size]).unwrap();
        let reader = manager.register().unwrap();
        let guard = reader.pin().unwrap();
        let (start, _) = fixture.blocks()[0];
        let tail = start + size as usize - 1;
        for s in Structure::ALL {
            assert_eq!(fixture.lookup(s, &guard, tail), Some(start));
            group.bench_with_input(
                BenchmarkId::new(s.name(), size_label(size).replace(' ', "")),
                &tail,
                |b, &tail| b.iter(|| fixture.lookup(s, &guard, black_box(tail))),
            );
        }
    }
    group.finish();
}

fn random_ip(c: &mut Criterion) {
    let mut group = c.benchmark_group("random_ip");
    let manager = ExecutionManager::new(4);
    let fixture = Fixture::new(&manager, &realistic_sizes(RANDOM_METHODS, 17)).unwrap();
    let addresses = fixture.random_addresses(&mut Rng::new(23), 1 << 16);
    let reader = manager.register().unwrap();
    let guard = reader.pin().unwrap();
    for s in Structure::ALL {
        group.bench_function(s.name(), |b| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) & 0xFFFF;
                fixture.lookup(s, &guard, addresses[i])
            })
        });
    }
    group.finish();
}

fn concurrent(c: &mut Criterion) {
    let mut group = c.benchmark_group("concurrent");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(10));
    let manager = ExecutionManager::new(8);
    let fixture = Fixture::new(&manager, &realistic_sizes(RANDOM_METHODS, 17)).unwrap();
    let addresses = fixture.random_addresses(&mut Rng::new(29), 1 << 16);
    for readers in [1, 2] {
        for writer in [false, true] {
            let name = format!("{readers}r{}", if writer { "_churn" } else { "" });
            group.throughput(Throughput::Elements(1));
            // Time per lookup across all readers: the inverse of total throughput.
            group.bench_function(name, |b| {
                b.iter_custom(|iters| {
                    let window = Duration::from_millis(200);
                    let per_sec = throughput(&fixture, &addresses, readers, writer, window);
                    Duration::from_secs_f64(iters as f64 / per_sec)
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, tail_of_method, random_ip, concurrent);
criterion_main!(benches);
