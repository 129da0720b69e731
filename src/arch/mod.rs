//! Everything in the library that depends on the instruction set, in one
//! file per architecture; the rest of the crate calls through here and holds
//! no `cfg(target_arch)` of its own.
//!
//! A new architecture is one new file beside `x86_64.rs` and `aarch64.rs`
//! that provides:
//! - `registers(context)`: pc, stack pointer, frame pointer and link register
//!   from a signal handler's `ucontext_t`;
//! - `current_registers()`: the same for the calling function (`#[inline(always)]`);
//! - `leaf_state(pc, start, offset)`: where a JIT leaf without usable CFI
//!   stands in its prologue or epilogue, read from its instruction bytes;
//! - `RETURN_ADDRESS_IN_LINK_REGISTER`: whether a call leaves the return
//!   address in a register (aarch64's x30) or on the stack (x86-64);
//! - `DWARF_SP`, `DWARF_FP`, `DWARF_RA`: the CFI register numbers of the
//!   stack pointer, the frame pointer and the return address column, and
//!   `DWARF_VENDOR`, the vendor extensions CFI is read with;
//! - `strip_code_address(addr)`: a saved return address without the pointer
//!   authentication code a signed return carries (the identity where there
//!   is none);
//! - `flush_icache(start, len)`: instruction-cache maintenance after code is
//!   written, on the executing core's addresses;
//! - `PATCH_WORD` and `store_patch_word(at, bytes)`: the unit a patch of
//!   live code is written in, and the one store that writes it, with what a
//!   running thread may see meanwhile;
//! - `REUSE_NEEDS_CORE_SYNC` and `FRESH_NEEDS_CORE_SYNC`: whether code
//!   published over bytes that held other code, or over bytes that were
//!   executable but never held code, must make every other core serialize
//!   its instruction stream;
//! - `ELF_MACHINE`: the ELF `e_machine` of the host (jitdump, GDB's objects);
//! - `ticks()`: a cycle or timer counter readable in one instruction, and
//!   `tick_rate()`: its frequency where the architecture reports one;
//! - `EXCEPTION_RETURN_SYNCHRONIZES`: whether every return to user space
//!   serializes the instruction stream (membarrier's fallbacks);
//! - `FRAME_RECORD_AT_TOP`: whether every frame record is at the top of its
//!   frame, so that the caller's stack pointer is two words above it;
//! - `PLT_ENTRY`, `plt_push_offset(expression)` and `plt_slot(entry, addr)`:
//!   the PLT's entry size, the CFA expression a linker writes for lazy PLT
//!   entries (if it writes one), and the GOT slot an entry jumps through;
//!   `PLT_HEADER` and `plt_entry_size(entries)`: the lazy PLT's header, and
//!   the entry size measured from the code where linkers record none;
//!   `PLT_ENTRY_RULE_SECTIONS`: the PLT sections stepped by the entry rule
//!   where no FDE covers them.
//!
//! Frame records have the same shape on both: the caller's frame pointer at
//! the frame pointer, the return address one word above it, and the caller's
//! stack pointer two words above.

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(target_arch = "aarch64")]
pub(crate) use aarch64::*;

#[cfg(target_arch = "x86_64")]
mod x86_64;
#[cfg(target_arch = "x86_64")]
pub(crate) use x86_64::*;

/// An interrupted or running thread's registers, as the stack walk needs them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Registers {
    pub(crate) pc: usize,
    pub(crate) fp: usize,
    pub(crate) sp: usize,
    /// The link register (aarch64's x30): the return address of a function
    /// that has not saved it yet. Zero where calls push the return address.
    pub(crate) lr: usize,
}

/// Where a JIT leaf without usable CFI stands in its frame's setup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LeafState {
    /// At its first instruction, or at its return: the return address is
    /// where a call leaves it (the top word, or the link register) and the
    /// frame pointer is still the caller's.
    AtEntry,
    /// Just past the instruction that saves the caller's frame pointer (and,
    /// on aarch64, the link register): that pair is at the stack pointer,
    /// and the caller's stack pointer `frame` bytes above it (16 for
    /// x86-64's `push rbp`; the whole frame for aarch64's
    /// `stp x29, x30, [sp, #-frame]!`).
    AfterPush {
        /// The bytes the push took from the stack pointer.
        frame: i32,
    },
    /// Its frame is established (or it keeps none).
    Settled,
}

/// The frame record's layout: the return address and the caller's frame
/// pointer, relative to the canonical frame address, which is two words above
/// the frame pointer where the record is at the top of the frame (always on
/// x86-64; see `FRAME_RECORD_AT_TOP`).
pub(crate) const FRAME_RECORD: (i32, i32, i32) = (16, -8, -16);
