//! What a tiered JIT on the module needs: one function compiled at two
//! optimization levels and published with the host's method id, a refused
//! finalize given up on without touching the live version, and a module
//! dropped while a thread still runs in it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use cranelift_codegen::Context;
use cranelift_codegen::ir::{AbiParam, InstBuilder, MemFlagsData, Signature, types};
use cranelift_codegen::settings::OptLevel;
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_module::{FuncId, Linkage, Module, default_libcall_names};
use jitmap::{ExecutionManager, JitKind};
use jitmap_cranelift::{JitError, JitmapBuilder, JitmapModule};

fn module(manager: &ExecutionManager) -> JitmapModule {
    JitmapModule::new(JitmapBuilder::new(manager, default_libcall_names()).unwrap()).unwrap()
}

/// `fn(i64) -> i64`.
fn unary(module: &JitmapModule) -> Signature {
    let mut sig = module.make_signature();
    sig.params.push(AbiParam::new(types::I64));
    sig.returns.push(AbiParam::new(types::I64));
    sig
}

/// A body for `sig` built by `body(builder, module, argument)`.
fn function(
    module: &mut JitmapModule,
    sig: &Signature,
    body: impl FnOnce(&mut FunctionBuilder, &mut JitmapModule, cranelift_codegen::ir::Value),
) -> Context {
    let mut ctx = module.make_context();
    ctx.func.signature = sig.clone();
    let mut fctx = FunctionBuilderContext::new();
    let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
    let block = b.create_block();
    b.append_block_params_for_function_params(block);
    b.switch_to_block(block);
    let x = b.block_params(block)[0];
    body(&mut b, module, x);
    b.seal_all_blocks();
    b.finalize(module.target_config());
    ctx
}

/// `x * 3 + 1` in a loop of `x` iterations (summed), so the two levels
/// emit different code for one function.
fn sum_body(b: &mut FunctionBuilder, _: &mut JitmapModule, x: cranelift_codegen::ir::Value) {
    let head = b.create_block();
    let exit = b.create_block();
    b.append_block_param(head, types::I64);
    b.append_block_param(head, types::I64);
    b.append_block_param(exit, types::I64);
    let zero = b.ins().iconst(types::I64, 0);
    b.ins().jump(head, &[x.into(), zero.into()]);
    b.switch_to_block(head);
    let (i, acc) = (b.block_params(head)[0], b.block_params(head)[1]);
    let scaled = b.ins().imul_imm_s(i, 3);
    let term = b.ins().iadd_imm_s(scaled, 1);
    let acc = b.ins().iadd(acc, term);
    let next = b.ins().iadd_imm_s(i, -1);
    b.ins()
        .brif(next, head, &[next.into(), acc.into()], exit, &[acc.into()]);
    b.switch_to_block(exit);
    let result = b.block_params(exit)[0];
    b.ins().return_(&[result]);
}

/// Returns what `callee(arg)` returns (a module call, not a tail call).
fn return_call_of(
    b: &mut FunctionBuilder,
    module: &mut JitmapModule,
    callee: FuncId,
    arg: cranelift_codegen::ir::Value,
) {
    let callee = module.declare_func_in_func(callee, b.func);
    let call = b.ins().call(callee, &[arg]);
    let r = b.inst_results(call)[0];
    b.ins().return_(&[r]);
}

fn call(module: &JitmapModule, f: FuncId, x: i64) -> i64 {
    // SAFETY: every function of these tests is `extern "C" fn(i64) -> i64`.
    let f: extern "C" fn(i64) -> i64 =
        unsafe { std::mem::transmute(module.get_finalized_function(f)) };
    f(x)
}

/// The code of `f`'s live version, with its call to `inner` (if any) at the
/// same place either way.
fn bytes(module: &JitmapModule, f: FuncId) -> Vec<u8> {
    let code = module.function_code(f).unwrap();
    // SAFETY: a live version's bytes stay published while `module` is borrowed.
    unsafe { std::slice::from_raw_parts(code.start() as *const u8, code.size() as usize) }.to_vec()
}

/// The kind and method id a lookup reports for `f`'s live version.
fn looked_up(module: &JitmapModule, manager: &ExecutionManager, f: FuncId) -> (JitKind, u64) {
    let code = module.function_code(f).unwrap();
    let reader = manager.register_reader().unwrap();
    let guard = manager.pin(&reader).unwrap();
    let block = guard.find(code.start() + 1).unwrap();
    assert_eq!(block.start(), code.start());
    (block.jit_kind(), block.method_id())
}

#[test]
fn one_function_at_two_levels_is_published_as_each_with_the_hosts_id() {
    let manager = ExecutionManager::new(4);
    // This thread runs the module's code: its executor.
    let _executor = manager.register_executor().unwrap();
    let mut module = module(&manager);
    let sig = unary(&module);
    let f = module
        .declare_function("sum", Linkage::Export, &sig)
        .unwrap();
    // The builder's default level is `none`: a baseline version, with the
    // FuncId as its method id until the host names its own.
    let mut ctx = function(&mut module, &sig, sum_body);
    module.define_function(f, &mut ctx).unwrap();
    module.finalize_definitions().unwrap();
    assert_eq!(call(&module, f, 10), 3 * 55 + 10);
    assert_eq!(
        looked_up(&module, &manager, f),
        (JitKind::Baseline, u64::from(f.as_u32()))
    );
    let baseline = bytes(&module, f);

    module.set_opt_level(OptLevel::Speed).unwrap();
    module.set_method_id(f, 0xfeed).unwrap();
    let mut ctx = function(&mut module, &sig, sum_body);
    module.redefine_function(f, &mut ctx).unwrap();
    module.finalize_definitions().unwrap();
    assert_eq!(call(&module, f, 10), 3 * 55 + 10);
    assert_eq!(
        looked_up(&module, &manager, f),
        (JitKind::Optimized, 0xfeed)
    );
    assert_ne!(bytes(&module, f), baseline);

    // Back to `none`: the first level's ISA is reused, not rebuilt.
    module.set_opt_level(OptLevel::None).unwrap();
    let mut ctx = function(&mut module, &sig, sum_body);
    module.redefine_function(f, &mut ctx).unwrap();
    module.finalize_definitions().unwrap();
    assert_eq!(looked_up(&module, &manager, f), (JitKind::Baseline, 0xfeed));
    assert_eq!(bytes(&module, f), baseline);
    assert_eq!(module.isa().flags().opt_level(), OptLevel::None);
}

#[test]
fn a_refused_finalize_is_given_up_and_the_live_version_stays() {
    let manager = ExecutionManager::new(4);
    // This thread runs the module's code: its executor.
    let _executor = manager.register_executor().unwrap();
    let mut module = module(&manager);
    let sig = unary(&module);
    let f = module
        .declare_function("sum", Linkage::Export, &sig)
        .unwrap();
    let missing = module
        .declare_function("jitmap_test_no_such_symbol", Linkage::Import, &sig)
        .unwrap();
    assert!(matches!(
        module.cancel_definition(f),
        Err(JitError::NotDefined(name)) if name == "sum"
    ));
    let mut ctx = function(&mut module, &sig, sum_body);
    module.define_function(f, &mut ctx).unwrap();
    module.finalize_definitions().unwrap();
    let live = module.function_code(f).unwrap();
    let before = module.heap().stats();

    // A new version that calls a symbol nothing defines: finalize reserves
    // its bytes, fails to relocate, and aborts the reservation.
    let mut ctx = function(&mut module, &sig, |b, module, x| {
        return_call_of(b, module, missing, x);
    });
    module.redefine_function(f, &mut ctx).unwrap();
    assert!(matches!(
        module.finalize_jit(),
        Err(JitError::UnknownSymbol(name)) if name == "jitmap_test_no_such_symbol"
    ));
    module.cancel_definition(f).unwrap();
    module.finalize_definitions().unwrap();
    assert_eq!(module.function_code(f), Some(live));
    assert_eq!(call(&module, f, 4), 3 * 10 + 4);
    let after = module.heap().stats();
    assert_eq!(
        (after.live_blocks, after.used, after.retired_blocks),
        (before.live_blocks, before.used, before.retired_blocks)
    );
    assert!(matches!(
        module.cancel_definition(f),
        Err(JitError::NotDefined(_))
    ));
}

/// What `spin_then_call` waits on, and what the test thread reports.
static RELEASE: AtomicU64 = AtomicU64::new(0);
static ENTERED: AtomicBool = AtomicBool::new(false);

#[test]
fn a_module_dropped_while_a_thread_runs_in_it_lets_the_thread_finish() {
    let manager = ExecutionManager::new(4);
    let mut module = module(&manager);
    let sig = unary(&module);
    let inner = module
        .declare_function("inner", Linkage::Local, &sig)
        .unwrap();
    let outer = module
        .declare_function("spin_then_call", Linkage::Export, &sig)
        .unwrap();
    let mut ctx = function(&mut module, &sig, |b, _, x| {
        let v = b.ins().iadd_imm_s(x, 42);
        b.ins().return_(&[v]);
    });
    module.define_function(inner, &mut ctx).unwrap();
    // Spins until the word at `x` is non-zero, then calls `inner(x_value)`
    // through its trampoline and call cell.
    let mut ctx = function(&mut module, &sig, |b, module, x| {
        let spin = b.create_block();
        let done = b.create_block();
        b.ins().jump(spin, &[]);
        b.switch_to_block(spin);
        let word = b.ins().atomic_load(types::I64, MemFlagsData::trusted(), x);
        b.ins().brif(word, done, &[], spin, &[]);
        b.switch_to_block(done);
        return_call_of(b, module, inner, word);
    });
    module.define_function(outer, &mut ctx).unwrap();
    module.finalize_definitions().unwrap();
    let entry = module.get_finalized_function(outer).addr();

    let executor_manager = manager.clone();
    let thread = std::thread::spawn(move || {
        let executor = executor_manager.register_executor().unwrap();
        // SAFETY: `spin_then_call` is `extern "C" fn(i64) -> i64`; it runs
        // while this thread is an online executor.
        let f: extern "C" fn(i64) -> i64 = unsafe { std::mem::transmute(entry) };
        // SeqCst: ordered before the test thread's drop by its wait below.
        ENTERED.store(true, Ordering::SeqCst);
        let result = f(std::ptr::from_ref(&RELEASE).addr() as i64);
        executor.quiescent();
        result
    });
    // SeqCst: pairs with the store above.
    while !ENTERED.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
    drop(module);
    // Freed memory of the call cells' size is handed out again and filled:
    // a cell freed with the module would now hold garbage.
    let filler: Vec<Box<u64>> = (0..4096).map(|_| Box::new(0xdead_beef)).collect();
    // SeqCst: the JIT code's atomic load sees it.
    RELEASE.store(1, Ordering::SeqCst);
    assert_eq!(thread.join().unwrap(), 43);
    drop(filler);
    // The thread passed its quiescent point: the heap and cells go.
    manager.try_reclaim_sections();
    assert!(manager.heaps().is_empty());
}
