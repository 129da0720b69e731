//! jitmap-cranelift against cranelift-jit, on the same IR:
//! - `define_finalize`: compile + link + publish of one new function, for
//!   small (about 10 instructions), medium (about 200) and large (about
//!   10 KiB of code) bodies;
//! - `call`: a call of a tiny function through the module's trampoline and
//!   call cell, against a direct call of the same body and of cranelift-jit's;
//! - and, printed before them, the committed code after 100,000
//!   redefinitions of one function (cranelift-jit, which cannot free, declares
//!   a new function each time; its growth is shown for comparison).
//!
//! Run: `cargo bench -p jitmap-cranelift --bench cranelift`.

use std::hint::black_box;

use cranelift_codegen::Context;
use cranelift_codegen::ir::{AbiParam, InstBuilder, types::I64};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{Linkage, Module, default_libcall_names};
use criterion::{BenchmarkId, Criterion};
use jitmap::{ExecutionManager, FnPtr};

/// The benched functions' signature.
type Entry = extern "C" fn(i64) -> i64;
use jitmap_cranelift::{JitmapBuilder, JitmapModule};

/// `f(x)`: `adds` dependent additions of x, then the result.
fn body(module: &impl Module, adds: usize) -> Context {
    let mut ctx = module.make_context();
    ctx.func.signature.params.push(AbiParam::new(I64));
    ctx.func.signature.returns.push(AbiParam::new(I64));
    let mut fctx = FunctionBuilderContext::new();
    let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
    let block = b.create_block();
    b.append_block_params_for_function_params(block);
    b.switch_to_block(block);
    let x = b.block_params(block)[0];
    let mut v = x;
    for i in 0..adds {
        let c = b.ins().iconst(I64, i as i64 + 1);
        v = b.ins().iadd(v, c);
        v = b.ins().bxor(v, x);
    }
    b.ins().return_(&[v]);
    b.seal_all_blocks();
    b.finalize(module.target_config());
    ctx
}

fn sig(module: &impl Module) -> cranelift_codegen::ir::Signature {
    let mut s = module.make_signature();
    s.params.push(AbiParam::new(I64));
    s.returns.push(AbiParam::new(I64));
    s
}

fn jit() -> JITModule {
    JITModule::new(JITBuilder::new(default_libcall_names()).unwrap())
}

fn jitmap(manager: &ExecutionManager) -> JitmapModule {
    JitmapModule::new(JitmapBuilder::new(manager, default_libcall_names()).unwrap()).unwrap()
}

/// Prints the committed code after 100,000 redefinitions.
fn memory_report() {
    const ROUNDS: usize = 100_000;
    let manager = ExecutionManager::new(2);
    // Frees need an executor; this one runs none of the code, so it is offline.
    let executor = manager.register_executor().unwrap();
    executor.offline();
    let mut module = jitmap(&manager);
    let id = module
        .declare_function("f", Linkage::Export, &sig(&module))
        .unwrap();
    let mut ctx = body(&module, 4);
    module.define_function(id, &mut ctx).unwrap();
    module.finalize_definitions().unwrap();
    let one_version = module.function_code(id).unwrap().size();
    let first = module.heap().stats();
    for _ in 0..ROUNDS {
        let mut ctx = body(&module, 4);
        module.redefine_function(id, &mut ctx).unwrap();
        module.finalize_definitions().unwrap();
    }
    module.heap().try_reclaim();
    let last = module.heap().stats();
    let mut cl = jit();
    let before = rss_kib();
    for i in 0..ROUNDS / 10 {
        let id = cl
            .declare_function(&format!("f{i}"), Linkage::Export, &sig(&cl))
            .unwrap();
        let mut ctx = body(&cl, 4);
        cl.define_function(id, &mut ctx).unwrap();
        cl.finalize_definitions().unwrap();
    }
    let after = rss_kib();
    // The code size of each define_finalize body.
    let sizes: Vec<String> = [("small", 4), ("medium", 100), ("large", 1200)]
        .iter()
        .map(|&(label, adds)| {
            let id = module
                .declare_function(&format!("size_{label}"), Linkage::Export, &sig(&module))
                .unwrap();
            let mut ctx = body(&module, adds);
            module.define_function(id, &mut ctx).unwrap();
            module.finalize_definitions().unwrap();
            format!("{label} {} bytes", module.function_code(id).unwrap().size())
        })
        .collect();
    println!("define_finalize bodies: {}", sizes.join(", "));
    println!(
        "redefine: jitmap-cranelift after {ROUNDS} redefinitions of one function ({one_version} bytes \
         of code): committed {} bytes (after the first {}), used {} bytes in {} live blocks; \
         cranelift-jit after {} new definitions: resident memory grew {} KiB",
        last.committed,
        first.committed,
        last.used,
        last.live_blocks,
        ROUNDS / 10,
        after.saturating_sub(before)
    );
}

/// The process's resident set, in KiB.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn define_finalize(c: &mut Criterion) {
    let mut group = c.benchmark_group("define_finalize");
    for (label, adds) in [("small", 4), ("medium", 100), ("large", 1200)] {
        let manager = ExecutionManager::new(2);
        // As in `memory_report`: an executor that runs none of the code.
        let executor = manager.register_executor().unwrap();
        executor.offline();
        let mut module = jitmap(&manager);
        let mut n = 0u64;
        group.bench_function(BenchmarkId::new("jitmap", label), |b| {
            b.iter(|| {
                n += 1;
                let id = module
                    .declare_function(&format!("f{n}"), Linkage::Export, &sig(&module))
                    .unwrap();
                let mut ctx = body(&module, adds);
                module.define_function(id, &mut ctx).unwrap();
                module.finalize_definitions().unwrap();
                // Free it again, so the heap does not fill over the run.
                module.free_function(id).unwrap();
            })
        });
        let mut cl = jit();
        let mut n = 0u64;
        group.bench_function(BenchmarkId::new("cranelift_jit", label), |b| {
            b.iter(|| {
                n += 1;
                let id = cl
                    .declare_function(&format!("f{n}"), Linkage::Export, &sig(&cl))
                    .unwrap();
                let mut ctx = body(&cl, adds);
                cl.define_function(id, &mut ctx).unwrap();
                cl.finalize_definitions().unwrap();
            })
        });
    }
    group.finish();
}

fn call(c: &mut Criterion) {
    let mut group = c.benchmark_group("call");
    let manager = ExecutionManager::new(2);
    // Frees need an executor; this one runs none of the code, so it is offline.
    let executor = manager.register_executor().unwrap();
    executor.offline();
    let mut module = jitmap(&manager);
    let id = module
        .declare_function("f", Linkage::Export, &sig(&module))
        .unwrap();
    let mut ctx = body(&module, 1);
    module.define_function(id, &mut ctx).unwrap();
    module.finalize_definitions().unwrap();
    // SAFETY: `f` takes and returns one i64; the body is its current
    // version, which nothing frees during the bench.
    let (through_cell, direct): (Entry, Entry) = unsafe {
        (
            Entry::from_address(module.get_finalized_function(id).addr()),
            module.function_code(id).unwrap().entry(),
        )
    };
    let mut cl = jit();
    let cid = cl
        .declare_function("f", Linkage::Export, &sig(&cl))
        .unwrap();
    let mut ctx = body(&cl, 1);
    cl.define_function(cid, &mut ctx).unwrap();
    cl.finalize_definitions().unwrap();
    // SAFETY: as above.
    let cranelift_jit = unsafe { Entry::from_address(cl.get_finalized_function(cid).addr()) };
    for (name, f) in [
        ("jitmap_through_cell", through_cell),
        ("jitmap_direct", direct),
        ("cranelift_jit_direct", cranelift_jit),
    ] {
        group.bench_function(name, |b| {
            let mut x = 1i64;
            b.iter(|| {
                x = f(black_box(x));
            })
        });
    }
    group.finish();
}

fn main() {
    memory_report();
    let mut c = Criterion::default().configure_from_args();
    define_finalize(&mut c);
    call(&mut c);
    c.final_summary();
}
