//! Small JIT functions for the agent's benchmarks, assembled with `iced-x86`:
//! a recursion that builds a stack of real JIT frames, and a loop that calls a
//! native function through an absolute address, as JIT code calls a probe.

use iced_x86::IcedError;
use iced_x86::code_asm::{CodeAssembler, r12, r13, rax, rbp, rbx, rdi, rdx, rsi, rsp};
use jitmap::{CodeInfo, CodeRef, JitKind, OwnedHeap};

use crate::demo::DemoError;

/// Assembles `body` at a reserved address in `heap` and publishes it as `name`.
pub fn publish(
    heap: &OwnedHeap,
    name: &str,
    method_id: u64,
    body: impl Fn(&mut CodeAssembler, u64) -> Result<(), IcedError>,
) -> Result<CodeRef, DemoError> {
    let mut a = CodeAssembler::new(64)?;
    body(&mut a, 0)?;
    let size = a.assemble(0)?.len() as u64;
    let mut r = heap.reserve(size)?;
    let mut a = CodeAssembler::new(64)?;
    body(&mut a, r.address() as u64)?;
    let bytes = a.assemble(r.address() as u64)?;
    r.code_mut().copy_from_slice(&bytes);
    Ok(r.publish(CodeInfo::new(method_id, name, JitKind::Optimized))?)
}

/// `recurse(n, callback, arg)`: calls itself until `n` is 0, then calls
/// `callback(arg)` with `n + 1` frames of itself on the stack (each with a
/// frame pointer). Publish with [`publish`].
pub fn recursion(a: &mut CodeAssembler, own_address: u64) -> Result<(), IcedError> {
    a.push(rbp)?;
    a.mov(rbp, rsp)?;
    let mut bottom = a.create_label();
    a.test(rdi, rdi)?;
    a.jz(bottom)?;
    a.dec(rdi)?;
    a.mov(rax, own_address)?;
    a.call(rax)?;
    a.pop(rbp)?;
    a.ret()?;
    a.set_label(&mut bottom)?;
    a.mov(rdi, rdx)?;
    a.call(rsi)?;
    a.pop(rbp)?;
    a.ret()
}

/// `call_loop(n, arg0, arg1)`: calls `target(arg0, arg1)` `n` times (n ≥ 1)
/// through its absolute address, the way JIT code calls a probe.
pub fn call_loop(target: u64) -> impl Fn(&mut CodeAssembler, u64) -> Result<(), IcedError> {
    move |a, _| {
        a.push(rbp)?;
        a.mov(rbp, rsp)?;
        a.push(rbx)?;
        a.push(r12)?;
        a.push(r13)?;
        a.sub(rsp, 8)?; // calls stay 16-byte aligned
        a.mov(rbx, rdi)?;
        a.mov(r12, rsi)?;
        a.mov(r13, rdx)?;
        let mut again = a.create_label();
        a.set_label(&mut again)?;
        a.mov(rdi, r12)?;
        a.mov(rsi, r13)?;
        a.mov(rax, target)?;
        a.call(rax)?;
        a.dec(rbx)?;
        a.jnz(again)?;
        a.add(rsp, 8)?;
        a.pop(r13)?;
        a.pop(r12)?;
        a.pop(rbx)?;
        a.pop(rbp)?;
        a.ret()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::atomic::{AtomicU64, Ordering};

    static CALLS: AtomicU64 = AtomicU64::new(0);
    static BOTTOM: AtomicU64 = AtomicU64::new(0);

    extern "C" fn bottom(arg: u64) {
        // Relaxed: read by this test's thread.
        BOTTOM.store(arg, Ordering::Relaxed);
    }

    extern "C" fn count(a: u64, b: u64) -> u64 {
        // Relaxed: a counter read by this test's thread.
        CALLS.fetch_add(a + b, Ordering::Relaxed);
        0
    }

    #[test]
    fn the_loop_calls_its_target_and_the_recursion_reaches_the_bottom() {
        if !cfg!(target_arch = "x86_64") {
            println!("skipped on aarch64: iced-x86 code");
            return;
        }
        let manager = jitmap::ExecutionManager::new(4);
        let heap = manager
            .create_heap(jitmap::HeapConfig {
                span: 1 << 16,
                ..Default::default()
            })
            .unwrap();
        let looped = publish(&heap, "loop", 1, call_loop(count as *const () as u64)).unwrap();
        // SAFETY: a published function with this C signature (above).
        let f: extern "C" fn(u64, u64, u64) = unsafe { std::mem::transmute(looped.start()) };
        f(5, 2, 3);
        // Relaxed: same thread.
        assert_eq!(CALLS.swap(0, Ordering::Relaxed), 25);
        let rec = publish(&heap, "rec", 2, recursion).unwrap();
        // SAFETY: as above.
        let r: extern "C" fn(u64, extern "C" fn(u64), u64) =
            unsafe { std::mem::transmute(rec.start()) };
        r(10, bottom, 7);
        // Relaxed: same thread.
        assert_eq!(BOTTOM.load(Ordering::Relaxed), 7);
    }
}
