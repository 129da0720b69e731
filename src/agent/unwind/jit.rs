//! A JIT frame's rule from the method's own `.eh_frame`
//! ([`crate::info::CodeInfo::eh_frame`]): the CIE and FDE a host builds for
//! `__register_frame` or for perf's jitdump, evaluated at the frame's address.

use gimli::{BaseAddresses, CieOrFde, EhFrame, LittleEndian, UnwindContext, UnwindSection};

use super::{Rule, StackEnd};

/// Records read at most per lookup: a method's `.eh_frame` holds one CIE and
/// an FDE per part (main body, funclets, cold part).
const MAX_RECORDS: usize = 16;

/// The rule at `at` from `frame`, a method's `.eh_frame`; `None` if no FDE in
/// it covers `at` (the caller falls back to the frame pointer).
pub(crate) fn rule(
    frame: &[u8],
    at: usize,
    context: &mut UnwindContext<usize>,
) -> Option<Result<Rule, StackEnd>> {
    let section = EhFrame::new(frame, LittleEndian);
    // The data is where the heap keeps it: pc-relative pointers in it are
    // relative to this copy, and absolute ones (what Cranelift writes) are
    // unaffected.
    let bases = BaseAddresses::default().set_eh_frame(frame.as_ptr() as u64);
    let mut entries = section.entries(&bases);
    for _ in 0..MAX_RECORDS {
        let partial = match entries.next() {
            Ok(Some(CieOrFde::Fde(partial))) => partial,
            Ok(Some(CieOrFde::Cie(_))) => continue,
            // The end of the data, or a malformed record.
            Ok(None) | Err(_) => return None,
        };
        let fde = partial
            .parse(|section, bases, offset| section.cie_from_offset(bases, offset))
            .ok()?;
        if fde.contains(at as u64) {
            return Some(
                fde.unwind_info_for_address(&section, &bases, context, at as u64)
                    .map_err(|_| StackEnd::Unsupported)
                    .and_then(Rule::from_row),
            );
        }
    }
    None
}
