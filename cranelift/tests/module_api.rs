//! The `Module` contract as cranelift-jit's own tests exercise it, on
//! `JitmapModule`, and every misuse a typed error that leaves the module
//! usable.

mod programs;

use cranelift_codegen::ir::{AbiParam, InstBuilder, Signature, UserFuncName, types};
use cranelift_codegen::isa::CallConv;
use cranelift_codegen::{Context, ir};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Switch, Variable};
use cranelift_module::{DataDescription, Linkage, Module, ModuleError, default_libcall_names};
use jitmap::ExecutionManager;
use jitmap_cranelift::{JitError, JitmapBuilder, JitmapModule};

fn module(manager: &ExecutionManager) -> JitmapModule {
    JitmapModule::new(JitmapBuilder::new(manager, default_libcall_names()).unwrap()).unwrap()
}

fn empty_sig() -> Signature {
    Signature {
        params: vec![],
        returns: vec![],
        call_conv: CallConv::SystemV,
    }
}

/// `fn abc() {}` defined in `module`.
#[expect(clippy::result_large_err, reason = "the Module trait's own error type")]
fn define_simple_function(
    module: &mut JitmapModule,
) -> Result<cranelift_module::FuncId, ModuleError> {
    let sig = empty_sig();
    let func_id = module.declare_function("abc", Linkage::Local, &sig)?;
    let mut ctx = Context::new();
    ctx.func = ir::Function::with_name_signature(UserFuncName::user(0, func_id.as_u32()), sig);
    let mut fctx = FunctionBuilderContext::new();
    {
        let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
        let block = b.create_block();
        b.switch_to_block(block);
        b.ins().return_(&[]);
        b.seal_all_blocks();
        b.finalize(module.target_config());
    }
    module.define_function(func_id, &mut ctx)?;
    Ok(func_id)
}

#[test]
fn an_incompatible_signature_in_a_declaration_is_refused() {
    let manager = ExecutionManager::new(2);
    let mut module = module(&manager);
    let mut sig = empty_sig();
    sig.params.push(AbiParam::new(types::I64));
    module
        .declare_function("abc", Linkage::Local, &sig)
        .unwrap();
    sig.params[0] = AbiParam::new(types::I32);
    assert!(matches!(
        module.declare_function("abc", Linkage::Local, &sig),
        Err(ModuleError::IncompatibleSignature(name, _, _)) if name == "abc"
    ));
}

#[test]
fn a_second_definition_is_refused_and_the_first_runs() {
    let manager = ExecutionManager::new(2);
    let mut module = module(&manager);
    let id = define_simple_function(&mut module).unwrap();
    assert!(matches!(
        define_simple_function(&mut module),
        Err(ModuleError::DuplicateDefinition(name)) if name == "abc"
    ));
    module.finalize_definitions().unwrap();
    // SAFETY: `abc` takes nothing and returns nothing.
    let f: extern "C" fn() = unsafe { std::mem::transmute(module.get_finalized_function(id)) };
    f();
}

#[test]
fn a_switch_compiles_and_runs() {
    let manager = ExecutionManager::new(2);
    let mut module = module(&manager);
    let mut sig = empty_sig();
    sig.params.push(AbiParam::new(types::I32));
    sig.returns.push(AbiParam::new(types::I32));
    let id = module
        .declare_function("switch", Linkage::Export, &sig)
        .unwrap();
    let mut ctx = module.make_context();
    ctx.func.signature = sig;
    let mut fctx = FunctionBuilderContext::new();
    {
        let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
        let start = b.create_block();
        let hit = b.create_block();
        let miss = b.create_block();
        let x = Variable::from_u32(0);
        b.declare_var(types::I32);
        let arg = b.append_block_param(start, types::I32);
        b.switch_to_block(start);
        b.def_var(x, arg);
        let mut switch = Switch::new();
        for index in [9, 13, 10, 92, 39, 34] {
            switch.set_entry(index, hit);
        }
        let discr = b.use_var(x);
        switch.emit(&mut b, discr, miss);
        b.switch_to_block(hit);
        let one = b.ins().iconst(types::I32, 1);
        b.ins().return_(&[one]);
        b.switch_to_block(miss);
        let zero = b.ins().iconst(types::I32, 0);
        b.ins().return_(&[zero]);
        b.seal_all_blocks();
        b.finalize(module.target_config());
    }
    cranelift_codegen::verify_function(&ctx.func, module.isa().flags()).unwrap();
    module.define_function(id, &mut ctx).unwrap();
    module.finalize_definitions().unwrap();
    // SAFETY: `switch` takes and returns an i32.
    let f: extern "C" fn(i32) -> i32 =
        unsafe { std::mem::transmute(module.get_finalized_function(id)) };
    let hits: Vec<i32> = (0..100).filter(|&i| f(i) == 1).collect();
    assert_eq!(hits, [9, 10, 13, 34, 39, 92]);
}

#[test]
fn libcalls_and_imports_resolve_through_dlsym() {
    let manager = ExecutionManager::new(2);
    let mut module = module(&manager);
    let ptr = module.target_config().pointer_type();
    let mut sig = module.make_signature();
    sig.returns.push(AbiParam::new(ptr));
    let id = module
        .declare_function("zeroed", Linkage::Local, &sig)
        .unwrap();
    let mut malloc_sig = module.make_signature();
    malloc_sig.params.push(AbiParam::new(ptr));
    malloc_sig.returns.push(AbiParam::new(ptr));
    let malloc = module
        .declare_function("malloc", Linkage::Import, &malloc_sig)
        .unwrap();
    let mut ctx = module.make_context();
    ctx.func.signature = sig;
    let mut fctx = FunctionBuilderContext::new();
    {
        let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
        let block = b.create_block();
        b.switch_to_block(block);
        let local = module.declare_func_in_func(malloc, b.func);
        let size = b.ins().iconst(ptr, 64);
        let call = b.ins().call(local, &[size]);
        let buffer = b.inst_results(call)[0];
        let zero = b.ins().iconst(types::I8, 0);
        // A libcall (memset), resolved by its libcall name.
        b.call_memset(module.target_config(), buffer, zero, size);
        b.ins().return_(&[buffer]);
        b.seal_all_blocks();
        b.finalize(module.target_config());
    }
    module.define_function(id, &mut ctx).unwrap();
    module.finalize_definitions().unwrap();
    // SAFETY: `zeroed` takes nothing and returns a malloc'd pointer.
    let f: extern "C" fn() -> *mut u8 =
        unsafe { std::mem::transmute(module.get_finalized_function(id)) };
    let buffer = f();
    // SAFETY: 64 bytes from malloc, zeroed by the code; freed once.
    unsafe {
        assert!(
            std::slice::from_raw_parts(buffer, 64)
                .iter()
                .all(|&b| b == 0)
        );
        libc::free(buffer.cast());
    }
}

#[test]
fn an_empty_data_object_is_defined() {
    let manager = ExecutionManager::new(2);
    let mut module = module(&manager);
    let id = module
        .declare_data("empty", Linkage::Export, false, false)
        .unwrap();
    let mut data = DataDescription::new();
    data.define(Box::new([]));
    module.define_data(id, &data).unwrap();
    module.finalize_definitions().unwrap();
    let (ptr, size) = module.get_finalized_data(id);
    assert_eq!(size, 0);
    assert!(!ptr.is_null());
}

#[test]
fn misuse_is_a_typed_error_and_the_module_stays_usable() {
    let manager = ExecutionManager::new(2);
    let mut module = module(&manager);
    let sig1 = programs::sig(&module, 1);
    let id = module
        .declare_function("fib", Linkage::Export, &sig1)
        .unwrap();

    // An undeclared function.
    let undeclared = cranelift_module::FuncId::from_u32(99);
    let mut ctx = programs::fib_body(&mut module, id);
    assert!(matches!(
        module.define_function(undeclared, &mut ctx),
        Err(ModuleError::Undeclared(_))
    ));
    assert!(matches!(
        module.free_function(undeclared),
        Err(JitError::Module(_))
    ));
    // Freeing or redefining what has no definition.
    assert!(matches!(module.free_function(id), Err(JitError::NotDefined(n)) if n == "fib"));
    assert!(matches!(
        module.redefine_function(id, &mut ctx),
        Err(JitError::NotDefined(_))
    ));

    module.define_function(id, &mut ctx).unwrap();
    module.finalize_definitions().unwrap();
    // SAFETY: `fib` takes and returns one i64.
    let fib = unsafe { programs::f1(module.get_finalized_function(id)) };
    assert_eq!(fib(20), 6765);

    // A redefinition with another signature.
    let mut other = programs::body(&mut module, 2, |_, b, args| {
        b.ins().return_(&[args[0]]);
    });
    assert!(matches!(
        module.redefine_function(id, &mut other),
        Err(JitError::Module(e)) if matches!(*e, ModuleError::IncompatibleSignature(..))
    ));
    assert_eq!(fib(20), 6765);

    // A relocation to an unknown symbol: nothing is published, the
    // definition waits; once the symbol exists, it goes through.
    let missing = module
        .declare_function("jitmap_no_such_symbol", Linkage::Import, &sig1)
        .unwrap();
    let caller = module
        .declare_function("caller", Linkage::Export, &sig1)
        .unwrap();
    let mut ctx = programs::body(&mut module, 1, |module, b, args| {
        let f = module.declare_func_in_func(missing, b.func);
        let c = b.ins().call(f, &[args[0]]);
        let r = b.inst_results(c)[0];
        b.ins().return_(&[r]);
    });
    module.define_function(caller, &mut ctx).unwrap();
    let live_before = module.heap().stats().live_blocks;
    assert!(matches!(
        module.finalize_jit(),
        Err(JitError::UnknownSymbol(name)) if name == "jitmap_no_such_symbol"
    ));
    assert_eq!(module.heap().stats().live_blocks, live_before);
    assert!(module.function_code(caller).is_none());
    extern "C" fn doubled(x: i64) -> i64 {
        2 * x
    }
    module.symbol("jitmap_no_such_symbol", doubled as *const u8);
    module.finalize_definitions().unwrap();
    // SAFETY: `caller` takes and returns one i64.
    let caller = unsafe { programs::f1(module.get_finalized_function(caller)) };
    assert_eq!(caller(21), 42);

    // Freeing twice (this thread, which ran the code, is its executor).
    let _executor = manager.register_executor().unwrap();
    module.free_function(id).unwrap();
    assert!(matches!(
        module.free_function(id),
        Err(JitError::NotDefined(_))
    ));
    // And the function may be defined again.
    let mut ctx = programs::fib_body(&mut module, id);
    module.define_function(id, &mut ctx).unwrap();
    module.finalize_definitions().unwrap();
    assert_eq!(fib(10), 55);
}

#[test]
fn source_locations_become_debug_rows_and_unwind_tables_are_cranelifts() {
    let manager = ExecutionManager::new(2);
    let mut module = module(&manager);
    let id = module
        .declare_function("lines", Linkage::Export, &programs::sig(&module, 1))
        .unwrap();
    module.set_source_file(id, "prog.toy").unwrap();
    let mut ctx = programs::body(&mut module, 1, |_, b, args| {
        b.set_srcloc(ir::SourceLoc::new(7));
        let x = b.ins().imul_imm_s(args[0], 3);
        b.set_srcloc(ir::SourceLoc::new(8));
        let y = b.ins().iadd_imm_s(x, 1);
        b.ins().return_(&[y]);
    });
    module.define_function(id, &mut ctx).unwrap();
    module.finalize_definitions().unwrap();
    // SAFETY: `lines` takes and returns one i64.
    let f = unsafe { programs::f1(module.get_finalized_function(id)) };
    assert_eq!(f(5), 16);
    let code = module.function_code(id).unwrap();
    let reader = manager.register_reader().unwrap();
    let guard = manager.pin(&reader).unwrap();
    let block = guard.find(code.start()).unwrap();
    let lines: Vec<(u32, &str)> = block
        .debug_info()
        .iter()
        .map(|r| (r.line, &*r.file))
        .collect();
    assert_eq!(lines, [(7, "prog.toy"), (8, "prog.toy")]);
    // The unwind table jitdump carries is the `.eh_frame` Cranelift described:
    // a CIE and an FDE covering exactly this version's code.
    let live = module.heap().live_blocks();
    let info = live
        .iter()
        .find(|b| b.code == code)
        .unwrap()
        .info
        .clone()
        .unwrap();
    let frame = info.eh_frame.as_ref().expect("an .eh_frame");
    let fde_start = u32::from_le_bytes(frame.frame[..4].try_into().unwrap()) as usize + 4;
    // The FDE's pc_begin (absolute, 8 bytes after its length and CIE pointer).
    let pc_begin = u64::from_le_bytes(
        frame.frame[fde_start + 8..fde_start + 16]
            .try_into()
            .unwrap(),
    );
    let pc_range = u64::from_le_bytes(
        frame.frame[fde_start + 16..fde_start + 24]
            .try_into()
            .unwrap(),
    );
    assert_eq!((pc_begin, pc_range), (code.start() as u64, code.size()));
}

/// A caller finalized while its callee is declared but not defined: refused
/// (`Undefined`, the caller stays pending) unless the callee is preemptible,
/// which binds like a weak symbol, to null, as on cranelift-jit. Once the
/// callee is defined, the next finalize publishes both and the caller reaches
/// it. (Checked after the `cranelift_module` fuzz target called a caller
/// bound to a weak callee's null.)
#[test]
fn a_caller_waits_for_its_undefined_callee_unless_the_callee_is_weak() {
    use programs::{body, f1, sig};
    let manager = ExecutionManager::new(2);
    let executor = manager.register_executor().unwrap();
    for linkage in [
        Linkage::Local,
        Linkage::Preemptible,
        Linkage::Hidden,
        Linkage::Export,
    ] {
        let mut m = module(&manager);
        let f3 = m
            .declare_function("f3", Linkage::Local, &sig(&m, 1))
            .unwrap();
        let f0 = m.declare_function("f0", linkage, &sig(&m, 1)).unwrap();
        let mut ctx = body(&mut m, 1, |m, b, args| {
            let callee = m.declare_func_in_func(f0, b.func);
            let c = b.ins().call(callee, &[args[0]]);
            let r = b.inst_results(c)[0];
            let r = b.ins().iadd_imm_s(r, -62);
            b.ins().return_(&[r]);
        });
        m.define_function(f3, &mut ctx).unwrap();
        let early = m.finalize_jit().map_err(|e| e.to_string());
        let weak = linkage == Linkage::Preemptible;
        assert_eq!(
            early,
            if weak {
                Ok(())
            } else {
                Err("function f0 is declared but not defined".to_owned())
            },
            "{linkage:?}"
        );
        let mut ctx = body(&mut m, 1, |_, b, args| {
            let r = b.ins().iadd_imm_s(args[0], 31);
            b.ins().return_(&[r]);
        });
        m.define_function(f0, &mut ctx).unwrap();
        m.finalize_definitions().unwrap();
        // SAFETY: both take and return one i64 and are live; a weak caller
        // (bound to null) is not called.
        let (call_f3, call_f0) = unsafe {
            (
                f1(m.get_finalized_function(f3)),
                f1(m.get_finalized_function(f0)),
            )
        };
        assert_eq!(call_f0(5), 36);
        if !weak {
            assert_eq!(call_f3(5), -26, "{linkage:?}");
        }
        executor.quiescent();
    }
}

/// The module names its trampolines' kind; a second module on the same
/// manager finds it so named. A manager that gave the kind another name
/// refuses the module, and the refusal changes nothing: no heap is made.
#[test]
fn the_trampoline_kind_is_named_and_a_conflicting_name_refuses_the_module() {
    use jitmap::{ManagerError, StubKindName};
    let manager = ExecutionManager::new(4);
    let first = module(&manager);
    let second = module(&manager);
    assert_eq!(
        manager.stub_kind_name(jitmap_cranelift::TRAMPOLINE),
        Some(StubKindName::new("jitmap-cranelift", "trampoline").unwrap())
    );
    assert_eq!(manager.heaps().len(), 2);
    drop((first, second));

    let other = ExecutionManager::new(4);
    let host = StubKindName::new("host", "precode").unwrap();
    other
        .name_stub_kind(jitmap_cranelift::TRAMPOLINE, host.clone())
        .unwrap();
    let refused = JitmapModule::new(JitmapBuilder::new(&other, default_libcall_names()).unwrap());
    assert!(
        matches!(
            refused,
            Err(JitError::Manager(ManagerError::StubKindNamed { kind }))
                if kind == jitmap_cranelift::TRAMPOLINE
        ),
        "{:?}",
        refused.err()
    );
    assert_eq!(other.heaps().len(), 0);
    assert_eq!(
        other.stub_kind_name(jitmap_cranelift::TRAMPOLINE),
        Some(host)
    );
}
