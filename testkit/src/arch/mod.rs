//! Machine code for tests, emitted for the architecture the test runs on:
//! x86-64 bytes never run on aarch64, nor the reverse. Each file beside this
//! one provides the same functions, all returning complete functions with
//! the platform's C calling convention (or, for [`trap_fill`], bytes that
//! trap wherever an instruction could start):
//! - `returns(value)`: returns `value`;
//! - `set_returned(code, value)`: rewrites what a `returns` body returns, in
//!   place, changing as few bytes as it can (a patch);
//! - `spin_then_return(n, value)`: counts `n` down to zero, then returns `value`;
//! - `spin_until_set()`: a function of one pointer that spins until the
//!   word there is not zero;
//! - `add_loop(count, step)`: adds `step` `count` times, returns the sum;
//! - `jump_through(cell)`: tail-jumps to the address held in the word at `cell`
//!   (JIT code calling through a call cell);
//! - `call_in_frame(target)`: calls `target` with its own argument inside a
//!   frame-pointer frame (a frame record on aarch64), and returns its result;
//! - `trap_fill(code)`: fills `code` with traps (`int3`, `brk #0`);
//! - `DWARF_SP_FP_RA`: the CFI register numbers of the stack pointer, the
//!   frame pointer and the return address column; `ENTRY_CFA`, the CFA at a
//!   function's entry; `CALL_IN_FRAME_CFI`, the rows of `call_in_frame`.
//!
//! ```
//! use jitmap::{CodeInfo, ExecutionManager, HeapConfig, JitKind};
//! let manager = ExecutionManager::new(1);
//! let heap = manager.create_heap(HeapConfig { span: 1 << 20, ..HeapConfig::default() })?;
//! let body = jitmap_testkit::arch::returns(42);
//! let mut r = heap.reserve(body.len() as u64)?;
//! r.code_mut().copy_from_slice(&body);
//! let code = r.publish(CodeInfo::new(1, "answer", JitKind::Optimized))?;
//! // SAFETY: `returns` emits a complete C function taking nothing.
//! let f: extern "C" fn() -> u32 = unsafe { std::mem::transmute(code.start()) };
//! assert_eq!(f(), 42);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(target_arch = "aarch64")]
pub use aarch64::*;

#[cfg(target_arch = "x86_64")]
mod x86_64;
#[cfg(target_arch = "x86_64")]
pub use x86_64::*;

use jitmap::MemoryMode;

/// The memory modes in which a test may run bytes written over code that
/// already ran at the same address (a reused extent, a patch). On aarch64
/// under qemu-user, W^X is left out: qemu does not see a write through the
/// second view of a page whose code it has already translated, and runs its
/// stale translation (real hardware is kept coherent by the heap's cache
/// maintenance). `docs/guide/checked.md` says so.
pub fn rewrite_modes() -> &'static [MemoryMode] {
    if cfg!(target_arch = "aarch64") {
        &[MemoryMode::Rwx, MemoryMode::FlipOnPublish]
    } else {
        &[
            MemoryMode::Rwx,
            MemoryMode::FlipOnPublish,
            MemoryMode::WriteXorExecute,
        ]
    }
}
