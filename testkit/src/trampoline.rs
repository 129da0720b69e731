//! A trampoline, as a JIT's call cells use them: a stub that jumps on
//! through a cell (`jump_through`) and pushes no frame, of a kind the
//! manager is told is frameless
//! ([`jitmap::ExecutionManager::declare_frameless_stub`]). A walker that
//! catches a thread in it must step it by the entry rule, not by the frame
//! pointer, which names the caller's caller.
//!
//! The host calls the trampoline in a loop from [`call_through`]; a sample
//! in the stub has the stack [`TRAMPOLINE_STACK`].

use std::time::{Duration, Instant};

use jitmap::heap::StubKind;
use jitmap::{CodeInfo, CodeRef, ExecutionManager, HeapConfig, JitKind, StubKindName};

use crate::demo::DemoError;

/// The trampolines' stub kind.
pub const KIND: StubKind = match StubKind::new(1) {
    Some(kind) => kind,
    None => panic!("kind 1 is a stub kind"),
};

/// The innermost frames of a sample in the trampoline, leaf first.
pub const TRAMPOLINE_STACK: [&str; 3] = [
    "[stub 1: trampoline (jitmap-testkit)]",
    "jitmap_testkit::trampoline::call_through",
    "jitmap_testkit::trampoline::run",
];

/// What `target` returns.
const VALUE: u16 = 7;

/// Calls `f` (the trampoline) `n` times, out of line: the native frame a
/// trampoline returns into.
#[inline(never)]
pub fn call_through(f: extern "C" fn(u64) -> u64, n: u64) -> u64 {
    let mut acc = 0u64;
    for i in 0..n {
        acc = acc.wrapping_add(f(std::hint::black_box(i)));
    }
    acc
}

/// `jitmap-host trampoline`'s workload: publishes a method and a
/// trampoline to it (its kind declared frameless and named), calls `ready`, then
/// calls through the trampoline from [`call_through`] for `duration`.
/// Returns the calls made.
#[inline(never)]
pub fn run(
    manager: &ExecutionManager,
    duration: Duration,
    ready: impl FnOnce(),
) -> Result<u64, DemoError> {
    let heap = manager.create_heap(HeapConfig {
        span: 1 << 16,
        ..HeapConfig::default()
    })?;
    let publish = |code: Vec<u8>, stub: bool| -> Result<CodeRef, DemoError> {
        let mut r = heap.reserve(code.len() as u64)?;
        r.code_mut().copy_from_slice(&code);
        Ok(if stub {
            r.publish_stub(KIND)?
        } else {
            r.publish(CodeInfo::new(1, "target", JitKind::Optimized))?
        })
    };
    let target = publish(crate::arch::returns(VALUE), false)?;
    // The cell outlives every call: it is dropped after the loop.
    let cell = Box::new(target.start());
    let stub = publish(
        crate::arch::jump_through(&*cell as *const usize as usize),
        true,
    )?;
    manager.declare_frameless_stub(KIND);
    // Named, so that profiles label its frames by what and whose it is.
    manager.name_stub_kind(KIND, StubKindName::new("jitmap-testkit", "trampoline")?)?;
    // SAFETY: the trampoline jumps to `target`, a complete function that
    // returns a constant; it takes one u64 (ignored).
    let f: extern "C" fn(u64) -> u64 = unsafe { std::mem::transmute(stub.start()) };
    ready();
    // The loop is this function's own (not `calls_for`'s closure): it is
    // the third frame of TRAMPOLINE_STACK.
    let deadline = Instant::now() + duration;
    let mut calls = 0;
    while Instant::now() < deadline {
        let sum = call_through(f, 100_000);
        assert_eq!(sum, 100_000 * u64::from(VALUE));
        calls += 1;
    }
    drop(cell);
    Ok(calls)
}
