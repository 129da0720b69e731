//! A `.eh_frame` evaluated into rows: one per address where a function's
//! rule changes, sorted, so that a stack walker steps a frame with one
//! binary search and evaluates no DWARF. Used for a JIT method's own
//! `.eh_frame` when it is published ([`super::rows`]) and for each loaded
//! object's by the agent's collector.

use gimli::{
    BaseAddresses, CallFrameInstruction, CfaRule, CieOrFde, EhFrame, EndianSlice,
    FrameDescriptionEntry, LittleEndian, UnwindContext, UnwindContextStorage, UnwindSection,
    UnwindTableRow,
};

use super::rule::Base;
use super::{Rule, StackEnd};
use crate::arch::{PLT_ENTRY, plt_push_offset as plt_expression};

/// The most bytes of PLT one row expands into per-entry rows (a million
/// entries' worth): a row claiming more is refused, not expanded.
const MAX_PLT_BYTES: u64 = PLT_ENTRY << 20;

/// Where a rule starts to apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Row {
    pub(crate) addr: usize,
    pub(crate) rule: Result<Rule, StackEnd>,
}

/// Evaluates every FDE in `frame`, an `.eh_frame` whose first byte is at
/// `frame_addr` (pc-relative pointers are relative to it), into rows sorted
/// by address: one where a function's rule changes, and an end row
/// ([`StackEnd::NoUnwindInfo`]) after each function that no other function
/// starts at. A row that changes only what a step ignores (another
/// callee-saved register) merges into the one before.
pub(crate) fn evaluate(frame: &[u8], frame_addr: usize) -> Vec<Row> {
    let mut section = EhFrame::new(frame, LittleEndian);
    section.set_vendor(crate::arch::DWARF_VENDOR);
    let bases = BaseAddresses::default().set_eh_frame(frame_addr as u64);
    let mut context = UnwindContext::new();
    let mut rows = Vec::new();
    let mut entries = section.entries(&bases);
    while let Ok(Some(entry)) = entries.next() {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let Ok(fde) = partial.parse(|s, b, o| s.cie_from_offset(b, o)) else {
            continue;
        };
        // An FDE of no bytes covers nothing (its start row would outlive it).
        if fde.len() == 0 {
            continue;
        }
        // CFI that gimli cannot evaluate (a state restored that was never
        // remembered, say) ends the walk from where it fails: guessing by
        // frame pointers there could name a wrong caller.
        let unsupported = |addr: u64| Row {
            addr: addr as usize,
            rule: Err(StackEnd::Unsupported),
        };
        // (Only where the return address may stay in a register does the
        // difference between no rule and an undefined one matter.)
        let undefined = if crate::arch::RETURN_ADDRESS_IN_LINK_REGISTER {
            ra_undefined(&section, &bases, &fde)
        } else {
            Vec::new()
        };
        match fde.rows(&section, &bases, &mut context) {
            Err(_) => rows.push(unsupported(fde.initial_address())),
            Ok(mut table) => {
                let mut next = fde.initial_address();
                loop {
                    match table.next_row() {
                        // A row of no bytes (an instruction at the FDE's
                        // end) covers nothing.
                        Ok(Some(row)) if row.start_address() >= row.end_address() => {}
                        Ok(Some(row)) => {
                            next = row.end_address();
                            let mut push = |addr: u64, rule| {
                                if rows.last().is_none_or(|last: &Row| last.rule != rule) {
                                    rows.push(Row {
                                        addr: addr as usize,
                                        rule,
                                    });
                                }
                            };
                            let ra_undefined = undefined_at(&undefined, row.start_address());
                            match plt_push_offset(&section, row.cfa()) {
                                Some(push_at) => plt_rows(row, push_at, &mut push),
                                None => {
                                    push(row.start_address(), Rule::from_row(row, ra_undefined))
                                }
                            }
                        }
                        Ok(None) => break,
                        Err(_) => {
                            // (Past the last row, the failure covers no byte.)
                            if next < fde.end_address() {
                                rows.push(unsupported(next));
                            }
                            break;
                        }
                    }
                }
            }
        }
        rows.push(Row {
            addr: fde.end_address() as usize,
            rule: Err(StackEnd::NoUnwindInfo),
        });
    }
    // A function's first row sorts before the end row of one that ends where
    // it begins; the end row is then dropped.
    rows.sort_by_key(|r| (r.addr, r.rule.is_err()));
    rows.dedup_by_key(|r| r.addr);
    rows
}

/// Where in `fde` its return address column is explicitly undefined
/// (`DW_CFA_undefined`, as `_start` and glibc's `thread_start` say: the
/// outermost frame), as (address, undefined) from each change on. gimli
/// keeps no entry for an undefined rule, the same as for a column without
/// a rule, which on aarch64 means "still in x30"; so the instructions are
/// read again here for this one column. CFI that does not decode stops the
/// reading (the rows of that FDE end the walk there anyway).
fn ra_undefined(
    section: &EhFrame<EndianSlice<'_, LittleEndian>>,
    bases: &BaseAddresses,
    fde: &FrameDescriptionEntry<EndianSlice<'_, LittleEndian>>,
) -> Vec<(u64, bool)> {
    let ra = crate::arch::DWARF_RA;
    // The rule an instruction gives the column: undefined or not.
    let sets = |instruction: &CallFrameInstruction<usize>| match *instruction {
        CallFrameInstruction::Undefined { register } => (register == ra).then_some(true),
        CallFrameInstruction::SameValue { register }
        | CallFrameInstruction::Offset { register, .. }
        | CallFrameInstruction::OffsetExtendedSf { register, .. }
        | CallFrameInstruction::ValOffset { register, .. }
        | CallFrameInstruction::ValOffsetSf { register, .. }
        | CallFrameInstruction::Expression { register, .. }
        | CallFrameInstruction::ValExpression { register, .. }
        | CallFrameInstruction::Register {
            dest_register: register,
            ..
        } => (register == ra).then_some(false),
        _ => None,
    };
    let cie = fde.cie();
    let mut initial = false;
    let mut instructions = cie.instructions(section, bases);
    while let Ok(Some(instruction)) = instructions.next() {
        initial = sets(&instruction).unwrap_or(initial);
    }
    let (mut at, mut now) = (fde.initial_address(), initial);
    let mut remembered = Vec::new();
    let mut changes = vec![(at, now)];
    let mut instructions = fde.instructions(section, bases);
    while let Ok(Some(instruction)) = instructions.next() {
        match instruction {
            CallFrameInstruction::AdvanceLoc { delta } => {
                at = at.wrapping_add(u64::from(delta) * cie.code_alignment_factor());
            }
            CallFrameInstruction::SetLoc { address } => at = address,
            CallFrameInstruction::RememberState => remembered.push(now),
            CallFrameInstruction::RestoreState => now = remembered.pop().unwrap_or(now),
            CallFrameInstruction::Restore { register } if register == ra => now = initial,
            ref other => now = sets(other).unwrap_or(now),
        }
        match changes.last_mut() {
            Some(last) if last.0 == at => last.1 = now,
            Some(last) if last.1 != now => changes.push((at, now)),
            _ => {}
        }
    }
    changes
}

/// Whether `changes` ([`ra_undefined`]) leave the return address undefined
/// at `addr`.
fn undefined_at(changes: &[(u64, bool)], addr: u64) -> bool {
    let i = changes.partition_point(|&(at, _)| at <= addr);
    i.checked_sub(1).is_some_and(|i| changes[i].1)
}

/// Where `cfa`, a row's CFA rule, switches from rsp + 8 to rsp + 16 within
/// each PLT entry, if it is the lazy-binding PLT's expression.
fn plt_push_offset(
    section: &EhFrame<EndianSlice<'_, LittleEndian>>,
    cfa: &CfaRule<usize>,
) -> Option<u64> {
    let CfaRule::Expression(expression) = cfa else {
        return None;
    };
    let bytes = expression.get(section).ok()?.0.slice();
    plt_expression(bytes).filter(|&k| k < PLT_ENTRY)
}

/// The rows of a PLT row: its expression, CFA = sp + 8 plus 8 once
/// `addr % PLT_ENTRY >= push_at`, as one rule per stretch of each entry, so
/// that a walker applies it with the same binary search as any other row.
fn plt_rows<S: UnwindContextStorage<usize>>(
    row: &UnwindTableRow<usize, S>,
    push_at: u64,
    push: &mut impl FnMut(u64, Result<Rule, StackEnd>),
) {
    let (start, end) = (row.start_address(), row.end_address());
    if end - start > MAX_PLT_BYTES {
        push(start, Err(StackEnd::Unsupported));
        return;
    }
    // (x86-64's lazy PLT: its return address is on the stack.)
    let before = Rule::with_cfa(row, Base::Sp, 8, false);
    let after = Rule::with_cfa(row, Base::Sp, 16, false);
    let rule_at = |addr: u64| {
        if addr % PLT_ENTRY >= push_at {
            after
        } else {
            before
        }
    };
    push(start, rule_at(start));
    // Checked: an FDE may claim addresses up to the top of the space.
    let mut entry = start - start % PLT_ENTRY;
    while entry < end {
        for boundary in [Some(entry), entry.checked_add(push_at)]
            .into_iter()
            .flatten()
        {
            if start < boundary && boundary < end {
                push(boundary, rule_at(boundary));
            }
        }
        let Some(next) = entry.checked_add(PLT_ENTRY) else {
            break;
        };
        entry = next;
    }
}
