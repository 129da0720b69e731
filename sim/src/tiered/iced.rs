//! The `iced` backend: machine code for the tiered JIT's methods, assembled
//! by hand with `iced-x86` in a few fixed instruction shapes.
//!
//! Every method takes the calling thread's probe context in `rdi` and passes
//! it on to its callee, which it calls through the callee's indirection cell.
//! It computes what [`super::shape`] says, with no leaf arithmetic:
//! `value(m) = 1 + 2 + ... + work(m) + m + value(callee)`.
//!
//! - Tier 0 counts its calls with [`jitmap_probe_count`], records its entry
//!   with [`jitmap_probe_enter`], and sums with a countdown loop. A large
//!   method jumps over a block of filler to make it megabytes long.
//! - Tier 1 calls no probe, sums with a count-up loop, and is shaped and sized
//!   differently.
//!
//! Both keep `push rbp; mov rbp, rsp` frames, so the agent walks through them.

use iced_x86::IcedError;
use iced_x86::code_asm::{
    CodeAssembler, eax, ecx, edx, qword_ptr, r12, rax, rbp, rbx, rcx, rdi, rsi, rsp,
};
use jitmap::agent::{jitmap_probe_count, jitmap_probe_enter};

use super::shape::{CodeShape, Method};

/// Tier-0 code for `method`; it calls its callee through the cell at
/// `callee_cell`.
pub(super) fn tier0(
    a: &mut CodeAssembler,
    method: &Method,
    shape: &CodeShape,
    callee_cell: Option<u64>,
) -> Result<(), IcedError> {
    prologue(a)?;
    a.mov(rdi, shape.counter_cell)?;
    a.mov(rax, jitmap_probe_count as *const () as u64)?;
    a.call(rax)?;
    a.mov(rdi, r12)?;
    a.mov(rsi, shape.probe_id)?;
    a.mov(rax, jitmap_probe_enter as *const () as u64)?;
    a.call(rax)?;
    if method.filler > 0 {
        let mut body = a.create_label();
        a.jmp(body)?;
        a.db(&vec![0xCC; method.filler])?;
        a.set_label(&mut body)?;
    }
    a.mov(ecx, method.work)?;
    a.xor(eax, eax)?;
    let mut again = a.create_label();
    a.set_label(&mut again)?;
    a.add(rax, rcx)?;
    a.dec(ecx)?;
    a.jnz(again)?;
    finish(a, shape, callee_cell)
}

/// Tier-1 code for `method`, as [`tier0`]'s.
pub(super) fn tier1(
    a: &mut CodeAssembler,
    method: &Method,
    shape: &CodeShape,
    callee_cell: Option<u64>,
) -> Result<(), IcedError> {
    prologue(a)?;
    a.xor(eax, eax)?;
    a.mov(ecx, 1)?;
    a.mov(edx, method.work + 1)?;
    let mut again = a.create_label();
    a.set_label(&mut again)?;
    a.add(rax, rcx)?;
    a.inc(ecx)?;
    a.cmp(ecx, edx)?;
    a.jne(again)?;
    finish(a, shape, callee_cell)?;
    // A different size and shape from tier 0: padding after the return.
    a.db(&[0x90; 24])
}

/// `push rbp; mov rbp, rsp`, saves rbx and r12, keeps the context in r12.
fn prologue(a: &mut CodeAssembler) -> Result<(), IcedError> {
    a.push(rbp)?;
    a.mov(rbp, rsp)?;
    a.push(rbx)?;
    a.push(r12)?; // calls below stay 16-byte aligned
    a.mov(r12, rdi)
}

/// Adds the index and the callee's value to the loop's sum in rax, returns.
fn finish(
    a: &mut CodeAssembler,
    shape: &CodeShape,
    callee_cell: Option<u64>,
) -> Result<(), IcedError> {
    a.add(rax, i32::try_from(shape.index).unwrap_or(i32::MAX))?;
    a.mov(rbx, rax)?;
    if let Some(cell) = callee_cell {
        a.mov(rdi, r12)?;
        a.mov(rax, cell)?;
        a.call(qword_ptr(rax))?;
        a.add(rbx, rax)?;
    }
    a.mov(rax, rbx)?;
    a.pop(r12)?;
    a.pop(rbx)?;
    a.pop(rbp)?;
    a.ret()
}
