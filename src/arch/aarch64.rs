//! aarch64: `ucontext_t` registers, frame records `[x29, x30]`, the return
//! address in x30 until the prologue saves it, pointer authentication codes
//! in saved return addresses, and explicit instruction-cache maintenance.

use std::sync::atomic::{AtomicU32, Ordering};

use super::{LeafState, Registers};

/// Reads pc, frame pointer (x29), stack pointer and link register (x30) from
/// an aarch64 `ucontext_t`.
///
/// # Safety
/// `context` is the third argument of an `SA_SIGINFO` handler.
pub(crate) unsafe fn registers(context: *mut libc::c_void) -> Registers {
    // SAFETY: the kernel passes a valid ucontext_t (the caller's contract).
    let mc = unsafe { &(*context.cast::<libc::ucontext_t>()).uc_mcontext };
    Registers {
        pc: mc.pc as usize,
        fp: mc.regs[29] as usize,
        sp: mc.sp as usize,
        lr: mc.regs[30] as usize,
    }
}

/// The calling function's pc, and the frame pointer, stack pointer and link
/// register it runs with.
#[inline(always)]
pub(crate) fn current_registers() -> Registers {
    let (pc, fp, sp, lr): (usize, usize, usize, usize);
    // SAFETY: reads four registers; touches no memory and no flags.
    unsafe {
        core::arch::asm!(
            "adr {pc}, .",
            "mov {fp}, x29",
            "mov {sp}, sp",
            "mov {lr}, x30",
            pc = out(reg) pc,
            fp = out(reg) fp,
            sp = out(reg) sp,
            lr = out(reg) lr,
            options(nomem, nostack, preserves_flags)
        )
    };
    Registers { pc, fp, sp, lr }
}

/// `ret`, `retaa`, `retab`.
const RETURNS: [u32; 3] = [0xD65F_03C0, 0xD65F_0BFF, 0xD65F_0FFF];
/// `stp x29, x30, [sp, #-16]!`: the frame record pushed.
const PUSH_FRAME_RECORD: u32 = 0xA9BF_7BFD;
/// `stp x29, x30, [sp, #imm]!` for any `imm` (bits 15-21, a signed count
/// of words): what GCC, Clang and .NET push a whole frame with, the record
/// at its bottom.
const PUSH_FRAME_RECORD_MASK: u32 = 0xFFC0_7FFF;
/// Instructions a prologue may start with that leave x30, x29 and sp as the
/// call left them: `paciasp`, `pacibsp`, `bti c`, `bti j`, `bti jc`.
const ENTRY_HINTS: [u32; 5] = [
    0xD503_233F,
    0xD503_237F,
    0xD503_245F,
    0xD503_249F,
    0xD503_24DF,
];

/// Reads the instruction at the pc and the method's first instructions:
/// before the frame record is pushed (past any `paciasp` or `bti`), or at a
/// return, the return address is in x30; one instruction past
/// `stp x29, x30, [sp, #-frame]!`, the record is at the stack pointer and
/// the caller's stack pointer `frame` bytes above.
///
/// # Safety
/// `pc` and `start` are readable code bytes (a published block the caller's
/// guard keeps mapped), and so are the words from `start` up to the pc.
pub(crate) unsafe fn leaf_state(pc: usize, start: usize, offset: usize) -> LeafState {
    // SAFETY: the caller's contract; instructions are 4-byte aligned in a
    // method whose start is.
    let word = |addr: usize| unsafe { std::ptr::read_unaligned(addr as *const u32) };
    if RETURNS.contains(&word(pc)) {
        return LeafState::AtEntry;
    }
    let mut prologue = 0;
    while prologue < offset && ENTRY_HINTS.contains(&word(start + prologue)) {
        prologue += 4;
    }
    if offset <= prologue {
        LeafState::AtEntry
    } else if let Some(frame) = (offset == prologue + 4)
        .then(|| pushed_frame(word(start + prologue)))
        .flatten()
    {
        LeafState::AfterPush { frame }
    } else {
        LeafState::Settled
    }
}

/// The bytes `stp x29, x30, [sp, #-frame]!` takes, if `word` is one.
fn pushed_frame(word: u32) -> Option<i32> {
    if word & PUSH_FRAME_RECORD_MASK != PUSH_FRAME_RECORD & PUSH_FRAME_RECORD_MASK {
        return None;
    }
    // The signed 7-bit word count.
    let words = (((word >> 15) & 0x7f) as i32) << 25 >> 25;
    (words < 0).then_some(-words * 8)
}

/// `bl` leaves the return address in x30.
pub(crate) const RETURN_ADDRESS_IN_LINK_REGISTER: bool = true;

/// Every return to user space, from an interrupt or a system call, is an
/// exception return (`eret`), which is context synchronizing: any
/// membarrier that interrupts a thread's CPU, or waits for it to pass
/// through the kernel, serializes its instruction stream.
pub(crate) const EXCEPTION_RETURN_SYNCHRONIZES: bool = true;

/// GCC, Clang and .NET push the frame record at the bottom of the frame
/// (`stp x29, x30, [sp, #-80]!; mov x29, sp`), Cranelift at its top: the
/// caller's stack pointer is x29 + 16 only in the latter, so a frame
/// stepped by the convention alone leaves it unknown.
pub(crate) const FRAME_RECORD_AT_TOP: bool = false;

/// DWARF register numbers (the AArch64 DWARF ABI): x29 is the frame pointer,
/// x30 the return address column.
pub(crate) const DWARF_SP: gimli::Register = gimli::AArch64::SP;
pub(crate) const DWARF_FP: gimli::Register = gimli::AArch64::X29;
pub(crate) const DWARF_RA: gimli::Register = gimli::AArch64::X30;
/// How CFI is read: `DW_CFA_AARCH64_negate_ra_state` (0x2d, which `pac-ret` code emits at every
/// `paciasp`) instead of SPARC's `DW_CFA_GNU_window_save`.
pub(crate) const DWARF_VENDOR: gimli::Vendor = gimli::Vendor::AArch64;

/// Bytes in one PLT entry, where [`plt_entry_size`] finds none.
pub(crate) const PLT_ENTRY: u64 = 16;

/// aarch64's PLT entries change neither sp nor x30, and linkers describe
/// them with no CFI expression: there is none to recognise.
pub(crate) fn plt_push_offset(_expression: &[u8]) -> Option<u64> {
    None
}

/// PLT sections whose entries change no register a step reads, with the
/// bytes at their start that do: stepped by the entry rule (CFA = sp, the
/// return address in x30) where no FDE covers them, as linkers write none.
/// `.plt`'s first 32 bytes (PLT0) save x16 and x30 on the stack for the lazy
/// resolver; every later entry is `adrp; ldr; add; br x17`.
pub(crate) const PLT_ENTRY_RULE_SECTIONS: &[(&str, u64)] = &[(".plt", 32)];

/// Bytes of `.plt` before its first entry: PLT0, which calls the lazy
/// resolver.
pub(crate) const PLT_HEADER: u64 = 32;

/// The size of the PLT entries in `entries` (a PLT section's bytes after
/// its header), which linkers do not record (`sh_entsize` is 0): 16 bytes
/// (`adrp; ldr; add; br x17`), or 24 where BTI puts a `bti c` first or
/// `-z pac-plt` an `autia1716` before the branch (GNU ld and lld alike).
/// It is the distance between the first two entries' `adrp x16; ldr x17`,
/// or the whole of a section of one entry. `None` where no entry decodes.
pub(crate) fn plt_entry_size(entries: &[u8]) -> Option<u64> {
    let mut loads = entries
        .chunks_exact(4)
        .zip(entries.chunks_exact(4).skip(1))
        .enumerate()
        .filter(|(_, (adrp, ldr))| {
            let word = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            is_slot_load(word(adrp), word(ldr))
        })
        .map(|(i, _)| i as u64 * 4);
    let first = loads.next()?;
    let size = match loads.next() {
        Some(second) => second - first,
        None => entries.len() as u64,
    };
    (16..=32).contains(&size).then_some(size)
}

/// Whether `adrp` and `ldr` are `adrp x16, page` (op 1, immlo, 10000,
/// immhi, Rd = 16) then `ldr x17, [x16, #imm12 * 8]`: a PLT entry's load of
/// its GOT slot.
fn is_slot_load(adrp: u32, ldr: u32) -> bool {
    adrp & 0x9f00_001f == 0x9000_0010 && ldr & 0xffc0_03ff == 0xf940_0211
}

/// The address of the GOT slot a PLT entry loads its target from: `adrp
/// x16, page` then `ldr x17, [x16, #off]`. `None` for an entry without
/// that pair (the first entry, which calls the resolver).
pub(crate) fn plt_slot(entry: &[u8], entry_addr: u64) -> Option<u64> {
    let word = |i: usize| -> Option<u32> {
        Some(u32::from_le_bytes(
            entry.get(i * 4..i * 4 + 4)?.try_into().ok()?,
        ))
    };
    for i in 0..entry.len() / 4 {
        let (Some(adrp), Some(ldr)) = (word(i), word(i + 1)) else {
            break;
        };
        if is_slot_load(adrp, ldr) {
            let immlo = u64::from((adrp >> 29) & 3);
            let immhi = u64::from((adrp >> 5) & 0x7_ffff);
            // A 21-bit signed page count.
            let pages = (((immhi << 2) | immlo) << 43) as i64 >> 43;
            let pc = entry_addr.wrapping_add(i as u64 * 4);
            let page = (pc & !0xfff).wrapping_add_signed(pages << 12);
            return Some(page.wrapping_add(u64::from((ldr >> 10) & 0xfff) * 8));
        }
    }
    None
}

/// A return address without its pointer authentication code.
///
/// Code built with `-mbranch-protection=pac-ret` (as distributions build
/// everything) signs x30 with `paciasp` before saving it, so return addresses
/// on the stack carry a code in their top bits and name no mapping as they
/// are. `xpaclri` (`hint #7`) clears those bits from x30 with the kernel's
/// own mask; it is in the hint space, so a core without pointer
/// authentication runs it as a no-op, and there the bits are already clear.
/// One instruction, no memory, no system call: safe in a signal handler.
#[inline(always)]
pub(crate) fn strip_code_address(addr: usize) -> usize {
    let stripped: usize;
    // SAFETY: moves a value through x30 (declared clobbered) and strips it;
    // reads and writes no memory.
    unsafe {
        core::arch::asm!(
            "mov x30, {addr}",
            "hint #7",
            "mov {stripped}, x30",
            addr = in(reg) addr,
            stripped = lateout(reg) stripped,
            out("x30") _,
            options(nomem, nostack, preserves_flags)
        )
    };
    stripped
}

/// Makes `len` freshly written bytes at `start` visible to instruction fetch:
/// `__clear_cache` cleans the data cache to the point of unification and
/// invalidates the instruction cache by these virtual addresses, for every
/// core of the inner shareable domain, then waits for both (DSB ISH) and
/// resynchronizes this core (ISB).
pub(crate) fn flush_icache(start: *const u8, len: usize) {
    unsafe extern "C" {
        fn __clear_cache(start: *mut libc::c_char, end: *mut libc::c_char);
    }
    // SAFETY: `[start, start+len)` is committed code memory owned by the
    // caller; the call only maintains caches for that range.
    unsafe { __clear_cache(start.cast_mut().cast(), start.add(len).cast_mut().cast()) };
}

/// A patch of live code is written one aligned 32-bit instruction word at
/// a time ([`store_patch_word`]): each word that holds a changed byte, once.
pub(crate) const PATCH_WORD: usize = 4;

/// Writes one instruction word of a patch with one aligned 32-bit store
/// (`str w`). The architecture lets another core execute an instruction
/// while it is replaced only by such a store, and only between `B`, `BL`,
/// `NOP`, `BRK`, `SVC`, `HVC`, `SMC` and `ISB` (Arm ARM B2.2.5, concurrent
/// modification and execution): retargeting a running `bl`, or turning a
/// `nop` into a `b`, is safe this way; other instructions changed under a
/// running thread are the host's to make safe. The cache maintenance and
/// the cross-core sync follow the patch.
///
/// # Safety
/// `at` is 4-aligned and valid for writes, and no Rust reference to those
/// bytes is alive.
pub(crate) unsafe fn store_patch_word(at: *mut u8, bytes: [u8; PATCH_WORD]) {
    // SAFETY: the caller's contract: aligned and valid for writes;
    // `AtomicU32` has `u32`'s size and alignment.
    let word = unsafe { AtomicU32::from_ptr(at.cast()) };
    // Relaxed: what matters is that the store is one access; the patch's
    // cache maintenance and cross-core sync that follow order it before the
    // executors' next fetches.
    word.store(u32::from_ne_bytes(bytes), Ordering::Relaxed);
}

/// Code published over bytes that held other code makes every other core
/// serialize its instruction stream (membarrier's `SYNC_CORE`) after the cache
/// maintenance. The invalidation reaches every core's instruction cache, but
/// a core may still hold instructions it fetched earlier from the old bytes
/// (a prefetch, a predicted branch): the architecture asks each executing
/// core for a context synchronization event after the maintenance, and
/// `SYNC_CORE` gives every running thread of the process one (an IPI) and
/// every other thread one when it next returns to user space.
pub(crate) const REUSE_NEEDS_CORE_SYNC: bool = true;

/// Fresh bytes, never published before, need the same sync wherever they
/// were executable before their code was written: a core may fetch
/// instructions speculatively from any executable address, so it may hold
/// the bytes that were there (zeros) from before the maintenance, and
/// nothing on the caller's side orders instruction fetch: an Acquire load of
/// the address orders data accesses only, and only a context
/// synchronization event (`ISB`, an exception return) on the executing core
/// discards what it fetched. The heap commits its RWX and W^X views
/// executable ahead of the code written into them, so each of their
/// publishes syncs cores, as wasmtime does after every finalize and Linux
/// does for fresh module text (`kick_all_cpus_sync`). Flip mode's pages are
/// writable and not executable until their publish makes them executable:
/// no core can have fetched from them, and the permission change's own TLB
/// maintenance completes before the block is reachable.
pub(crate) const FRESH_NEEDS_CORE_SYNC: bool = true;

/// `EM_AARCH64`.
pub(crate) const ELF_MACHINE: u16 = 183;

/// The virtual counter, readable at EL0 on Linux.
#[inline]
pub(crate) fn ticks() -> u64 {
    let value: u64;
    // SAFETY: reads a system register Linux lets user space read.
    unsafe { core::arch::asm!("mrs {}, cntvct_el0", out(reg) value, options(nomem, nostack)) };
    value
}

/// The virtual counter's frequency in Hz (`CNTFRQ_EL0`, which firmware
/// sets: 24 or 25 MHz on Ampere Altra and Apple M1, 1 GHz from Armv8.6,
/// 62.5 MHz under qemu), or `None` where it reads 0.
pub(crate) fn tick_rate() -> Option<u64> {
    let value: u64;
    // SAFETY: reads a system register Linux lets user space read.
    unsafe { core::arch::asm!("mrs {}, cntfrq_el0", out(reg) value, options(nomem, nostack)) };
    (value != 0).then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_return_address_is_stripped_to_its_code_address() {
        let addr = a_signed_return_address_is_stripped_to_its_code_address as *const () as usize;
        let signed: usize;
        // SAFETY: `pacia1716` (`hint #8`) signs x17 with key A and x16 as the
        // modifier; registers only.
        unsafe {
            core::arch::asm!(
                "mov x17, {addr}",
                "mov x16, sp",
                "hint #8",
                "mov {signed}, x17",
                addr = in(reg) addr,
                signed = lateout(reg) signed,
                out("x16") _,
                out("x17") _,
                options(nomem, nostack, preserves_flags)
            )
        };
        if signed == addr {
            println!("no pointer authentication on this core: only the identity is checked");
        } else {
            assert_ne!(signed >> 48, addr >> 48, "the code is in the top bits");
        }
        assert_eq!(strip_code_address(signed), addr);
        assert_eq!(strip_code_address(addr), addr);
    }

    #[test]
    fn the_leaf_state_follows_the_prologue_and_the_return() {
        const PACIASP: u32 = 0xD503_233F;
        const MOV_FP_SP: u32 = 0x9100_03FD;
        const NOP: u32 = 0xD503_201F;
        const LDP_FRAME_RECORD: u32 = 0xA8C1_7BFD;
        const RETAA: u32 = 0xD65F_0BFF;
        let signed = [
            PACIASP,
            PUSH_FRAME_RECORD,
            MOV_FP_SP,
            NOP,
            LDP_FRAME_RECORD,
            RETAA,
        ];
        let plain = [
            PUSH_FRAME_RECORD,
            MOV_FP_SP,
            NOP,
            LDP_FRAME_RECORD,
            RETURNS[0],
        ];
        let frameless = [NOP, NOP, RETURNS[0]];
        let states = |code: &[u32]| -> Vec<LeafState> {
            let start = code.as_ptr() as usize;
            (0..code.len())
                // SAFETY: every word read is inside `code`.
                .map(|i| unsafe { leaf_state(start + 4 * i, start, 4 * i) })
                .collect()
        };
        use LeafState::{AtEntry, Settled};
        let pushed = |frame| LeafState::AfterPush { frame };
        assert_eq!(
            states(&signed),
            [AtEntry, AtEntry, pushed(16), Settled, Settled, AtEntry]
        );
        assert_eq!(
            states(&plain),
            [AtEntry, pushed(16), Settled, Settled, AtEntry]
        );
        assert_eq!(states(&frameless), [AtEntry, Settled, AtEntry]);
        // Issue 67, item 3: GCC's frames of 32 and 80 bytes, record at the
        // bottom, were taken as settled just after their push.
        for (push, frame) in [(0xA9BE_7BFD, 32), (0xA9BB_7BFD, 80)] {
            assert_eq!(
                states(&[push, MOV_FP_SP, NOP, RETURNS[0]]),
                [AtEntry, pushed(frame), Settled, AtEntry]
            );
        }
        // A store that is not a pre-indexed push: settled.
        const STP_NO_WRITEBACK: u32 = 0xA93E_7BFD;
        assert_eq!(
            states(&[STP_NO_WRITEBACK, NOP, RETURNS[0]]),
            [AtEntry, Settled, AtEntry]
        );
    }
}
