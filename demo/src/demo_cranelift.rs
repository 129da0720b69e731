//! The agent's demo host compiled by Cranelift: the same five functions as
//! [`crate::demo`], with the same names, method ids and results, built as IR
//! and compiled at `opt_level=speed` into a `jitmap-cranelift` module.
//!
//! `top(rounds)` calls `middle` `rounds` times; `middle` calls `leaf_1x`,
//! `leaf_2x` and `leaf_4x`, each a module call (to the callee's trampoline,
//! which jumps through its call cell); a leaf loads the base count from the
//! host's work cell, shifts it by 0, 1 or 2 and sums `1..=n` counting down.
//! Cranelift keeps a frame pointer in each, so frame-pointer walkers (the
//! agent, perf, the eBPF profiler) see every frame.

use std::sync::atomic::{AtomicUsize, Ordering};

use cranelift_codegen::ir::{AbiParam, InstBuilder, MemFlagsData, Signature, Value, types};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_module::{FuncId, Linkage, Module, default_libcall_names};
use jitmap::{CodeRef, ExecutionManager, HeapConfig};
use jitmap_cranelift::{JitmapBuilder, JitmapModule};

use crate::demo::{DemoError, LEAVES, MIDDLE, TOP, call_top};

/// The published demo, in its module.
pub struct CraneliftDemo {
    module: JitmapModule,
    /// The base iteration count the leaves read: dropped after the module,
    /// whose code reads it.
    work: Box<AtomicUsize>,
    /// `top`, called by the host (its trampoline).
    top: extern "C" fn(u64) -> u64,
    functions: Vec<(String, FuncId)>,
}

impl std::fmt::Debug for CraneliftDemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CraneliftDemo")
            .field("functions", &self.functions())
            .finish_non_exhaustive()
    }
}

impl CraneliftDemo {
    /// Compiles and publishes the five functions in a new module (and heap)
    /// of `manager`, with the iced demo's method ids: the leaves 1 to 3,
    /// `middle` 4, `top` 5.
    pub fn publish(manager: &ExecutionManager) -> Result<Self, DemoError> {
        let mut builder =
            JitmapBuilder::with_flags(manager, &[("opt_level", "speed")], default_libcall_names())?;
        builder.heap_config(HeapConfig {
            span: 1 << 20,
            align: 32,
            register_unwind: true,
            ..HeapConfig::default()
        });
        let mut module = JitmapModule::new(builder)?;
        let work = Box::new(AtomicUsize::new(0));
        let work_cell = std::ptr::from_ref(&*work).addr() as i64;
        let mut none = module.make_signature();
        none.returns.push(AbiParam::new(types::I64));
        let mut rounds = none.clone();
        rounds.params.push(AbiParam::new(types::I64));

        let mut fctx = FunctionBuilderContext::new();
        let mut functions = Vec::new();
        let mut leaves = Vec::new();
        for (shift, name) in LEAVES.iter().enumerate() {
            let id = declare(&mut module, name, &none)?;
            define(&mut module, &mut fctx, id, &none, |b, _, _| {
                leaf(b, work_cell, shift as i64)
            })?;
            leaves.push(id);
            functions.push((name.to_string(), id));
        }
        let middle = declare(&mut module, MIDDLE, &none)?;
        define(&mut module, &mut fctx, middle, &none, |b, module, _| {
            let mut sum = b.ins().iconst(types::I64, 0);
            for &callee in &leaves {
                let f = module.declare_func_in_func(callee, b.func);
                let call = b.ins().call(f, &[]);
                let value = b.inst_results(call)[0];
                sum = b.ins().iadd(sum, value);
            }
            b.ins().return_(&[sum]);
        })?;
        functions.push((MIDDLE.to_string(), middle));
        let top = declare(&mut module, TOP, &rounds)?;
        define(&mut module, &mut fctx, top, &rounds, |b, module, n| {
            top_loop(b, module, middle, n[0])
        })?;
        functions.push((TOP.to_string(), top));
        for (i, (_, id)) in functions.iter().enumerate() {
            module.set_method_id(*id, 1 + i as u64)?;
        }
        module.finalize_jit()?;
        // SAFETY: `top`'s trampoline jumps to a function of the signature
        // `fn(i64) -> i64`, published by the finalize above.
        let top = unsafe {
            std::mem::transmute::<*const u8, extern "C" fn(u64) -> u64>(
                module.get_finalized_function(top),
            )
        };
        Ok(Self {
            module,
            work,
            top,
            functions,
        })
    }

    /// Each function's name and its live code.
    pub fn functions(&self) -> Vec<(String, CodeRef)> {
        self.functions
            .iter()
            .filter_map(|(name, id)| Some((name.clone(), self.module.function_code(*id)?)))
            .collect()
    }

    /// Calls `top(rounds)` with the leaves at `base`, `2 * base` and
    /// `4 * base` iterations (`base` at most 2^29); what the code computed.
    pub fn run(&self, rounds: u64, base: u32) -> u64 {
        // Relaxed: read by JIT code on this same thread.
        self.work
            .store(base.min(1 << 29) as usize, Ordering::Relaxed);
        // The module, and so every function and cell `top` reaches, lives as
        // long as `self`.
        call_top(self.top, rounds)
    }
}

/// Declares an exported function.
fn declare(module: &mut JitmapModule, name: &str, sig: &Signature) -> Result<FuncId, DemoError> {
    Ok(module
        .declare_function(name, Linkage::Export, sig)
        .map_err(jitmap_cranelift::JitError::from)?)
}

/// Defines `id` with the signature `sig` and the body `body(builder,
/// module, parameters)` (in one block it starts).
fn define(
    module: &mut JitmapModule,
    fctx: &mut FunctionBuilderContext,
    id: FuncId,
    sig: &Signature,
    body: impl FnOnce(&mut FunctionBuilder, &mut JitmapModule, &[Value]),
) -> Result<(), DemoError> {
    let mut ctx = module.make_context();
    ctx.func.signature = sig.clone();
    let mut b = FunctionBuilder::new(&mut ctx.func, fctx);
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    let params = b.block_params(entry).to_vec();
    body(&mut b, module, &params);
    b.seal_all_blocks();
    b.finalize(module.target_config());
    module
        .define_function(id, &mut ctx)
        .map_err(jitmap_cranelift::JitError::from)?;
    Ok(())
}

/// A leaf: `n = *work << shift`, then the sum of `1..=n` counting down
/// (0 when `n` is 0).
fn leaf(b: &mut FunctionBuilder, work_cell: i64, shift: i64) {
    let cell = b.ins().iconst(types::I64, work_cell);
    let base = b.ins().load(types::I64, MemFlagsData::trusted(), cell, 0);
    let n = b.ins().ishl_imm_u(base, shift);
    let sum = count_down(b, n, |b, i, sum| b.ins().iadd(sum, i));
    b.ins().return_(&[sum]);
}

/// `top(rounds)`: `middle` called `rounds` times, its results summed.
fn top_loop(b: &mut FunctionBuilder, module: &mut JitmapModule, middle: FuncId, rounds: Value) {
    let f = module.declare_func_in_func(middle, b.func);
    let sum = count_down(b, rounds, |b, _, sum| {
        let call = b.ins().call(f, &[]);
        let value = b.inst_results(call)[0];
        b.ins().iadd(sum, value)
    });
    b.ins().return_(&[sum]);
}

/// A loop from `n` down to 1 (none when `n` is 0) that carries a sum from
/// 0, `step(builder, i, sum)` giving the next; the final sum.
fn count_down(
    b: &mut FunctionBuilder,
    n: Value,
    step: impl FnOnce(&mut FunctionBuilder, Value, Value) -> Value,
) -> Value {
    let head = b.create_block();
    let exit = b.create_block();
    b.append_block_param(head, types::I64);
    b.append_block_param(head, types::I64);
    b.append_block_param(exit, types::I64);
    let zero = b.ins().iconst(types::I64, 0);
    b.ins()
        .brif(n, head, &[n.into(), zero.into()], exit, &[zero.into()]);
    b.switch_to_block(head);
    let (i, sum) = (b.block_params(head)[0], b.block_params(head)[1]);
    let sum = step(b, i, sum);
    let next = b.ins().iadd_imm_s(i, -1);
    b.ins()
        .brif(next, head, &[next.into(), sum.into()], exit, &[sum.into()]);
    b.switch_to_block(exit);
    b.block_params(exit)[0]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::demo::Demo;

    #[test]
    fn every_function_computes_what_the_host_predicts() {
        let manager = ExecutionManager::new(4);
        let demo = CraneliftDemo::publish(&manager).unwrap();
        assert_eq!(demo.run(0, 100), 0);
        assert_eq!(demo.run(3, 100), Demo::expected(3, 100));
        assert_eq!(demo.run(1, 7), 28 + 105 + 406);
        let functions = demo.functions();
        let names: Vec<_> = functions.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["leaf_1x", "leaf_2x", "leaf_4x", "middle", "top"]);
        // Looked up, each names itself with the iced demo's method id, and
        // each keeps a frame pointer: `push rbp; mov rbp, rsp` first, or on
        // aarch64 `stp x29, x30, [sp, #-16]!`.
        let prologue: &[u8] = if cfg!(target_arch = "aarch64") {
            &[0xFD, 0x7B, 0xBF, 0xA9]
        } else {
            &[0x55, 0x48, 0x89, 0xE5]
        };
        let reader = manager.register_reader().unwrap();
        let guard = manager.pin(&reader).unwrap();
        for (i, (name, code)) in functions.iter().enumerate() {
            let block = guard.find(code.start()).unwrap();
            assert_eq!(block.method_id(), 1 + i as u64);
            assert_eq!(block.name(), Some(name.as_str()));
            // SAFETY: published code, readable while the demo lives.
            let head = unsafe { std::slice::from_raw_parts(code.start() as *const u8, 4) };
            assert_eq!(head, prologue, "{name}");
        }
    }
}
