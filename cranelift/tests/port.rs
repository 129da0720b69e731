//! A front end written against cranelift-jit's API, ported to
//! `JitmapModule` by its constructor alone: the same source (one macro,
//! expanded once per module type) compiles against both, and its programs
//! give the same results on both.
//!
//! It uses what a real runtime's JIT did that an earlier `JitmapModule`
//! refused:
//! - `?` on `finalize_definitions` into the front end's own error type,
//!   which converts from `ModuleError` only (`finalize_definitions`
//!   answered a `JitError`: "`?` couldn't convert the error");
//! - `free_memory` on a module kept in `ManuallyDrop` (it did not exist);
//! - declaring a function before its return type is inferred, then adding
//!   the return to the body's signature (`define_function` refused the body
//!   as `IncompatibleSignature`);
//! - declaring a function as an import, then defining it (recursion).

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{AbiParam, InstBuilder, Type, Value, types};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{FuncId, Linkage, Module, ModuleError, default_libcall_names};
use jitmap_cranelift::{JitmapBuilder, JitmapModule};

/// A tiny expression language, as a front end would parse it.
#[derive(Clone, Copy)]
enum Program {
    /// `() -> 42`
    Answer,
    /// `(a, b) -> a * b + a`
    MulAdd,
    /// `(x: f64, y: f64) -> x * y` (the return type inferred as f64)
    FloatMul,
    /// `fib(n)`, recursive: its own name is declared as an import first.
    Fib,
}

/// The front end's own error: it knows Cranelift's, nothing of jitmap's.
#[derive(Debug)]
enum FrontError {
    Module(Box<ModuleError>),
}

impl From<ModuleError> for FrontError {
    fn from(e: ModuleError) -> Self {
        Self::Module(Box::new(e))
    }
}

/// The front end for one module type. `$module` and `$new` are the lines a
/// port changes; the rest is written once.
macro_rules! front_end {
    ($name:ident, $module:ty, $new:expr) => {
        mod $name {
            use super::*;
            use std::mem::ManuallyDrop;

            pub struct Compiler {
                module: ManuallyDrop<$module>,
                fctx: FunctionBuilderContext,
            }

            impl Compiler {
                pub fn new() -> Self {
                    let module: $module = $new;
                    Self {
                        module: ManuallyDrop::new(module),
                        fctx: FunctionBuilderContext::new(),
                    }
                }

                /// Compiles `program` under `name`; its entry address.
                pub fn compile(
                    &mut self,
                    name: &str,
                    program: Program,
                ) -> Result<*const u8, FrontError> {
                    let params: &[Type] = match program {
                        Program::Answer => &[],
                        Program::MulAdd => &[types::I64, types::I64],
                        Program::FloatMul => &[types::F64, types::F64],
                        Program::Fib => &[types::I64],
                    };
                    let mut sig = self.module.make_signature();
                    sig.params.extend(params.iter().map(|&t| AbiParam::new(t)));
                    let id: FuncId = if let Program::Fib = program {
                        // Recursion: the body calls the function by name
                        // before it is defined; declared as an import with
                        // its full signature, then upgraded.
                        let mut full = sig.clone();
                        full.returns.push(AbiParam::new(types::I64));
                        self.module.declare_function(name, Linkage::Import, &full)?;
                        self.module.declare_function(name, Linkage::Export, &full)?
                    } else {
                        // Declared before the return type is known.
                        self.module.declare_function(name, Linkage::Export, &sig)?
                    };
                    let mut ctx = self.module.make_context();
                    ctx.func.signature = sig;
                    let config = self.module.target_config();
                    let returns = {
                        let mut b = FunctionBuilder::new(&mut ctx.func, &mut self.fctx);
                        let entry = b.create_block();
                        b.append_block_params_for_function_params(entry);
                        b.switch_to_block(entry);
                        let args = b.block_params(entry).to_vec();
                        let (value, ty) = emit(&mut *self.module, &mut b, id, program, &args);
                        b.ins().return_(&[value]);
                        b.seal_all_blocks();
                        b.finalize(config);
                        ty
                    };
                    // The return type, inferred while the body was built.
                    ctx.func.signature.returns.push(AbiParam::new(returns));
                    self.module.define_function(id, &mut ctx)?;
                    self.module.clear_context(&mut ctx);
                    self.module.finalize_definitions()?;
                    Ok(self.module.get_finalized_function(id))
                }
            }

            impl Drop for Compiler {
                fn drop(&mut self) {
                    // SAFETY: the module is taken once, here; nothing it
                    // compiled is called after the compiler drops.
                    unsafe { ManuallyDrop::take(&mut self.module).free_memory() };
                }
            }
        }
    };
}

/// Emits `program`'s body; its result and the result's type.
fn emit<M: Module>(
    module: &mut M,
    b: &mut FunctionBuilder<'_>,
    this: FuncId,
    program: Program,
    args: &[Value],
) -> (Value, Type) {
    match program {
        Program::Answer => (b.ins().iconst(types::I64, 42), types::I64),
        Program::MulAdd => {
            let m = b.ins().imul(args[0], args[1]);
            (b.ins().iadd(m, args[0]), types::I64)
        }
        Program::FloatMul => (b.ins().fmul(args[0], args[1]), types::F64),
        Program::Fib => {
            let (recurse, done) = (b.create_block(), b.create_block());
            b.append_block_param(done, types::I64);
            let small = b.ins().icmp_imm_s(IntCC::SignedLessThan, args[0], 2);
            b.ins().brif(small, done, &[args[0].into()], recurse, &[]);
            b.switch_to_block(recurse);
            let callee = module.declare_func_in_func(this, b.func);
            let n1 = b.ins().iadd_imm_s(args[0], -1);
            let n2 = b.ins().iadd_imm_s(args[0], -2);
            let c1 = b.ins().call(callee, &[n1]);
            let r1 = b.inst_results(c1)[0];
            let c2 = b.ins().call(callee, &[n2]);
            let r2 = b.inst_results(c2)[0];
            let sum = b.ins().iadd(r1, r2);
            b.ins().jump(done, &[sum.into()]);
            b.switch_to_block(done);
            (b.block_params(done)[0], types::I64)
        }
    }
}

front_end!(
    on_cranelift_jit,
    JITModule,
    JITModule::new(JITBuilder::new(default_libcall_names()).unwrap())
);

// The port: the manager lives as long as the process; the two lines above
// became these.
front_end!(
    on_jitmap,
    JitmapModule,
    JitmapModule::new(
        JitmapBuilder::new(
            Box::leak(Box::new(jitmap::ExecutionManager::new(4))),
            default_libcall_names()
        )
        .unwrap()
    )
    .unwrap()
);

/// What each program answers on one module, called through its entry.
fn run(compile: &mut dyn FnMut(&str, Program) -> Result<*const u8, FrontError>) -> Vec<String> {
    let answer = compile("answer", Program::Answer).unwrap();
    let mul_add = compile("mul_add", Program::MulAdd).unwrap();
    let float_mul = compile("float_mul", Program::FloatMul).unwrap();
    let fib = compile("fib", Program::Fib).unwrap();
    // SAFETY: each entry was compiled with the signature it is called with.
    unsafe {
        let answer: extern "C" fn() -> i64 = std::mem::transmute(answer);
        let mul_add: extern "C" fn(i64, i64) -> i64 = std::mem::transmute(mul_add);
        let float_mul: extern "C" fn(f64, f64) -> f64 = std::mem::transmute(float_mul);
        let fib: extern "C" fn(i64) -> i64 = std::mem::transmute(fib);
        vec![
            answer().to_string(),
            mul_add(6, 7).to_string(),
            float_mul(1.5, -4.0).to_string(),
            fib(24).to_string(),
        ]
    }
}

#[test]
fn a_cranelift_jit_front_end_ports_by_its_constructor_alone() {
    let mut jit = on_cranelift_jit::Compiler::new();
    let expected = run(&mut |name, program| jit.compile(name, program));
    assert_eq!(expected, ["42", "48", "-6", "46368"]);
    drop(jit);

    let mut ported = on_jitmap::Compiler::new();
    let got = run(&mut |name, program| ported.compile(name, program));
    assert_eq!(got, expected);
    // A second definition is refused alike, through the front end's `?`.
    assert!(matches!(
        ported.compile("answer", Program::Answer),
        Err(FrontError::Module(e)) if matches!(*e, ModuleError::DuplicateDefinition(ref n) if n == "answer")
    ));
    drop(ported);
}
