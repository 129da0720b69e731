//! What `finalize_definitions`, `redefine_function` and `free_function`
//! promise beyond cranelift-jit: a refused finalize publishes nothing and a
//! retry publishes each function once; code starts where Cranelift's
//! alignment says; and no version is freed while no thread is registered to
//! hold its bytes back.

mod programs;

use cranelift_codegen::ir::{InstBuilder, types};
use cranelift_module::{DataDescription, FuncId, Linkage, Module, default_libcall_names};
use jitmap::ExecutionManager;
use jitmap::heap::HeapConfig;
use jitmap_cranelift::{JitError, JitmapBuilder, JitmapModule};
use programs::{body, f1, sig};

fn module_with(manager: &ExecutionManager, config: Option<HeapConfig>) -> JitmapModule {
    let mut builder = JitmapBuilder::new(manager, default_libcall_names()).unwrap();
    if let Some(config) = config {
        builder.heap_config(config);
    }
    JitmapModule::new(builder).unwrap()
}

/// Declares and defines `name(x) = x + add` (not finalized).
fn adder(module: &mut JitmapModule, name: &str, add: i64) -> FuncId {
    let id = module
        .declare_function(name, Linkage::Export, &sig(module, 1))
        .unwrap();
    let mut ctx = body(module, 1, |_, b, args| {
        let r = b.ins().iadd_imm_s(args[0], add);
        b.ins().return_(&[r]);
    });
    module.define_function(id, &mut ctx).unwrap();
    id
}

/// The module's published methods (its trampolines are stubs, not counted).
fn methods(module: &JitmapModule) -> usize {
    module
        .heap()
        .live_blocks()
        .iter()
        .filter(|b| b.info.is_some())
        .count()
}

#[test]
fn a_refused_data_relocation_publishes_nothing_and_a_retry_publishes_once() {
    let manager = ExecutionManager::new(2);
    let mut module = module_with(&manager, None);
    let a = adder(&mut module, "a", 5);
    let b = adder(&mut module, "b", 6);
    // An 8-byte object with a function address to write at 16: out of it.
    let bad = module
        .declare_data("bad", Linkage::Local, false, false)
        .unwrap();
    let mut description = DataDescription::new();
    description.define_zeroinit(8);
    let fref = module.declare_func_in_data(a, &mut description);
    description.write_function_addr(16, fref);
    module.define_data(bad, &description).unwrap();
    // A good object whose relocation must still be written on the retry.
    let good = module
        .declare_data("good", Linkage::Local, false, false)
        .unwrap();
    let mut description = DataDescription::new();
    description.define_zeroinit(8);
    let fref = module.declare_func_in_data(b, &mut description);
    description.write_function_addr(0, fref);
    module.define_data(good, &description).unwrap();

    let refused = module.finalize_jit();
    assert!(
        matches!(&refused, Err(JitError::Relocation { target, .. }) if target.contains("index: 0")),
        "{refused:?}"
    );
    assert_eq!(methods(&module), 0, "a refused finalize published code");
    assert!(module.function_code(a).is_none() && module.function_code(b).is_none());

    // The host gives up on the bad object and retries.
    module.cancel_data(bad).unwrap();
    module.finalize_definitions().unwrap();
    assert_eq!(methods(&module), 2, "each function published exactly once");
    // SAFETY: `a` and `b` take and return one i64.
    let (fa, fb) = unsafe {
        (
            f1(module.get_finalized_function(a)),
            f1(module.get_finalized_function(b)),
        )
    };
    assert_eq!((fa(1), fb(1)), (6, 7));
    let (at, len) = module.get_finalized_data(good);
    assert_eq!(len, 8);
    // SAFETY: 8 bytes of the object, written by the finalize.
    let written = unsafe { at.cast::<usize>().read_unaligned() };
    assert_eq!(written, module.get_finalized_function(b).addr());
    // The cancelled object is gone; cancelling it again is a typed error.
    assert_eq!(module.get_finalized_data(bad), (std::ptr::null(), 0));
    assert!(matches!(module.cancel_data(bad), Err(JitError::NotDefined(n)) if n == "bad"));
}

/// `v(x)`: x plus lane 0 of (splat(x) + [1, 2]) as i64x2, whose constant
/// Cranelift places in the function's constant pool, 16-byte aligned from
/// the function's start; SSE reads it with an aligned memory operand.
fn with_vector_constant(module: &mut JitmapModule, name: &str) -> FuncId {
    let id = module
        .declare_function(name, Linkage::Export, &sig(module, 1))
        .unwrap();
    let mut ctx = body(module, 1, |_, b, args| {
        let lanes: Vec<u8> = [1i64, 2].iter().flat_map(|v| v.to_le_bytes()).collect();
        let constant = b.func.dfg.constants.insert(lanes.into());
        let c = b.ins().vconst(types::I64X2, constant);
        let v = b.ins().splat(types::I64X2, args[0]);
        let sum = b.ins().iadd(v, c);
        let lane = b.ins().extractlane(sum, 0);
        let r = b.ins().iadd(lane, args[0]);
        b.ins().return_(&[r]);
    });
    module.define_function(id, &mut ctx).unwrap();
    id
}

#[test]
fn code_starts_at_the_alignment_cranelift_and_the_host_ask_for() {
    let manager = ExecutionManager::new(2);
    let config = HeapConfig {
        align: 8,
        ..HeapConfig::default()
    };
    let mut module = module_with(&manager, Some(config));
    let functions: Vec<FuncId> = (0..6)
        .map(|i| with_vector_constant(&mut module, &format!("v{i}")))
        .collect();
    // Raw bytes asked to start on 64: `ret`.
    let raw = module
        .declare_function("raw", Linkage::Export, &module.make_signature())
        .unwrap();
    module.define_function_bytes(raw, 64, &[0xC3], &[]).unwrap();
    module.finalize_definitions().unwrap();
    for &f in &functions {
        let start = module.function_code(f).unwrap().start();
        assert_eq!(start % 16, 0, "{f} starts at {start:#x}");
        // SAFETY: one i64 in, one out.
        assert_eq!(unsafe { f1(module.get_finalized_function(f)) }(10), 21);
    }
    let start = module.function_code(raw).unwrap().start();
    assert_eq!(start % 64, 0, "raw bytes start at {start:#x}");
    // An alignment the heap cannot give is a typed error, and nothing is
    // published.
    let huge = module
        .declare_function("huge", Linkage::Export, &module.make_signature())
        .unwrap();
    module
        .define_function_bytes(huge, 1 << 20, &[0xC3], &[])
        .unwrap();
    assert!(matches!(
        module.finalize_jit(),
        Err(JitError::Heap(jitmap::HeapError::BadAlignment {
            align: 0x10_0000
        }))
    ));
    module.cancel_definition(huge).unwrap();
    module.finalize_definitions().unwrap();
}

#[test]
fn no_version_is_freed_while_no_executor_is_registered() {
    let manager = ExecutionManager::new(4);
    let mut module = module_with(&manager, None);
    let f = adder(&mut module, "f", 1);
    module.finalize_definitions().unwrap();
    // SAFETY: one i64 in, one out.
    let call = unsafe { f1(module.get_finalized_function(f)) };

    // A thread may be running `f` and nothing would hold its bytes back.
    let mut ctx = body(&mut module, 1, |_, b, args| {
        let r = b.ins().iadd_imm_s(args[0], 2);
        b.ins().return_(&[r]);
    });
    let refused = module.redefine_function(f, &mut ctx);
    assert!(
        matches!(refused, Err(JitError::NoExecutor(ref n)) if n == "f"),
        "{refused:?}"
    );
    assert!(
        refused
            .unwrap_err()
            .to_string()
            .contains("register_executor"),
        "the error names the fix"
    );
    assert!(matches!(module.free_function(f), Err(JitError::NoExecutor(n)) if n == "f"));
    assert_eq!(call(1), 2, "the live version stays");
    assert_eq!(methods(&module), 1);

    // With an executor (the thread that calls `f`), both go through.
    let executor = manager.register_executor().unwrap();
    let mut ctx = body(&mut module, 1, |_, b, args| {
        let r = b.ins().iadd_imm_s(args[0], 2);
        b.ins().return_(&[r]);
    });
    module.redefine_function(f, &mut ctx).unwrap();
    // The executor goes away between the redefinition and the finalize that
    // frees the old version: no registered thread can run `f` any more, and
    // the host did register the threads that ran it, so the finalize and a
    // free go through.
    drop(executor);
    module.finalize_definitions().unwrap();
    assert_eq!(call(1), 3);
    module.free_function(f).unwrap();
    assert!(module.function_code(f).is_none());
    module.heap().try_reclaim();
    assert_eq!(methods(&module), 0);
}
