//! A `.eh_frame` evaluated into rows: one per address where a function's
//! rule changes, sorted, so that a stack walker steps a frame with one
//! binary search and evaluates no DWARF. Used for a JIT method's own
//! `.eh_frame` when it is published ([`super::rows`]) and for each loaded
//! object's by the agent's collector.

use gimli::{BaseAddresses, CieOrFde, EhFrame, LittleEndian, UnwindContext, UnwindSection};

use super::{Rule, StackEnd};

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
                            let rule = Rule::from_row(row);
                            if rows.last().is_none_or(|last: &Row| last.rule != rule) {
                                rows.push(Row {
                                    addr: row.start_address() as usize,
                                    rule,
                                });
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
