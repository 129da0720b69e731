//! Lookups from another process's point of view (this process, read through
//! `process_vm_readv`): one remote lookup against one 8-byte remote read (the
//! floor every read pays) and against the in-process lookup of the same
//! addresses; and listing a heap of 2,000 methods.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use jitmap::heap::JitKind;
use jitmap::remote::{self, Memory, ProcessMemory, RemoteReader};
use jitmap::{CodeInfo, ExecutionManager, HeapConfig};
use jitmap_testkit::rng::Rng;
use jitmap_testkit::workload::method_size;

fn remote(c: &mut Criterion) {
    let mut group = c.benchmark_group("remote");
    let m = ExecutionManager::new(4);
    let heap = m
        .create_heap(HeapConfig {
            span: 64 << 20,
            ..HeapConfig::default()
        })
        .unwrap();
    let mut rng = Rng::new(5);
    let refs: Vec<_> = (0..2000)
        .map(|id| {
            let size = method_size(&mut rng, 64 << 10);
            heap.reserve(size)
                .unwrap()
                .publish(CodeInfo::new(id, format!("method_{id}"), JitKind::Baseline))
                .unwrap()
        })
        .collect();
    let ips: Vec<u64> = (0..1024)
        .map(|_| {
            let r = refs[rng.below(refs.len() as u64) as usize];
            (r.start() + rng.below(r.size()) as usize) as u64
        })
        .collect();
    let memory = ProcessMemory::new(std::process::id() as i32);
    let reader = RemoteReader::new(&memory, remote::descriptor_address()).unwrap();
    let mut i = 0;
    group.bench_function("read_8_bytes_floor", |b| {
        let mut buf = [0u8; 8];
        b.iter(|| {
            i = (i + 1) % ips.len();
            memory.read(black_box(ips[i]), &mut buf).unwrap();
            black_box(buf)
        })
    });
    group.bench_function("resolve", |b| {
        b.iter(|| {
            i = (i + 1) % ips.len();
            black_box(reader.resolve(black_box(ips[i])).unwrap())
        })
    });
    let local = m.register_reader().unwrap();
    group.bench_function("in_process_find", |b| {
        b.iter(|| {
            i = (i + 1) % ips.len();
            let guard = m.pin(&local).unwrap();
            black_box(
                guard
                    .find(black_box(ips[i] as usize))
                    .map(|b| b.method_id()),
            )
        })
    });
    let stats = reader.stats();
    println!(
        "remote reads per lookup: mean {:.2}, max {}",
        stats.mean_reads(),
        stats.max_reads
    );
    let sections = reader.sections().unwrap();
    let section = sections
        .iter()
        .find(|s| s.begin == heap.base() as u64)
        .copied()
        .unwrap();
    group.sample_size(10);
    group.bench_function("list_2000_methods", |b| {
        b.iter(|| black_box(reader.blocks(&section).unwrap().len()))
    });
    group.finish();
}

criterion_group!(benches, remote);
criterion_main!(benches);
