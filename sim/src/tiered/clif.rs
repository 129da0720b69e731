//! The `cranelift` backend: each group of methods is one
//! [`JitmapModule`], and each method one of its functions, compiled from IR
//! built here for the method's [`Method`] semantics.
//!
//! - **Tier 0** is Cranelift at `opt_level=none`. It calls the agent's
//!   call-counting probe ([`jitmap_probe_count`]) and entry probe
//!   ([`jitmap_probe_enter`]) as imports, and sums its loop counting down. A
//!   large method first runs a straight line of 64-bit additions and xors
//!   (about 14 bytes of code each) whose result it cancels out: a megabyte
//!   of code that runs, so samples land deep in it. Cranelift compiles it in
//!   a few hundred milliseconds (a jump table as large costs as much: each
//!   of its edges becomes a block of its own).
//! - **Tier 1** is `opt_level=speed`, calls no probe, and sums counting up.
//! - Both run the method's leaf arithmetic, add its index, and call its
//!   callee as a module function: a direct call to the callee's trampoline,
//!   which jumps through its call cell, so a tier-up or de-optimization is the
//!   module's `redefine_function` and nothing is patched.
//!
//! Cranelift's verifier checks every function before it is compiled.

use cranelift_codegen::Context;
use cranelift_codegen::ir::{
    AbiParam, Function, InstBuilder, Signature, UserFuncName, Value, condcodes::IntCC, types,
};
use cranelift_codegen::settings::OptLevel;
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_module::{FuncId, Linkage, Module, default_libcall_names};
use jitmap::agent::{jitmap_probe_count, jitmap_probe_enter};
use jitmap::{ExecutionManager, HeapConfig};
use jitmap_cranelift::{JitError, JitmapBuilder, JitmapModule};

use super::shape::{CodeShape, Method, Step};

/// Bytes of tier-0 code one filler operation of a large method takes.
const FILLER_OP_BYTES: usize = 14;

/// The import an injected link failure calls: no symbol has this name.
pub(super) const MISSING_SYMBOL: &str = "jitmap_sim_injected_failure";

/// A compilation the simulator makes fail on purpose (an abort).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Inject {
    /// An instruction whose operand has the wrong type: Cranelift's verifier
    /// refuses the function and the module is unchanged.
    Verifier,
    /// A call to [`MISSING_SYMBOL`]: the function compiles, and
    /// `finalize_definitions` reserves its bytes, cannot relocate them,
    /// and aborts the reservation.
    Unresolved,
}

/// One group's module and its functions.
pub(super) struct ClifGroup {
    pub(super) module: JitmapModule,
    /// Each method's function, by index.
    funcs: Vec<FuncId>,
    probe_count: FuncId,
    probe_enter: FuncId,
    missing: FuncId,
    /// Every method's signature: the probe context in, its value out.
    signature: Signature,
    builder: FunctionBuilderContext,
}

impl ClifGroup {
    /// A module on a new heap of `manager` configured by `heap`, with
    /// `methods` functions declared as `g{group}_m{index}`.
    pub(super) fn new(
        manager: &ExecutionManager,
        heap: HeapConfig,
        group: u32,
        methods: usize,
    ) -> Result<Self, JitError> {
        let mut builder = JitmapBuilder::with_flags(
            manager,
            &[("opt_level", "none"), ("enable_verifier", "true")],
            default_libcall_names(),
        )?;
        builder.heap_config(heap);
        builder.symbol("jitmap_probe_count", jitmap_probe_count as *const u8);
        builder.symbol("jitmap_probe_enter", jitmap_probe_enter as *const u8);
        let mut module = JitmapModule::new(builder)?;
        let mut signature = module.make_signature();
        signature.params.push(AbiParam::new(types::I64));
        signature.returns.push(AbiParam::new(types::I64));
        let mut count = module.make_signature();
        count.params.push(AbiParam::new(types::I64));
        count.returns.push(AbiParam::new(types::I32));
        let mut enter = module.make_signature();
        enter.params.push(AbiParam::new(types::I64));
        enter.params.push(AbiParam::new(types::I64));
        let probe_count = module.declare_function("jitmap_probe_count", Linkage::Import, &count)?;
        let probe_enter = module.declare_function("jitmap_probe_enter", Linkage::Import, &enter)?;
        let missing = module.declare_function(MISSING_SYMBOL, Linkage::Import, &signature)?;
        let funcs = (0..methods)
            .map(|m| {
                module
                    .declare_function(&name(group, m), Linkage::Export, &signature)
                    .map_err(JitError::from)
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            module,
            funcs,
            probe_count,
            probe_enter,
            missing,
            signature,
            builder: FunctionBuilderContext::new(),
        })
    }

    /// Method `m`'s function.
    pub(super) fn func(&self, m: usize) -> FuncId {
        self.funcs[m]
    }

    /// Where callers reach method `m`: its trampoline.
    pub(super) fn trampoline(&self, m: usize) -> usize {
        self.module.get_finalized_function(self.funcs[m]).addr()
    }

    /// Selects the optimization level of `tier` for what is compiled next.
    pub(super) fn select_tier(&mut self, tier: u8) -> Result<(), JitError> {
        self.module.set_opt_level(if tier == 0 {
            OptLevel::None
        } else {
            OptLevel::Speed
        })
    }

    /// The IR of method `m` at `tier`, with `inject`'s failure built in.
    pub(super) fn body(
        &mut self,
        methods: &[Method],
        shape: &CodeShape,
        tier: u8,
        inject: Option<Inject>,
    ) -> Context {
        let m = shape.index as usize;
        let method = &methods[m];
        let mut ctx = self.module.make_context();
        ctx.func = Function::with_name_signature(
            UserFuncName::user(0, self.funcs[m].as_u32()),
            self.signature.clone(),
        );
        let mut b = FunctionBuilder::new(&mut ctx.func, &mut self.builder);
        let entry = b.create_block();
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        let context = b.block_params(entry)[0];
        let mut cancelled = None;
        if tier == 0 {
            let count = self.module.declare_func_in_func(self.probe_count, b.func);
            let cell = b.ins().iconst(types::I64, shape.counter_cell as i64);
            b.ins().call(count, &[cell]);
            let enter = self.module.declare_func_in_func(self.probe_enter, b.func);
            let id = b.ins().iconst(types::I64, shape.probe_id as i64);
            b.ins().call(enter, &[context, id]);
            if method.filler > 0 {
                cancelled = Some(filler(&mut b, method.filler / FILLER_OP_BYTES, method.mix));
            }
        }
        let sum = sum_loop(&mut b, method.work, tier == 0);
        let mut x = match cancelled {
            Some(zero) => b.ins().iadd(sum, zero),
            None => sum,
        };
        for step in method.steps() {
            x = match step {
                Step::Xor(c) => b.ins().bxor_imm_s(x, c as i64),
                Step::Mul(c) => b.ins().imul_imm_s(x, c as i64),
                Step::Rotl(r) => b.ins().rotl_imm_u(x, i64::from(r)),
                Step::Add(c) => b.ins().iadd_imm_s(x, c as i64),
            };
        }
        x = b.ins().iadd_imm_s(x, i64::from(shape.index));
        if let Some(callee) = method.callee {
            let f = self.module.declare_func_in_func(self.funcs[callee], b.func);
            let call = b.ins().call(f, &[context]);
            let value = b.inst_results(call)[0];
            x = b.ins().iadd(x, value);
        }
        match inject {
            Some(Inject::Verifier) => {
                let wrong = b.ins().iconst(types::I32, 1);
                x = b.ins().iadd(x, wrong);
            }
            Some(Inject::Unresolved) => {
                let f = self.module.declare_func_in_func(self.missing, b.func);
                let call = b.ins().call(f, &[x]);
                x = b.inst_results(call)[0];
            }
            None => {}
        }
        b.ins().return_(&[x]);
        b.seal_all_blocks();
        b.finalize(self.module.target_config());
        ctx
    }
}

/// A method's function name.
pub(super) fn name(group: u32, m: usize) -> String {
    format!("g{group}_m{m}")
}

/// The sum of `1..=work`: counting down from `work` (tier 0) or up to it.
fn sum_loop(b: &mut FunctionBuilder, work: u32, down: bool) -> Value {
    let head = b.create_block();
    let exit = b.create_block();
    b.append_block_param(head, types::I64);
    b.append_block_param(head, types::I64);
    b.append_block_param(exit, types::I64);
    let first = b
        .ins()
        .iconst(types::I64, if down { i64::from(work) } else { 1 });
    let zero = b.ins().iconst(types::I64, 0);
    b.ins().jump(head, &[first.into(), zero.into()]);
    b.switch_to_block(head);
    let (i, sum) = (b.block_params(head)[0], b.block_params(head)[1]);
    let sum = b.ins().iadd(sum, i);
    let more = if down {
        let next = b.ins().iadd_imm_s(i, -1);
        (next, next)
    } else {
        let next = b.ins().iadd_imm_s(i, 1);
        (
            next,
            b.ins()
                .icmp_imm_u(IntCC::UnsignedLessThanOrEqual, next, i64::from(work)),
        )
    };
    b.ins().brif(
        more.1,
        head,
        &[more.0.into(), sum.into()],
        exit,
        &[sum.into()],
    );
    b.switch_to_block(exit);
    b.block_params(exit)[0]
}

/// `ops` 64-bit additions and xors in a straight line, then their known
/// result subtracted: code that runs, takes about [`FILLER_OP_BYTES`] each at
/// `opt_level=none`, and returns 0.
fn filler(b: &mut FunctionBuilder, ops: usize, mix: u64) -> Value {
    let mut known = mix | 1 << 63;
    let mut acc = b.ins().iconst(types::I64, known as i64);
    for k in 0..ops as u64 {
        // Constants above 32 bits: each operation loads its own.
        let c = (mix ^ k.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1 << 62;
        if k % 2 == 0 {
            acc = b.ins().iadd_imm_s(acc, c as i64);
            known = known.wrapping_add(c);
        } else {
            acc = b.ins().bxor_imm_s(acc, c as i64);
            known ^= c;
        }
    }
    let expected = b.ins().iconst(types::I64, known as i64);
    b.ins().isub(acc, expected)
}
