//! Lookup benchmarks. `tail_of_method`: the cost of finding the last byte of one
//! method as the method grows; v2 should stay flat while v1 grows linearly.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use jitmap::{MapVersion, MapWriter};

const SIZES: [(u64, &str); 5] = [
    (256, "256B"),
    (4 << 10, "4KiB"),
    (64 << 10, "64KiB"),
    (1 << 20, "1MiB"),
    (16 << 20, "16MiB"),
];

fn tail_of_method(c: &mut Criterion) {
    let mut group = c.benchmark_group("tail_of_method");
    for version in [MapVersion::V1, MapVersion::V2] {
        for (size, label) in SIZES {
            // The method starts 0x40 bytes in, after a header slot and padding.
            let start = 0x40;
            let mut writer = MapWriter::new(version, start + size + 0x100).unwrap();
            writer.set(start, size).unwrap();
            let map = writer.map();
            let tail = start + size - 1;
            assert_eq!(map.find(tail), Some(start));
            group.bench_with_input(
                BenchmarkId::new(version.to_string(), label),
                &tail,
                |b, &tail| b.iter(|| map.find(black_box(tail))),
            );
        }
    }
    group.finish();
}

criterion_group!(benches, tail_of_method);
criterion_main!(benches);
