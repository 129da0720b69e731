//! x86-64: `ucontext_t` registers, the `push rbp` prologue, return addresses
//! on the stack, no pointer authentication, coherent instruction fetch.

use std::sync::atomic::{AtomicU64, Ordering};

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
        (1, _, PUSH_RBP) => LeafState::AfterPush { frame: 16 },
        _ => LeafState::Settled,
    }
}

/// `call` pushes the return address.
pub(crate) const RETURN_ADDRESS_IN_LINK_REGISTER: bool = false;

/// A return to user space by `sysret` (from a system call) is not
/// serializing, unlike `iret`: only membarrier's `SYNC_CORE` serializes
/// every thread.
pub(crate) const EXCEPTION_RETURN_SYNCHRONIZES: bool = false;

/// `push rbp; mov rbp, rsp` puts the frame record at the top of every
/// frame: the caller's stack pointer is always rbp + 16.
pub(crate) const FRAME_RECORD_AT_TOP: bool = true;

/// DWARF register numbers (System V x86-64 psABI).
pub(crate) const DWARF_SP: gimli::Register = gimli::X86_64::RSP;
pub(crate) const DWARF_FP: gimli::Register = gimli::X86_64::RBP;
pub(crate) const DWARF_RA: gimli::Register = gimli::X86_64::RA;
/// How CFI is read: no vendor extensions.
pub(crate) const DWARF_VENDOR: gimli::Vendor = gimli::Vendor::Default;

/// Bytes in one PLT entry (`.plt`, `.plt.sec`; `.plt.got` says its own in
/// `sh_entsize`).
pub(crate) const PLT_ENTRY: u64 = 16;

/// Bytes of `.plt` before its first entry: PLT0, which pushes the link map
/// and jumps to the lazy resolver.
pub(crate) const PLT_HEADER: u64 = 16;

/// x86-64's PLT sections record their entry size (`sh_entsize`, 16): no
/// entry is measured.
pub(crate) fn plt_entry_size(_entries: &[u8]) -> Option<u64> {
    None
}

/// The lazy-binding PLT's CFA, if `expression` is the one GNU ld writes for
/// `.plt`: CFA = rsp + 8 while `(rip & 15)` is below the returned offset,
/// rsp + 16 from it to the entry's end (past the entry's `push` of its
/// relocation index). That is: `DW_OP_breg7 (rsp) 8; DW_OP_breg16 (rip) 0;
/// DW_OP_lit15; DW_OP_and; DW_OP_lit<k>; DW_OP_ge; DW_OP_lit3; DW_OP_shl;
/// DW_OP_plus`, with k = 11 for the classic entry and 9 for the one that
/// starts with `endbr64`. Any other expression is not a PLT's.
pub(crate) fn plt_push_offset(expression: &[u8]) -> Option<u64> {
    match *expression {
        [
            0x77,
            0x08,
            0x80,
            0x00,
            0x3f,
            0x1a,
            lit @ 0x31..=0x3f,
            0x2a,
            0x33,
            0x24,
            0x22,
        ] => Some(u64::from(lit - 0x30)),
        _ => None,
    }
}

/// PLT sections whose entries change no register a step reads, with the
/// bytes at their start that do: stepped by the entry rule where no FDE
/// covers them. `.plt.sec` and `.plt.got` entries only jump through their
/// slot; the lazy `.plt` pushes, and GNU ld describes it with an
/// expression (above).
pub(crate) const PLT_ENTRY_RULE_SECTIONS: &[(&str, u64)] = &[(".plt.sec", 0), (".plt.got", 0)];

/// The address of the GOT slot a PLT entry jumps through: its `jmp
/// *disp32(%rip)` (`ff 25`, after an `endbr64` or a `bnd` prefix in the
/// IBT forms). `None` for an entry without one (the lazy `.plt`'s first
/// entry, or its push stubs where `.plt.sec` holds the jumps).
pub(crate) fn plt_slot(entry: &[u8], entry_addr: u64) -> Option<u64> {
    let at = entry.windows(2).position(|w| w == [0xff, 0x25])?;
    let disp = i32::from_le_bytes(entry.get(at + 2..at + 6)?.try_into().ok()?);
    Some(
        entry_addr
            .wrapping_add(at as u64 + 6)
            .wrapping_add_signed(i64::from(disp)),
    )
}

/// No pointer authentication on x86-64: addresses are used as they are.
#[inline(always)]
pub(crate) fn strip_code_address(addr: usize) -> usize {
    addr
}

/// x86-64 keeps instruction fetch coherent with stores to the same
/// addresses, through either view of a W^X heap: nothing to do.
pub(crate) fn flush_icache(_start: *const u8, _len: usize) {}

/// A patch of live code is written one aligned 8-byte word at a time
/// ([`store_patch_word`]): each word that holds a changed byte, once.
pub(crate) const PATCH_WORD: usize = 8;

/// Writes one word of a patch with one aligned 8-byte store (a `mov`). An
/// aligned 8-byte access is single-copy atomic for data and never crosses
/// a cache line (Intel SDM vol. 3, "Guaranteed Atomic Operations"). For a
/// processor executing the bytes meanwhile, the SDM asks for the
/// cross-modifying-code protocol ("Handling Self- and Cross-Modifying
/// Code"), which the cross-core sync after the patch provides; before it,
/// a running thread fetches the old word or the new one in practice on
/// x86-64 implementations (what HotSpot's and V8's call patching rely on),
/// and `tests/patch_live.rs` saw no mix in 10^6 patches under a caller
/// (11,164 with byte copies). A patch whose changed bytes span two words
/// is two stores, in ascending order: an instruction across the boundary
/// can be fetched half old, half new, and such a patch is the host's to
/// make safe (first a jump over it, for example).
///
/// # Safety
/// `at` is 8-aligned and valid for writes, and no Rust reference to those
/// bytes is alive.
pub(crate) unsafe fn store_patch_word(at: *mut u8, bytes: [u8; PATCH_WORD]) {
    // SAFETY: the caller's contract: aligned and valid for writes;
    // `AtomicU64` has `u64`'s size and alignment.
    let word = unsafe { AtomicU64::from_ptr(at.cast()) };
    // Relaxed: what matters is that the store is one access; the patch's
    // instruction-cache maintenance and cross-core sync that follow order
    // it before the executors' next fetches.
    word.store(u64::from_ne_bytes(bytes), Ordering::Relaxed);
}

/// x86-64 needs no cross-core serialization for code written over freed
/// code: the heap reuses bytes only after a grace period in which every
/// executor left the old code, and a core that later jumps to the new bytes
/// fetches them coherently (Intel SDM vol. 3, "Handling Self- and Cross-Modifying Code": it needs a
/// serializing instruction only while another processor may execute it).
pub(crate) const REUSE_NEEDS_CORE_SYNC: bool = false;

/// Nor for fresh bytes: no processor executes them before their publish,
/// which is when the SDM's cross-modifying rule would apply, and a store to
/// code invalidates what a processor prefetched from it (the SDM's
/// "Self-Modifying Code").
pub(crate) const FRESH_NEEDS_CORE_SYNC: bool = false;

/// `EM_X86_64`.
pub(crate) const ELF_MACHINE: u16 = 62;

/// The time-stamp counter.
#[inline]
pub(crate) fn ticks() -> u64 {
    // SAFETY: `rdtsc` is available on every x86-64 CPU and has no side effects.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// The time-stamp counter's frequency: not something the architecture
/// reports everywhere (CPUID leaf 0x15 is often empty under hypervisors),
/// so the collector measures it against the monotonic clock.
pub(crate) fn tick_rate() -> Option<u64> {
    None
}
