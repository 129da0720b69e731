//! Lookup benchmarks, every structure side by side, with the `floor` (see
//! `jitmap_sim::fixture`), on `compare`'s shared fixture:
//! - `tail_of_method`: the last byte of one method, 64 B to 64 MiB, among
//!   100,000 others;
//! - `random_ip`: code addresses weighted by bytes; `random_method`: a method
//!   picked uniformly, then an offset;
//! - `concurrent`: manager lookups by 1 and 2 readers, with and without a writer
//!   churning publish and free in the same heap.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use jitmap::ExecutionManager;
use jitmap_sim::compare::{RANDOM_METHODS, TAIL_SIZES, shared_sizes, size_label, throughput};
use jitmap_sim::fixture::{Finder, Fixture, Structure, Visitor, realistic_sizes};
use jitmap_testkit::rng::Rng;

/// Times one structure's finder over `addresses` (cycled), monomorphized.
struct Bench<'a, 'c> {
    group: &'a mut criterion::BenchmarkGroup<'c, criterion::measurement::WallTime>,
    id: BenchmarkId,
    addresses: &'a [usize],
}

impl Visitor for Bench<'_, '_> {
    type Output = ();

    fn visit<F: Finder>(self, finder: F) {
        let (addresses, mask) = (self.addresses, self.addresses.len() - 1);
        self.group.bench_function(self.id, |b| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) & mask;
                finder.find(black_box(addresses[i]))
            })
        });
    }
}

/// The last byte of each `TAIL_SIZES` method, among the shared fixture's
/// 100,000 methods (so the searches are real), every structure with a floor.
fn tail_of_method(c: &mut Criterion) {
    let mut group = c.benchmark_group("tail_of_method");
    let manager = ExecutionManager::new(4);
    let (sizes, at) = shared_sizes();
    let fixture = Fixture::new(&manager, &sizes).unwrap();
    let reader = manager.register_reader().unwrap();
    let guard = manager.pin(&reader).unwrap();
    for (&size, &i) in TAIL_SIZES.iter().zip(&at) {
        let (start, _) = fixture.blocks()[i];
        let tail = [start + size as usize - 1];
        for s in Structure::ALL {
            let id = BenchmarkId::new(s.name(), size_label(size).replace(' ', ""));
            fixture.visit(
                s,
                &guard,
                Bench {
                    group: &mut group,
                    id,
                    addresses: &tail,
                },
            );
        }
    }
    group.finish();
}

/// `random_ip` (weighted by bytes) and `random_method` (uniform method, then
/// offset) on the shared fixture.
fn random(c: &mut Criterion) {
    let manager = ExecutionManager::new(4);
    let (sizes, _) = shared_sizes();
    let fixture = Fixture::new(&manager, &sizes).unwrap();
    let reader = manager.register_reader().unwrap();
    let guard = manager.pin(&reader).unwrap();
    let by_bytes = fixture.random_addresses(&mut Rng::new(23), 1 << 16);
    let by_method = fixture.random_method_addresses(&mut Rng::new(31), 1 << 16);
    for (name, addresses) in [("random_ip", &by_bytes), ("random_method", &by_method)] {
        let mut group = c.benchmark_group(name);
        for s in Structure::ALL {
            let id = BenchmarkId::from_parameter(s.name());
            fixture.visit(
                s,
                &guard,
                Bench {
                    group: &mut group,
                    id,
                    addresses,
                },
            );
        }
        group.finish();
    }
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

criterion_group!(benches, tail_of_method, random, concurrent);
criterion_main!(benches);
