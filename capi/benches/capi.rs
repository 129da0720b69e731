//! The C ABI against the Rust API on one fixture, side by side in one run:
//! `find` of random addresses in 1,000 methods, and a method's publish
//! (reserve, write, publish, free).
//!
//! `cargo bench -p jitmap-capi --bench capi -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::ptr::null_mut;

use criterion::{Criterion, criterion_group, criterion_main};
use jitmap::{CodeInfo, ExecutionManager, HeapConfig, JitKind};
use jitmap_capi::*;

const METHODS: usize = 1000;
const SIZE: u64 = 96;

/// Random addresses inside the methods (xorshift, fixed seed).
fn addresses(starts: &[usize]) -> Vec<usize> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            starts[(x % starts.len() as u64) as usize] + (x >> 32) as usize % SIZE as usize
        })
        .collect()
}

fn ok(status: jitmap_status) {
    assert_eq!(status, jitmap_status::JITMAP_STATUS_OK);
}

fn info(id: u64) -> CodeInfo {
    let mut info = CodeInfo::new(id, format!("method_{id}"), JitKind::Optimized);
    info.debug.push(jitmap::info::DebugEntry {
        offset: 0,
        line: 1,
        column: 1,
        file: "m.c".into(),
    });
    info
}

fn benches(c: &mut Criterion) {
    // The Rust fixture.
    let manager = ExecutionManager::new(8);
    let heap = manager
        .create_heap(HeapConfig {
            span: 16 << 20,
            ..HeapConfig::default()
        })
        .unwrap();
    let mut starts = Vec::new();
    for id in 0..METHODS as u64 {
        let mut r = heap.reserve(SIZE).unwrap();
        r.code_mut().fill(0xC3);
        starts.push(r.publish(info(id)).unwrap().start());
    }
    let rust_ips = addresses(&starts);
    let reader = manager.register_reader().unwrap();

    // The same through the C ABI.
    // SAFETY (every call below): outputs point to locals, inputs to live
    // values.
    let mut m = null_mut();
    ok(unsafe { jitmap_manager_create(8, &mut m) });
    let mut config = std::mem::MaybeUninit::uninit();
    unsafe { jitmap_heap_config_default(config.as_mut_ptr()) };
    let mut config = unsafe { config.assume_init() };
    config.span = 16 << 20;
    let mut c_heap = null_mut();
    ok(unsafe { jitmap_heap_create(m, &config, &mut c_heap) });
    let name = c"method".as_ptr();
    let row = jitmap_debug_row {
        offset: 0,
        line: 1,
        column: 1,
        file: c"m.c".as_ptr(),
    };
    let c_info = |id: u64| jitmap_code_info {
        method_id: id,
        name,
        kind: jitmap_jit_kind::JITMAP_JIT_OPTIMIZED as u32,
        debug: &row,
        debug_count: 1,
        ..Default::default()
    };
    let c_publish = |id: u64| -> jitmap_code {
        let mut r = null_mut();
        let mut write = null_mut();
        let mut code = std::mem::MaybeUninit::uninit();
        unsafe {
            ok(jitmap_heap_reserve(c_heap, SIZE, 0, &mut r, null_mut()));
            ok(jitmap_reservation_code(
                r,
                &mut write,
                null_mut(),
                null_mut(),
            ));
            write.write_bytes(0xC3, SIZE as usize);
            ok(jitmap_reservation_publish(
                r,
                &c_info(id),
                code.as_mut_ptr(),
            ));
            code.assume_init()
        }
    };
    let c_starts: Vec<usize> = (0..METHODS as u64).map(|id| c_publish(id).start).collect();
    let c_ips = addresses(&c_starts);
    let mut c_reader = null_mut();
    // SAFETY: the output is a local.
    ok(unsafe { jitmap_reader_register(m, &mut c_reader) });

    let mut group = c.benchmark_group("find");
    group.bench_function("rust: id, start, offset, kind, name", |b| {
        let guard = manager.pin(&reader).unwrap();
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) & 4095;
            let block = guard.find(black_box(rust_ips[i])).unwrap();
            black_box((
                (block.method_id(), block.start(), block.offset()),
                (block.jit_kind(), block.name()),
            ))
        })
    });
    group.bench_function("rust: every field of jitmap_method_info", |b| {
        let guard = manager.pin(&reader).unwrap();
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) & 4095;
            let block = guard.find(black_box(rust_ips[i])).unwrap();
            black_box((
                (block.method_id(), block.start(), block.offset()),
                (block.jit_kind(), block.funclet_start(), block.name()),
                (block.region(), block.unwind_info(), block.unwind_base()),
                (block.debug_at(), block.gc_info()),
            ))
        })
    });
    /// Times `find` of each address in turn under one pinned guard.
    fn c_finds<T>(
        b: &mut criterion::Bencher<'_>,
        reader: *mut jitmap_reader,
        ips: &[usize],
        find: unsafe extern "C" fn(*const jitmap_guard, usize, *mut T) -> jitmap_status,
    ) {
        let mut guard = std::mem::MaybeUninit::uninit();
        // SAFETY: the guard is this function's local.
        ok(unsafe { jitmap_pin(reader, guard.as_mut_ptr()) });
        let mut out = std::mem::MaybeUninit::<T>::uninit();
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) & 4095;
            // SAFETY: a pinned guard and a local answer.
            let status = unsafe { find(guard.as_ptr(), black_box(ips[i]), out.as_mut_ptr()) };
            black_box((status, &out));
        });
        // SAFETY: the guard pinned above, unpinned once.
        ok(unsafe { jitmap_unpin(guard.as_mut_ptr()) });
    }
    group.bench_function("c: jitmap_guard_find", |b| {
        c_finds(b, c_reader, &c_ips, jitmap_guard_find)
    });
    group.bench_function("c: jitmap_guard_find_info", |b| {
        c_finds(b, c_reader, &c_ips, jitmap_guard_find_info)
    });
    group.finish();

    let mut group = c.benchmark_group("publish");
    group.bench_function("rust: reserve, write, publish, free", |b| {
        b.iter(|| {
            let mut r = heap.reserve(SIZE).unwrap();
            r.code_mut().fill(0xC3);
            let code = r.publish(info(7)).unwrap();
            heap.free(black_box(code)).unwrap();
        })
    });
    group.bench_function("c: reserve, write, publish, free", |b| {
        b.iter(|| {
            let code = c_publish(7);
            ok(jitmap_heap_free(c_heap, black_box(code)));
        })
    });
    group.bench_function("c: jitmap_heap_publish (bytes copied), free", |b| {
        let bytes = [0xC3u8; SIZE as usize];
        b.iter(|| {
            let mut code = std::mem::MaybeUninit::uninit();
            // SAFETY: the bytes, the info and the output are locals.
            ok(unsafe {
                jitmap_heap_publish(
                    c_heap,
                    bytes.as_ptr(),
                    SIZE,
                    0,
                    &c_info(7),
                    code.as_mut_ptr(),
                )
            });
            ok(jitmap_heap_free(
                c_heap,
                black_box(unsafe { code.assume_init() }),
            ));
        })
    });
    group.finish();

    ok(jitmap_reader_destroy(c_reader));
}

criterion_group!(capi, benches);
criterion_main!(capi);
