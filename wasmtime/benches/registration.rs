//! What registering a module costs beside what wasmtime spends compiling it:
//! a module of 100 functions, compiled, then registered and unregistered.
//! `cargo bench -p jitmap-wasmtime --bench registration`

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use jitmap::ExecutionManager;
use wasmtime::{Engine, Module};

/// A module of `n` small functions, each calling the next.
fn module_text(n: usize) -> String {
    let mut wat = String::from("(module $bench\n");
    for i in 0..n {
        let body = if i + 1 < n {
            format!("(i32.add (call $f{} (local.get 0)) (i32.const {i}))", i + 1)
        } else {
            "(local.get 0)".to_owned()
        };
        wat += &format!("  (func $f{i} (export \"f{i}\") (param i32) (result i32) {body})\n");
    }
    wat + ")"
}

fn bench(c: &mut Criterion) {
    let engine = Engine::default();
    let wasm = wat::parse_str(module_text(100)).unwrap();
    let manager = ExecutionManager::new(4);
    let mut group = c.benchmark_group("wasmtime module of 100 functions");
    group.bench_function("wasmtime compiles it", |b| {
        b.iter(|| black_box(Module::new(&engine, black_box(&wasm)).unwrap()))
    });
    let module = Module::new(&engine, &wasm).unwrap();
    group.bench_function("jitmap registers and unregisters it", |b| {
        b.iter(|| {
            drop(black_box(
                jitmap_wasmtime::register(&manager, &module).unwrap(),
            ))
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
