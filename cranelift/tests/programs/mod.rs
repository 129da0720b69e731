//! The same small programs built for any `cranelift_module::Module`, so the
//! tests run them on cranelift-jit and on `JitmapModule` and compare: loops,
//! recursion (fib, ackermann), calls between JIT functions, a call to a host
//! function, and a data object the code updates.

#![allow(dead_code)] // each test binary uses its share of the programs

use cranelift_codegen::Context;
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{AbiParam, InstBuilder, MemFlagsData, Signature, types::I64};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_module::{DataDescription, DataId, FuncId, Linkage, Module};

/// The host function the programs call, by the name `host_mul_add`.
pub extern "C" fn host_mul_add(a: i64, b: i64) -> i64 {
    a * b + 1
}

/// The programs' ids in one module.
pub struct Programs {
    pub fib: FuncId,
    pub ack: FuncId,
    pub sum_to: FuncId,
    pub fib_twice: FuncId,
    pub calls_host: FuncId,
    pub bump: FuncId,
    pub counter: DataId,
}

/// A signature of `params` i64 arguments returning one i64.
pub fn sig(module: &impl Module, params: usize) -> Signature {
    let mut sig = module.make_signature();
    sig.params.extend((0..params).map(|_| AbiParam::new(I64)));
    sig.returns.push(AbiParam::new(I64));
    sig
}

/// Builds a function body with `build` and returns its context.
pub fn body<M: Module>(
    module: &mut M,
    params: usize,
    build: impl FnOnce(&mut M, &mut FunctionBuilder<'_>, &[cranelift_codegen::ir::Value]),
) -> Context {
    let mut ctx = module.make_context();
    ctx.func.signature = sig(module, params);
    let mut fctx = FunctionBuilderContext::new();
    {
        let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
        let entry = b.create_block();
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        let args = b.block_params(entry).to_vec();
        build(module, &mut b, &args);
        b.seal_all_blocks();
        b.finalize(module.target_config());
    }
    ctx
}

/// `fib(n)`: n for n < 2, else fib(n - 1) + fib(n - 2).
pub fn fib_body<M: Module>(module: &mut M, fib: FuncId) -> Context {
    body(module, 1, |module, b, args| {
        let callee = module.declare_func_in_func(fib, b.func);
        let n = args[0];
        let small = b.create_block();
        let large = b.create_block();
        let lt = b.ins().icmp_imm_s(IntCC::SignedLessThan, n, 2);
        b.ins().brif(lt, small, &[], large, &[]);
        b.switch_to_block(small);
        b.ins().return_(&[n]);
        b.switch_to_block(large);
        let n1 = b.ins().iadd_imm_s(n, -1);
        let n2 = b.ins().iadd_imm_s(n, -2);
        let c1 = b.ins().call(callee, &[n1]);
        let r1 = b.inst_results(c1)[0];
        let c2 = b.ins().call(callee, &[n2]);
        let r2 = b.inst_results(c2)[0];
        let sum = b.ins().iadd(r1, r2);
        b.ins().return_(&[sum]);
    })
}

/// Declares and defines every program in `module` (not finalized).
pub fn define<M: Module>(module: &mut M) -> Programs {
    let fib = module
        .declare_function("fib", Linkage::Export, &sig(module, 1))
        .unwrap();
    let ack = module
        .declare_function("ack", Linkage::Local, &sig(module, 2))
        .unwrap();
    let sum_to = module
        .declare_function("sum_to", Linkage::Local, &sig(module, 1))
        .unwrap();
    let fib_twice = module
        .declare_function("fib_twice", Linkage::Export, &sig(module, 1))
        .unwrap();
    let host = module
        .declare_function("host_mul_add", Linkage::Import, &sig(module, 2))
        .unwrap();
    let calls_host = module
        .declare_function("calls_host", Linkage::Export, &sig(module, 2))
        .unwrap();
    let bump = module
        .declare_function("bump", Linkage::Export, &sig(module, 1))
        .unwrap();
    let counter = module
        .declare_data("counter", Linkage::Local, true, false)
        .unwrap();

    let mut ctx = fib_body(module, fib);
    module.define_function(fib, &mut ctx).unwrap();

    // ack(m, n): n + 1 if m == 0; ack(m - 1, 1) if n == 0; else
    // ack(m - 1, ack(m, n - 1)).
    let mut ctx = body(module, 2, |module, b, args| {
        let callee = module.declare_func_in_func(ack, b.func);
        let (m, n) = (args[0], args[1]);
        let m_zero = b.create_block();
        let m_pos = b.create_block();
        let n_zero = b.create_block();
        let both = b.create_block();
        b.ins().brif(m, m_pos, &[], m_zero, &[]);
        b.switch_to_block(m_zero);
        let r = b.ins().iadd_imm_s(n, 1);
        b.ins().return_(&[r]);
        b.switch_to_block(m_pos);
        b.ins().brif(n, both, &[], n_zero, &[]);
        b.switch_to_block(n_zero);
        let m1 = b.ins().iadd_imm_s(m, -1);
        let one = b.ins().iconst(I64, 1);
        let c = b.ins().call(callee, &[m1, one]);
        let r = b.inst_results(c)[0];
        b.ins().return_(&[r]);
        b.switch_to_block(both);
        let n1 = b.ins().iadd_imm_s(n, -1);
        let c = b.ins().call(callee, &[m, n1]);
        let inner = b.inst_results(c)[0];
        let m1 = b.ins().iadd_imm_s(m, -1);
        let c = b.ins().call(callee, &[m1, inner]);
        let r = b.inst_results(c)[0];
        b.ins().return_(&[r]);
    });
    module.define_function(ack, &mut ctx).unwrap();

    // sum_to(n): 0 + 1 + ... + (n - 1), in a loop.
    let mut ctx = body(module, 1, |_, b, args| {
        let head = b.create_block();
        let step = b.create_block();
        let done = b.create_block();
        b.append_block_param(head, I64); // i
        b.append_block_param(head, I64); // acc
        let zero = b.ins().iconst(I64, 0);
        b.ins().jump(head, &[zero.into(), zero.into()]);
        b.switch_to_block(head);
        let (i, acc) = (b.block_params(head)[0], b.block_params(head)[1]);
        let more = b.ins().icmp(IntCC::SignedLessThan, i, args[0]);
        b.ins().brif(more, step, &[], done, &[]);
        b.switch_to_block(step);
        let acc2 = b.ins().iadd(acc, i);
        let i2 = b.ins().iadd_imm_s(i, 1);
        b.ins().jump(head, &[i2.into(), acc2.into()]);
        b.switch_to_block(done);
        b.ins().return_(&[acc]);
    });
    module.define_function(sum_to, &mut ctx).unwrap();

    // fib_twice(n) = fib(n) + sum_to(n) * 0 + fib(n): calls between functions.
    let mut ctx = body(module, 1, |module, b, args| {
        let f = module.declare_func_in_func(fib, b.func);
        let s = module.declare_func_in_func(sum_to, b.func);
        let c = b.ins().call(f, &[args[0]]);
        let a = b.inst_results(c)[0];
        let c = b.ins().call(s, &[args[0]]);
        let sum = b.inst_results(c)[0];
        let zeroed = b.ins().imul_imm_s(sum, 0);
        let c = b.ins().call(f, &[args[0]]);
        let c2 = b.inst_results(c)[0];
        let sum = b.ins().iadd(a, zeroed);
        let sum = b.ins().iadd(sum, c2);
        b.ins().return_(&[sum]);
    });
    module.define_function(fib_twice, &mut ctx).unwrap();

    // calls_host(a, b) = host_mul_add(a, b).
    let mut ctx = body(module, 2, |module, b, args| {
        let h = module.declare_func_in_func(host, b.func);
        let c = b.ins().call(h, &[args[0], args[1]]);
        let r = b.inst_results(c)[0];
        b.ins().return_(&[r]);
    });
    module.define_function(calls_host, &mut ctx).unwrap();

    // bump(by): counter += by; returns the new value.
    let mut ctx = body(module, 1, |module, b, args| {
        let gv = module.declare_data_in_func(counter, b.func);
        let addr = b
            .ins()
            .symbol_value(module.target_config().pointer_type(), gv);
        let flags = MemFlagsData::trusted();
        let old = b.ins().load(I64, flags, addr, 0);
        let new = b.ins().iadd(old, args[0]);
        b.ins().store(flags, new, addr, 0);
        b.ins().return_(&[new]);
    });
    module.define_function(bump, &mut ctx).unwrap();

    let mut data = DataDescription::new();
    data.define(100i64.to_le_bytes().into());
    module.define_data(counter, &data).unwrap();

    Programs {
        fib,
        ack,
        sum_to,
        fib_twice,
        calls_host,
        bump,
        counter,
    }
}

/// A function pointer of `params` i64 arguments from an address.
///
/// # Safety
/// `address` is a finalized function of that signature.
pub unsafe fn f1(address: *const u8) -> extern "C" fn(i64) -> i64 {
    // SAFETY: the caller's contract.
    unsafe { std::mem::transmute(address) }
}

/// As [`f1`], for two arguments.
///
/// # Safety
/// As [`f1`].
pub unsafe fn f2(address: *const u8) -> extern "C" fn(i64, i64) -> i64 {
    // SAFETY: the caller's contract.
    unsafe { std::mem::transmute(address) }
}

/// The reference results, computed in Rust.
pub fn fib(n: i64) -> i64 {
    if n < 2 { n } else { fib(n - 1) + fib(n - 2) }
}

pub fn ack(m: i64, n: i64) -> i64 {
    match (m, n) {
        (0, n) => n + 1,
        (m, 0) => ack(m - 1, 1),
        (m, n) => ack(m - 1, ack(m, n - 1)),
    }
}
