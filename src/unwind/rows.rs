//! A JIT method's rules as [`UnwindRow`]s: its `.eh_frame` is evaluated
//! once, when the method is published, into rows by code offset, kept in its
//! code header. The agent's handler binary-searches them, and so does the
//! eBPF profiler's kernel-side walk, which cannot evaluate DWARF (it finds
//! them through the descriptor).

use super::eh_frame::evaluate;
use super::rule::{Base, Ra, Saved};
use super::{Rule, StackEnd};

/// One row of a method's unwind rules, for readers in other processes (the
/// eBPF profiler's kernel-side walk), which find a method's rows through its
/// code header (`jitmap::remote::Descriptor::header_rows_ptr` and `header_rows_len`).
/// The rows are sorted by `offset`; each applies from its offset to the next
/// row's, the last to the end of the code. They are the method's
/// `.eh_frame` ([`CodeInfo::eh_frame`](crate::CodeInfo)) evaluated when it is
/// published, in the one form a step applies: the canonical frame address
/// (CFA) as a register plus an offset, and where the return address and the
/// caller's frame pointer were saved relative to it.
///
/// ```
/// use jitmap::unwind::UnwindRow;
/// // After `push rbp; mov rbp, rsp`: CFA = rbp + 16, the return address
/// // at CFA - 8, the caller's rbp at CFA - 16.
/// let row = UnwindRow {
///     offset: 4,
///     cfa: 16,
///     ra: -8,
///     fp: -16,
///     kind: UnwindRow::RULE,
///     base: UnwindRow::BASE_FP,
///     fp_rule: UnwindRow::FP_AT,
///     has_ra: 1,
/// };
/// assert_eq!(std::mem::size_of_val(&row), 16);
/// ```
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindRow {
    /// Code offset where the row starts to apply.
    pub offset: u32,
    /// CFA = the `base` register + this.
    pub cfa: i32,
    /// The return address is the word at CFA + this (if `has_ra` is
    /// [`UnwindRow::RA_AT`]).
    pub ra: i16,
    /// The caller's frame pointer is the word at CFA + this (if `fp_rule` is
    /// [`UnwindRow::FP_AT`]).
    pub fp: i16,
    /// [`UnwindRow::NONE`], [`UnwindRow::RULE`] or [`UnwindRow::UNSUPPORTED`].
    pub kind: u8,
    /// [`UnwindRow::BASE_SP`] or [`UnwindRow::BASE_FP`].
    pub base: u8,
    /// [`UnwindRow::FP_SAME`], [`UnwindRow::FP_AT`] or [`UnwindRow::FP_LOST`].
    pub fp_rule: u8,
    /// Where the return address is: [`UnwindRow::RA_AT`] (the word at
    /// CFA + `ra`), [`UnwindRow::RA_LINK`] (still in the link register,
    /// aarch64's x30: only in the interrupted frame) or
    /// [`UnwindRow::RA_NONE`] (the outermost frame).
    pub has_ra: u8,
}

impl UnwindRow {
    /// No rule here (no FDE covers these bytes): step by the frame-pointer
    /// convention, as without rows.
    pub const NONE: u8 = 0;
    /// A rule: step by it.
    pub const RULE: u8 = 1;
    /// CFI that cannot be reduced to a rule (a DWARF expression, an offset
    /// out of range): the walk ends here.
    pub const UNSUPPORTED: u8 = 2;
    /// The CFA is computed from the stack pointer.
    pub const BASE_SP: u8 = 0;
    /// The CFA is computed from the frame pointer.
    pub const BASE_FP: u8 = 1;
    /// The frame pointer still holds the caller's.
    pub const FP_SAME: u8 = 0;
    /// The caller's frame pointer is saved at CFA + `fp`.
    pub const FP_AT: u8 = 1;
    /// The caller's frame pointer cannot be recovered.
    pub const FP_LOST: u8 = 2;
    /// No return address: the outermost frame.
    pub const RA_NONE: u8 = 0;
    /// The return address is the word at CFA + `ra`.
    pub const RA_AT: u8 = 1;
    /// The return address is still in the link register (aarch64's x30):
    /// a leaf, or a prologue before it saves its frame record. Never on
    /// x86-64.
    pub const RA_LINK: u8 = 2;
}

/// The rule at code offset `offset` of a method with `rows`: `None` where no
/// row gives one (no rows, before the first, or a gap between FDEs), and the
/// frame steps by the frame-pointer convention.
pub(crate) fn rule_at(rows: &[UnwindRow], offset: usize) -> Option<Result<Rule, StackEnd>> {
    let i = rows.partition_point(|r| r.offset as usize <= offset);
    let row = rows.get(i.checked_sub(1)?)?;
    match row.kind {
        UnwindRow::RULE => Some(Ok(Rule {
            base: if row.base == UnwindRow::BASE_FP {
                Base::Fp
            } else {
                Base::Sp
            },
            offset: row.cfa,
            ra: match row.has_ra {
                UnwindRow::RA_AT => Ra::At(i32::from(row.ra)),
                UnwindRow::RA_LINK => Ra::Link,
                _ => Ra::Undefined,
            },
            fp: match row.fp_rule {
                UnwindRow::FP_SAME => Saved::Same,
                UnwindRow::FP_AT => Saved::At(i32::from(row.fp)),
                _ => Saved::Lost,
            },
        })),
        UnwindRow::NONE => None,
        _ => Some(Err(StackEnd::Unsupported)),
    }
}

/// The rows of `frame`, a method's `.eh_frame` (built for its code's
/// address), for its code of `size` bytes at `start`: those of FDEs inside
/// the code, by offset from `start`. Empty when no FDE covers the code (the
/// method then steps by the frame-pointer convention).
pub(crate) fn rows(frame: &[u8], start: usize, size: u64) -> Box<[UnwindRow]> {
    let end = start.saturating_add(size as usize);
    let mut out: Vec<UnwindRow> = evaluate(frame, frame.as_ptr() as usize)
        .into_iter()
        .filter(|r| (start..end).contains(&r.addr))
        .map(|r| row((r.addr - start) as u32, r.rule))
        .collect();
    // Rows that differ only in what the conversion drops merge.
    out.dedup_by(|next, prev| {
        UnwindRow {
            offset: prev.offset,
            ..*next
        } == *prev
    });
    out.into_boxed_slice()
}

/// The rows of a loaded object's `.eh_frame`, for an unwinder outside the
/// process (the eBPF profiler's walk of native frames): `frame` is the
/// section's bytes and `frame_addr` its address in the object (its
/// `sh_addr`, before the load bias). Each row's `offset` is the address in
/// the object where it starts to apply, so a frame's row is found at its pc
/// minus the object's load bias. Between and after functions the rows say
/// [`UnwindRow::NONE`] (step by the frame-pointer convention); CFI this
/// form cannot express says [`UnwindRow::UNSUPPORTED`].
///
/// `None` when a row's address is past 4 GiB, which an offset cannot
/// hold (an object linked that high; position-independent ones start at 0).
///
/// ```
/// use jitmap::unwind::{UnwindRow, object_rows};
/// // No FDEs: no rows.
/// assert_eq!(object_rows(&[], 0x1000).as_deref(), Some(&[][..]));
/// # let _ = UnwindRow::NONE;
/// ```
pub fn object_rows(frame: &[u8], frame_addr: u64) -> Option<Box<[UnwindRow]>> {
    let frame_addr = usize::try_from(frame_addr).ok()?;
    evaluate(frame, frame_addr)
        .into_iter()
        .map(|r| Some(row(u32::try_from(r.addr).ok()?, r.rule)))
        .collect()
}

/// `frame`, a method's `.eh_frame` built for its code at `from`, for the
/// same code moved to `to`: every FDE's start (its only address, for the
/// simple FDEs a JIT writes) shifted by the move. `None` when an FDE's start
/// is not an absolute address (pc-relative, indirect): such a frame cannot
/// follow the code, and the move is refused. Bytes past the last entry that
/// parses name no address this could know of, and stay as they are.
pub(crate) fn relocate(frame: &[u8], from: usize, to: usize) -> Option<Box<[u8]>> {
    use gimli::{BaseAddresses, CieOrFde, EhFrame, LittleEndian, UnwindSection, constants};
    let section = EhFrame::new(frame, LittleEndian);
    let bases = BaseAddresses::default().set_eh_frame(frame.as_ptr() as u64);
    let mut out = frame.to_vec();
    let mut entries = section.entries(&bases);
    while let Ok(Some(entry)) = entries.next() {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let Ok(fde) = partial.parse(|s, b, o| s.cie_from_offset(b, o)) else {
            break;
        };
        let offset = fde.offset();
        // The initial length (4 bytes, or 0xffffffff and 8 more), then the
        // CIE pointer (4 or 8 bytes), then the start.
        let length = u32::from_le_bytes(frame.get(offset..offset + 4)?.try_into().ok()?);
        let at = if length == u32::MAX {
            offset + 20
        } else {
            offset + 8
        };
        let encoding = fde
            .cie()
            .fde_address_encoding()
            .unwrap_or(constants::DW_EH_PE_absptr);
        if encoding.0 & 0xF0 != 0 {
            return None; // relative to something, or indirect
        }
        let width = match encoding.0 & 0x0F {
            0x00 | 0x04 | 0x0C => 8, // absptr, udata8, sdata8
            0x03 | 0x0B => 4,        // udata4, sdata4
            _ => return None,
        };
        let field = out.get_mut(at..at + width)?;
        let mut bytes = [0u8; 8];
        bytes[..width].copy_from_slice(field);
        let start = u64::from_le_bytes(bytes);
        if start != fde.initial_address() {
            return None;
        }
        let moved = start.wrapping_sub(from as u64).wrapping_add(to as u64);
        if width == 4 && u32::try_from(moved).is_err() {
            return None;
        }
        field.copy_from_slice(&moved.to_le_bytes()[..width]);
    }
    Some(out.into_boxed_slice())
}

/// The row at `offset` for `rule`.
fn row(offset: u32, rule: Result<Rule, StackEnd>) -> UnwindRow {
    let unsupported = UnwindRow {
        offset,
        kind: UnwindRow::UNSUPPORTED,
        ..UnwindRow::default()
    };
    let rule = match rule {
        Ok(rule) => rule,
        Err(StackEnd::NoUnwindInfo) => {
            return UnwindRow {
                offset,
                kind: UnwindRow::NONE,
                ..UnwindRow::default()
            };
        }
        Err(_) => return unsupported,
    };
    let (fp_rule, fp) = match rule.fp {
        Saved::Same => (UnwindRow::FP_SAME, Some(0)),
        Saved::At(n) => (UnwindRow::FP_AT, i16::try_from(n).ok()),
        Saved::Lost => (UnwindRow::FP_LOST, Some(0)),
    };
    let (has_ra, ra) = match rule.ra {
        Ra::At(n) => (UnwindRow::RA_AT, i16::try_from(n).ok()),
        Ra::Link => (UnwindRow::RA_LINK, Some(0)),
        Ra::Undefined => (UnwindRow::RA_NONE, Some(0)),
    };
    let (Some(fp), Some(ra)) = (fp, ra) else {
        // A saved word farther than 32 KiB from the CFA.
        return unsupported;
    };
    UnwindRow {
        offset,
        cfa: rule.offset,
        ra,
        fp,
        kind: UnwindRow::RULE,
        base: match rule.base {
            Base::Sp => UnwindRow::BASE_SP,
            Base::Fp => UnwindRow::BASE_FP,
        },
        fp_rule,
        has_ra,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An `.eh_frame` with one CIE (FDE starts encoded as `pointer`) and one
    /// FDE for 32 bytes at `start`.
    fn frame(start: u64, pointer: gimli::DwEhPe) -> Vec<u8> {
        frame_of(start, 32, pointer)
    }

    /// The same with an FDE of `len` bytes.
    fn frame_of(start: u64, len: u32, pointer: gimli::DwEhPe) -> Vec<u8> {
        use gimli::write::CallFrameInstruction;
        let rows: &[(u32, CallFrameInstruction)] = if len >= 4 {
            &[(4, CallFrameInstruction::CfaOffset(16))]
        } else {
            &[]
        };
        frame_with(start, len, pointer, &[], rows)
    }

    /// A CIE (CFA = sp+8, return address at CFA-8, then `cie`; this
    /// architecture's register numbers) and one FDE
    /// of `len` bytes at `start` with `fde`'s instructions at their offsets.
    fn frame_with(
        start: u64,
        len: u32,
        pointer: gimli::DwEhPe,
        cie: &[gimli::write::CallFrameInstruction],
        fde: &[(u32, gimli::write::CallFrameInstruction)],
    ) -> Vec<u8> {
        frame_aligned(1, start, len, pointer, cie, fde)
    }

    /// [`frame_with`] with a code alignment factor of `factor` (aarch64's
    /// compilers write 4): the FDE's advances count units of it.
    fn frame_aligned(
        factor: u8,
        start: u64,
        len: u32,
        pointer: gimli::DwEhPe,
        cie: &[gimli::write::CallFrameInstruction],
        fde: &[(u32, gimli::write::CallFrameInstruction)],
    ) -> Vec<u8> {
        use gimli::write::{
            Address, CallFrameInstruction, CommonInformationEntry, EhFrame, EndianVec,
            FrameDescriptionEntry, FrameTable,
        };
        let encoding = gimli::Encoding {
            format: gimli::Format::Dwarf32,
            version: 1,
            address_size: 8,
        };
        let mut c = CommonInformationEntry::new(encoding, factor, -8, crate::arch::DWARF_RA);
        c.fde_address_encoding = pointer;
        c.add_instruction(CallFrameInstruction::Cfa(crate::arch::DWARF_SP, 8));
        c.add_instruction(CallFrameInstruction::Offset(crate::arch::DWARF_RA, -8));
        for i in cie {
            c.add_instruction(i.clone());
        }
        let mut table = FrameTable::default();
        let c = table.add_cie(c);
        let mut f = FrameDescriptionEntry::new(Address::Constant(start), len);
        for (offset, i) in fde {
            f.add_instruction(*offset, i.clone());
        }
        table.add_fde(c, f);
        let mut section = EhFrame(EndianVec::new(gimli::RunTimeEndian::Little));
        table.write_eh_frame(&mut section).unwrap();
        section.0.into_vec()
    }

    /// Found by the `eh_frame_rows` fuzz target: an FDE of no bytes gave a
    /// row at its start with no end, so its CIE's rule covered the rest of
    /// the method, where gimli finds no FDE; so did a row of no bytes at an
    /// FDE's end.
    #[test]
    fn an_empty_fde_gives_no_rows() {
        let frame = frame_of(0x1000, 0, gimli::DW_EH_PE_udata8);
        assert_eq!(&*rows(&frame, 0x1000, 64), []);
        // One byte long: its rule, then none.
        let frame = frame_of(0x1000, 1, gimli::DW_EH_PE_udata8);
        let kinds: Vec<(u32, u8)> = rows(&frame, 0x1000, 64)
            .iter()
            .map(|r| (r.offset, r.kind))
            .collect();
        assert_eq!(kinds, [(0, UnwindRow::RULE), (1, UnwindRow::NONE)]);
        // An instruction at its very end makes a row of no bytes: none.
        let frame = frame_of(0x1000, 4, gimli::DW_EH_PE_udata8);
        let kinds: Vec<(u32, u8)> = rows(&frame, 0x1000, 64)
            .iter()
            .map(|r| (r.offset, r.kind))
            .collect();
        assert_eq!(kinds, [(0, UnwindRow::RULE), (4, UnwindRow::NONE)]);
    }

    /// Found by the `eh_frame_rows` fuzz target: CFI gimli cannot evaluate
    /// (a state restored that was never remembered) gave no rows, and the
    /// walk guessed by frame pointers where it must end.
    #[test]
    fn cfi_that_cannot_be_evaluated_ends_the_walk() {
        use gimli::write::CallFrameInstruction::RestoreState;
        let udata8 = gimli::DW_EH_PE_udata8;
        let build = |in_cie: bool, at: u32| {
            if in_cie {
                frame_with(0x1000, 32, udata8, &[RestoreState], &[])
            } else {
                frame_with(0x1000, 32, udata8, &[], &[(at, RestoreState)])
            }
        };
        let kinds = |frame: &[u8]| -> Vec<(u32, u8)> {
            rows(frame, 0x1000, 64)
                .iter()
                .map(|r| (r.offset, r.kind))
                .collect()
        };
        // Failing in the CIE: no row of the FDE can be evaluated.
        assert_eq!(
            kinds(&build(true, 0)),
            [(0, UnwindRow::UNSUPPORTED), (32, UnwindRow::NONE)]
        );
        // Failing 8 bytes in: the rule before, then the end of the walk.
        assert_eq!(
            kinds(&build(false, 8)),
            [
                (0, UnwindRow::RULE),
                (8, UnwindRow::UNSUPPORTED),
                (32, UnwindRow::NONE)
            ]
        );
        // Failing at its very end: no byte is left to end the walk in.
        assert_eq!(
            kinds(&build(false, 32)),
            [(0, UnwindRow::RULE), (32, UnwindRow::NONE)]
        );
    }

    /// Issue 67, item 4: gimli keeps no entry for a `DW_CFA_undefined` column, so on
    /// aarch64 the explicit `.cfi_undefined x30` of `_start` and glibc's
    /// `thread_start` read as "the return address is still in x30": every
    /// complete stack ended `unsupported`, not `root`. It is the outermost
    /// frame, through restores and remembered states, from the CIE too.
    #[test]
    fn an_undefined_return_address_is_the_outermost_frame() {
        use gimli::write::CallFrameInstruction::{
            Offset, RememberState, Restore, RestoreState, Undefined,
        };
        let ra = crate::arch::DWARF_RA;
        let udata8 = gimli::DW_EH_PE_udata8;
        let ras = |frame: &[u8]| -> Vec<(u32, u8)> {
            rows(frame, 0x1000, 64)
                .iter()
                .filter(|r| r.kind == UnwindRow::RULE)
                .map(|r| (r.offset, r.has_ra))
                .collect()
        };
        let (at, none) = (UnwindRow::RA_AT, UnwindRow::RA_NONE);
        // With advances of bytes, and of 4-byte units.
        for factor in [1, 4] {
            let in_fde = frame_aligned(
                factor,
                0x1000,
                32,
                udata8,
                &[],
                &[
                    (4, Undefined(ra)),
                    (8, Restore(ra)),
                    (12, RememberState),
                    (12, Undefined(ra)),
                    (16, RestoreState),
                ],
            );
            assert_eq!(
                ras(&in_fde),
                [(0, at), (4, none), (8, at), (12, none), (16, at)],
                "{factor}"
            );
        }
        let in_cie = frame_with(
            0x1000,
            32,
            udata8,
            &[Undefined(ra)],
            &[(4, Offset(ra, -16)), (8, Restore(ra))],
        );
        assert_eq!(ras(&in_cie), [(0, none), (4, at), (8, none)]);
    }

    /// The lazy PLT's CFA expression (x86-64): rows alternate, per 16-byte
    /// entry, between CFA = sp + 8 and sp + 16 from the entry's byte 11,
    /// starting mid-entry where the FDE does. Another expression, and every
    /// expression on aarch64, ends the walk.
    #[test]
    fn the_plt_expression_becomes_rows_per_entry() {
        use gimli::write::{CallFrameInstruction::CfaExpression, Expression};
        let plt = |k: u8| {
            Expression::raw(vec![
                0x77,
                0x08,
                0x80,
                0x00,
                0x3f,
                0x1a,
                0x30 + k,
                0x2a,
                0x33,
                0x24,
                0x22,
            ])
        };
        let udata8 = gimli::DW_EH_PE_udata8;
        let cfas = |frame: &[u8]| -> Vec<(u32, u8, i32)> {
            rows(frame, 0x1000, 0x40)
                .iter()
                .map(|r| (r.offset, r.kind, r.cfa))
                .collect()
        };
        let frame = frame_with(0x1008, 0x28, udata8, &[], &[(0, CfaExpression(plt(11)))]);
        let (rule, none) = (UnwindRow::RULE, UnwindRow::NONE);
        if cfg!(target_arch = "x86_64") {
            assert_eq!(
                cfas(&frame),
                [
                    (0x08, rule, 8),
                    (0x0b, rule, 16),
                    (0x10, rule, 8),
                    (0x1b, rule, 16),
                    (0x20, rule, 8),
                    (0x2b, rule, 16),
                    (0x30, none, 0),
                ]
            );
            // Starting past the push: sp + 16 first.
            let frame = frame_with(0x100c, 0x8, udata8, &[], &[(0, CfaExpression(plt(9)))]);
            assert_eq!(
                cfas(&frame),
                [(0x0c, rule, 16), (0x10, rule, 8), (0x14, none, 0)]
            );
        } else {
            assert_eq!(
                cfas(&frame),
                [(0x08, UnwindRow::UNSUPPORTED, 0), (0x30, none, 0)]
            );
        }
        // At the top of the address space: the entries stop where the
        // addresses do (found by reading: the step past the last entry
        // overflowed).
        let top = 0xffff_ffff_ffff_ffe0u64;
        let frame = frame_with(top, 0x1f, udata8, &[], &[(0, CfaExpression(plt(11)))]);
        let got: Vec<(usize, Result<i32, StackEnd>)> =
            super::super::eh_frame::evaluate(&frame, frame.as_ptr() as usize)
                .into_iter()
                .map(|r| (r.addr, r.rule.map(|rule| rule.offset)))
                .collect();
        let top = top as usize;
        if cfg!(target_arch = "x86_64") {
            assert_eq!(
                got,
                [
                    (top, Ok(8)),
                    (top + 0x0b, Ok(16)),
                    (top + 0x10, Ok(8)),
                    (top + 0x1b, Ok(16)),
                    (top + 0x1f, Err(StackEnd::NoUnwindInfo)),
                ]
            );
        } else {
            assert_eq!(
                got,
                [
                    (top, Err(StackEnd::Unsupported)),
                    (top + 0x1f, Err(StackEnd::NoUnwindInfo)),
                ]
            );
        }
        // Any other expression (here `DW_OP_breg7 8` alone) ends the walk.
        let other = Expression::raw(vec![0x77, 0x08]);
        let frame = frame_with(0x1000, 0x10, udata8, &[], &[(0, CfaExpression(other))]);
        assert_eq!(
            cfas(&frame),
            [(0, UnwindRow::UNSUPPORTED, 0), (0x10, none, 0)]
        );
    }

    #[test]
    fn a_frame_moves_with_its_code_or_is_refused() {
        let (from, to) = (0x7f00_1000_0000usize, 0x7f00_2000_0040usize);
        for pointer in [gimli::DW_EH_PE_absptr, gimli::DW_EH_PE_udata8] {
            let old = frame(from as u64, pointer);
            let moved = relocate(&old, from, to).unwrap();
            // Exactly what a frame built for the new address holds.
            assert_eq!(&*moved, &frame(to as u64, pointer)[..], "{pointer:?}");
            // And it evaluates to the same rows at the new address.
            assert_eq!(rows(&moved, to, 32), rows(&old, from, 32));
            assert_eq!(rows(&moved, to, 32).len(), 2);
        }
        // 4-byte starts move while the new start fits.
        let old = frame(0x1000, gimli::DW_EH_PE_udata4);
        assert_eq!(
            &*relocate(&old, 0x1000, 0x2000).unwrap(),
            &frame(0x2000, gimli::DW_EH_PE_udata4)[..]
        );
        assert_eq!(relocate(&old, 0x1000, 1 << 40), None);
        // A pc-relative start is not the code's address: refused.
        let relative = gimli::DwEhPe(gimli::DW_EH_PE_pcrel.0 | gimli::DW_EH_PE_sdata4.0);
        assert_eq!(relocate(&frame(0x1000, relative), 0x1000, 0x2000), None);
        // Not a frame: no address to move, the bytes stay.
        assert_eq!(
            relocate(&[0xff; 12], 0x1000, 0x2000).as_deref(),
            Some(&[0xff; 12][..])
        );
    }

    #[test]
    fn a_rule_survives_its_row_and_offsets_find_their_row() {
        let rules = [
            (0, Ok(Rule::AT_ENTRY)),
            (1, Ok(Rule::after_push(16))),
            (4, Ok(Rule::FRAME_POINTER)),
            (17, Err(StackEnd::NoUnwindInfo)),
            (20, Err(StackEnd::Unsupported)),
        ];
        let rows: Vec<UnwindRow> = rules.iter().map(|&(at, rule)| row(at, rule)).collect();
        let expect = |offset| match offset {
            0 => Some(Ok(Rule::AT_ENTRY)),
            1..=3 => Some(Ok(Rule::after_push(16))),
            4..=16 => Some(Ok(Rule::FRAME_POINTER)),
            17..=19 => None,
            _ => Some(Err(StackEnd::Unsupported)),
        };
        for offset in 0..40 {
            assert_eq!(rule_at(&rows, offset), expect(offset), "{offset}");
        }
        // Before the first row, and without rows: no rule.
        assert_eq!(rule_at(&rows[2..], 3), None);
        assert_eq!(rule_at(&[], 3), None);
    }

    #[test]
    fn each_rule_becomes_its_row() {
        assert_eq!(
            row(4, Ok(Rule::FRAME_POINTER)),
            UnwindRow {
                offset: 4,
                cfa: 16,
                ra: -8,
                fp: -16,
                kind: UnwindRow::RULE,
                base: UnwindRow::BASE_FP,
                fp_rule: UnwindRow::FP_AT,
                has_ra: 1,
            }
        );
        let outermost = Rule {
            base: Base::Sp,
            offset: 8,
            ra: Ra::Undefined,
            fp: Saved::Lost,
        };
        assert_eq!(
            row(0, Ok(outermost)),
            UnwindRow {
                offset: 0,
                cfa: 8,
                kind: UnwindRow::RULE,
                base: UnwindRow::BASE_SP,
                fp_rule: UnwindRow::FP_LOST,
                ..UnwindRow::default()
            }
        );
        let link = Rule {
            base: Base::Sp,
            offset: 0,
            ra: Ra::Link,
            fp: Saved::Same,
        };
        let link_row = UnwindRow {
            offset: 3,
            kind: UnwindRow::RULE,
            has_ra: UnwindRow::RA_LINK,
            ..UnwindRow::default()
        };
        assert_eq!(row(3, Ok(link)), link_row);
        assert_eq!(rule_at(&[link_row], 3), Some(Ok(link)));
        assert_eq!(row(9, Err(StackEnd::NoUnwindInfo)).kind, UnwindRow::NONE);
        assert_eq!(
            row(9, Err(StackEnd::Unsupported)).kind,
            UnwindRow::UNSUPPORTED
        );
        let far = Rule {
            fp: Saved::At(-40_000),
            ..Rule::FRAME_POINTER
        };
        assert_eq!(
            row(2, Ok(far)),
            UnwindRow {
                offset: 2,
                kind: UnwindRow::UNSUPPORTED,
                ..UnwindRow::default()
            }
        );
    }

    /// An object's rows keep its addresses: absolute FDE starts as they
    /// are, pc-relative ones from where the section is in the object.
    #[test]
    fn an_objects_rows_are_at_its_addresses() {
        let rule = |offset: u32, cfa: i32| UnwindRow {
            offset,
            cfa,
            ra: -8,
            kind: UnwindRow::RULE,
            base: UnwindRow::BASE_SP,
            has_ra: 1,
            ..UnwindRow::default()
        };
        let end = |offset: u32| UnwindRow {
            offset,
            kind: UnwindRow::NONE,
            ..UnwindRow::default()
        };
        let absolute = frame(0x1000, gimli::DW_EH_PE_udata8);
        assert_eq!(
            object_rows(&absolute, 0x9000).as_deref(),
            Some(&[rule(0x1000, 8), rule(0x1004, 16), end(0x1020)][..])
        );
        // gimli writes a pc-relative start as if the section were at 0.
        let relative = frame(0x1000, gimli::DW_EH_PE_pcrel | gimli::DW_EH_PE_sdata4);
        assert_eq!(
            object_rows(&relative, 0x400).as_deref(),
            Some(&[rule(0x1400, 8), rule(0x1404, 16), end(0x1420)][..])
        );
        // An object linked past 4 GiB has no rows in this form.
        let high = frame(0x1_0000_0000, gimli::DW_EH_PE_udata8);
        assert_eq!(object_rows(&high, 0), None);
    }
}
