//! x86-64: `ucontext_t` registers, the `push rbp` prologue, return addresses
//! on the stack, no pointer authentication, coherent instruction fetch.

use super::{LeafState, Registers};

/// Reads pc, frame pointer and stack pointer from an x86-64 `ucontext_t`.
///
/// # Safety
/// `context` is the third argument of an `SA_SIGINFO` handler.
pub(crate) unsafe fn registers(context: *mut libc::c_void) -> Registers {
    // SAFETY: the kernel passes a valid ucontext_t (the caller's contract).
    let gregs = unsafe { &(*context.cast::<libc::ucontext_t>()).uc_mcontext.gregs };
    Registers {
        pc: gregs[libc::REG_RIP as usize] as usize,
        fp: gregs[libc::REG_RBP as usize] as usize,
        sp: gregs[libc::REG_RSP as usize] as usize,
        lr: 0,
    }
}

/// The calling function's pc, and the frame and stack pointers it runs with.
#[inline(always)]
pub(crate) fn current_registers() -> Registers {
    let (pc, fp, sp): (usize, usize, usize);
    // SAFETY: reads three registers; touches no memory and no flags.
    unsafe {
        core::arch::asm!(
            "lea {pc}, [rip]",
            "mov {fp}, rbp",
            "mov {sp}, rsp",
            pc = out(reg) pc,
            fp = out(reg) fp,
            sp = out(reg) sp,
            options(nomem, nostack, preserves_flags)
        )
    };
    Registers { pc, fp, sp, lr: 0 }
}

/// Reads the instruction at the pc and the method's first byte: at `push rbp`
/// (offset 0) or a `ret` the return address is the top word; one byte past a
/// first `push rbp`, the saved rbp is.
///
/// # Safety
/// `pc` and `start` are readable code bytes (a published block the caller's
/// guard keeps mapped).
pub(crate) unsafe fn leaf_state(pc: usize, start: usize, offset: usize) -> LeafState {
    const PUSH_RBP: u8 = 0x55;
    const RET: u8 = 0xC3;
    // SAFETY: the caller's contract.
    let (at_pc, first) = unsafe { (*(pc as *const u8), *(start as *const u8)) };
    match (offset, at_pc, first) {
        (0, PUSH_RBP, _) | (_, RET, _) => LeafState::AtEntry,
        (1, _, PUSH_RBP) => LeafState::AfterPush,
        _ => LeafState::Settled,
    }
}

/// `call` pushes the return address.
pub(crate) const RETURN_ADDRESS_IN_LINK_REGISTER: bool = false;

/// DWARF register numbers (System V x86-64 psABI).
pub(crate) const DWARF_SP: gimli::Register = gimli::X86_64::RSP;
pub(crate) const DWARF_FP: gimli::Register = gimli::X86_64::RBP;
pub(crate) const DWARF_RA: gimli::Register = gimli::X86_64::RA;
/// How CFI is read: no vendor extensions.
pub(crate) const DWARF_VENDOR: gimli::Vendor = gimli::Vendor::Default;

/// No pointer authentication on x86-64: addresses are used as they are.
#[inline(always)]
pub(crate) fn strip_code_address(addr: usize) -> usize {
    addr
}

/// x86-64 keeps instruction fetch coherent with stores to the same
/// addresses, through either view of a W^X heap: nothing to do.
pub(crate) fn flush_icache(_start: *const u8, _len: usize) {}

/// x86-64 needs no cross-core serialization for code written over freed
/// code: the heap reuses bytes only after a grace period in which every
/// executor left the old code, and a core that later jumps to the new bytes
/// fetches them coherently (Intel SDM 8.1.3: cross-modifying code needs a
/// serializing instruction only while another processor may execute it).
pub(crate) const REUSE_NEEDS_CORE_SYNC: bool = false;

/// `EM_X86_64`.
pub(crate) const ELF_MACHINE: u16 = 62;

/// The time-stamp counter.
#[inline]
pub(crate) fn ticks() -> u64 {
    // SAFETY: `rdtsc` is available on every x86-64 CPU and has no side effects.
    unsafe { core::arch::x86_64::_rdtsc() }
}
