//! `JitmapModule` and cranelift-jit's `JITModule` driven side by side by
//! sequences of declare (every linkage), define, finalize, and, on
//! `JitmapModule` alone (cranelift-jit has neither), redefine and free.
//!
//! Four functions `f0`..`f3` of one i64 argument; a body returns `x + k`, or
//! calls a lower-numbered function and adds `k`. A model keeps each
//! module's live and pending bodies. While the two modules have seen the
//! same operations, each operation succeeds on both or fails on both, with
//! the same merged linkage. After every finalize, each function whose body
//! and callees are live is called through each module's address for it,
//! and returns what the model computes; nothing panics, and every failure
//! is a typed error.
#![no_main]

use std::cell::RefCell;

use arbitrary::Arbitrary;
use cranelift_codegen::Context;
use cranelift_codegen::ir::{AbiParam, InstBuilder, Signature, types::I64};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{FuncId, Linkage, Module, default_libcall_names};
use jitmap::{ExecutionManager, Executor};
use jitmap_cranelift::{JitmapBuilder, JitmapModule};
use libfuzzer_sys::fuzz_target;

const FUNCTIONS: usize = 4;
const LINKAGES: [Linkage; 5] = [
    Linkage::Import,
    Linkage::Local,
    Linkage::Preemptible,
    Linkage::Hidden,
    Linkage::Export,
];

#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
enum Body {
    /// `x + k`.
    Add(i8),
    /// `f<callee>(x) + k`, for a lower-numbered callee.
    Call(u8, i8),
}

#[derive(Arbitrary, Debug)]
enum Op {
    Declare(u8, u8),
    Define(u8, Body),
    Redefine(u8, Body),
    Free(u8),
    Finalize,
}

/// One module's functions as the model sees them.
#[derive(Clone, Default)]
struct Model {
    id: [Option<FuncId>; FUNCTIONS],
    /// The merged linkage of each declared function.
    linkage: [Option<Linkage>; FUNCTIONS],
    pending: [Option<Body>; FUNCTIONS],
    live: [Option<Body>; FUNCTIONS],
    /// A live body whose callee was preemptible and undefined when it was
    /// published: the call is bound to null, as a weak symbol's.
    weak: [bool; FUNCTIONS],
}

impl Model {
    /// The callee of `body` in function `f`, if it is one of the lower ones.
    fn callee(f: usize, body: Body) -> Option<usize> {
        match body {
            Body::Add(_) => None,
            Body::Call(j, _) => Some(usize::from(j) % FUNCTIONS).filter(|&j| j < f),
        }
    }

    /// Whether a body to be published calls a function with no definition:
    /// cranelift-jit panics on that at finalize (`can't resolve symbol`),
    /// where `JitmapModule` answers an error.
    fn unresolved(&self) -> bool {
        (0..FUNCTIONS).any(|f| {
            let body = self.pending[f].or(self.live[f]);
            body.and_then(|b| Self::callee(f, b))
                .is_some_and(|j| self.pending[j].is_none() && self.live[j].is_none())
        })
    }

    /// Publishes the pending bodies (a finalize that succeeded). A call to
    /// a preemptible callee with no body binds to null.
    fn publish(&mut self) {
        let defined: Vec<bool> = (0..FUNCTIONS)
            .map(|j| self.pending[j].is_some() || self.live[j].is_some())
            .collect();
        for f in 0..FUNCTIONS {
            if let Some(body) = self.pending[f].take() {
                self.weak[f] = Self::callee(f, body)
                    .is_some_and(|j| !defined[j] && self.linkage[j] == Some(Linkage::Preemptible));
                self.live[f] = Some(body);
            }
        }
    }

    /// What `f(x)` returns, if `f` and all it calls are live.
    fn eval(&self, f: usize, x: i64) -> Option<i64> {
        if self.weak[f] {
            return None;
        }
        match self.live[f]? {
            Body::Add(k) => Some(x.wrapping_add(i64::from(k))),
            body @ Body::Call(_, k) => {
                let j = Self::callee(f, body)?;
                Some(self.eval(j, x)?.wrapping_add(i64::from(k)))
            }
        }
    }
}

fn sig(module: &impl Module) -> Signature {
    let mut sig = module.make_signature();
    sig.params.push(AbiParam::new(I64));
    sig.returns.push(AbiParam::new(I64));
    sig
}

/// The body's code, or `None` if it calls a function not declared yet.
fn context<M: Module>(module: &mut M, model: &Model, f: usize, body: Body) -> Option<Context> {
    let callee = match Model::callee(f, body) {
        Some(j) => Some(model.id[j]?),
        None if matches!(body, Body::Call(..)) => return None,
        None => None,
    };
    let mut ctx = module.make_context();
    ctx.func.signature = sig(module);
    let mut fctx = FunctionBuilderContext::new();
    let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    let x = b.block_params(entry)[0];
    let (value, k) = match (body, callee) {
        (Body::Call(_, k), Some(callee)) => {
            let callee = module.declare_func_in_func(callee, b.func);
            let call = b.ins().call(callee, &[x]);
            (b.inst_results(call)[0], k)
        }
        (Body::Add(k), _) | (Body::Call(_, k), None) => (x, k),
    };
    let r = b.ins().iadd_imm_s(value, i64::from(k));
    b.ins().return_(&[r]);
    b.seal_all_blocks();
    b.finalize(module.target_config());
    Some(ctx)
}

/// Calls each function whose body and callees are live, through `address`.
fn check_calls(model: &Model, address: impl Fn(FuncId) -> *const u8, executor: &Executor) {
    for f in 0..FUNCTIONS {
        let (Some(id), Some(want)) = (model.id[f], model.eval(f, 5)) else {
            continue;
        };
        let entry = address(id);
        assert!(!entry.is_null(), "f{f} has no address");
        // SAFETY: every body takes and returns one i64, and it and what it
        // calls are live (the model says so), so the call returns.
        let function: extern "C" fn(i64) -> i64 = unsafe { std::mem::transmute(entry) };
        assert_eq!(function(5), want, "f{f}");
    }
    executor.quiescent();
}

struct World {
    manager: ExecutionManager,
    executor: Executor,
}

thread_local! {
    static WORLD: RefCell<Option<World>> = const { RefCell::new(None) };
}

fuzz_target!(|ops: Vec<Op>| {
    WORLD.with(|cell| {
        let mut cell = cell.borrow_mut();
        let world = cell.get_or_insert_with(|| {
            let manager = ExecutionManager::new(4);
            let executor = manager.register_executor().expect("an executor slot");
            World { manager, executor }
        });
        let builder =
            JitmapBuilder::new(&world.manager, default_libcall_names()).expect("the host ISA");
        let mut ours = JitmapModule::new(builder).expect("a heap");
        let mut theirs = Some(JITModule::new(
            JITBuilder::new(default_libcall_names()).expect("the host ISA"),
        ));
        let (mut model, mut their_model) = (Model::default(), Model::default());
        for op in ops.iter().take(32) {
            // The other module, while it has seen every operation so far.
            let mut same = theirs.as_mut();
            match *op {
                Op::Declare(f, linkage) => {
                    let (f, linkage) = (
                        usize::from(f) % FUNCTIONS,
                        LINKAGES[usize::from(linkage) % 5],
                    );
                    let name = format!("f{f}");
                    let got = ours.declare_function(&name, linkage, &sig(&ours));
                    if let Ok(id) = got {
                        model.id[f] = Some(id);
                        model.linkage[f] = Some(ours.declarations().get_function_decl(id).linkage);
                    }
                    if let Some(jit) = same.as_deref_mut() {
                        let other = jit.declare_function(&name, linkage, &sig(jit));
                        assert_eq!(
                            got.is_ok(),
                            other.is_ok(),
                            "declare {name} {linkage:?}: {got:?} {other:?}"
                        );
                        if let (Ok(a), Ok(b)) = (got, other) {
                            their_model.id[f] = Some(b);
                            their_model.linkage[f] =
                                Some(jit.declarations().get_function_decl(b).linkage);
                            assert_eq!(
                                ours.declarations().get_function_decl(a).linkage,
                                jit.declarations().get_function_decl(b).linkage
                            );
                        }
                    }
                }
                Op::Define(f, body) => {
                    let f = usize::from(f) % FUNCTIONS;
                    let (Some(id), Some(mut ctx)) =
                        (model.id[f], context(&mut ours, &model, f, body))
                    else {
                        continue;
                    };
                    let got = ours.define_function(id, &mut ctx);
                    if got.is_ok() {
                        model.pending[f] = Some(body);
                    }
                    if let Some(jit) = same.as_deref_mut() {
                        let (Some(id), Some(mut ctx)) =
                            (their_model.id[f], context(jit, &their_model, f, body))
                        else {
                            panic!("the models agree on declarations");
                        };
                        let other = jit.define_function(id, &mut ctx);
                        assert_eq!(got.is_ok(), other.is_ok(), "define f{f}: {got:?} {other:?}");
                        if other.is_ok() {
                            their_model.pending[f] = Some(body);
                        }
                    }
                }
                Op::Redefine(f, body) => {
                    let f = usize::from(f) % FUNCTIONS;
                    let (Some(id), Some(mut ctx)) =
                        (model.id[f], context(&mut ours, &model, f, body))
                    else {
                        continue;
                    };
                    if ours.redefine_function(id, &mut ctx).is_ok() {
                        model.pending[f] = Some(body);
                        theirs = None;
                    }
                }
                Op::Free(f) => {
                    let f = usize::from(f) % FUNCTIONS;
                    let Some(id) = model.id[f] else { continue };
                    if ours.free_function(id).is_ok() {
                        model.pending[f] = None;
                        model.live[f] = None;
                        theirs = None;
                    }
                }
                Op::Finalize => {
                    if their_model.unresolved() {
                        // cranelift-jit would panic; ours answers an error.
                        theirs = None;
                        same = None;
                    }
                    let got = ours.finalize_definitions();
                    if got.is_ok() {
                        model.publish();
                        check_calls(
                            &model,
                            |id| ours.get_finalized_function(id),
                            &world.executor,
                        );
                    }
                    let mut failed = false;
                    if let Some(jit) = same {
                        let other = jit.finalize_definitions();
                        assert_eq!(got.is_ok(), other.is_ok(), "finalize: {got:?} {other:?}");
                        if other.is_ok() {
                            their_model.publish();
                            check_calls(
                                &their_model,
                                |id| jit.get_finalized_function(id),
                                &world.executor,
                            );
                        }
                        failed = other.is_err();
                    }
                    if failed {
                        // cranelift-jit's state after a failed finalize is
                        // its own; compare no further.
                        theirs = None;
                    }
                }
            }
        }
        drop(ours);
        world.executor.quiescent();
        if let Some(jit) = theirs {
            // SAFETY: no function of the module runs any more.
            unsafe { jit.free_memory() };
        }
    });
});
