//! A method's unwinding tables in the layout `perf inject --jit` places them.
//!
//! perf writes each JIT method into an ELF file of its own: the code at one
//! address, then the record's `.eh_frame` at the next multiple of 8 after the
//! code, then its `.eh_frame_hdr`; it uses the tables only when the header is
//! there. A host's `.eh_frame` ([`crate::info::CodeInfo::eh_frame`]) instead
//! names the code's absolute address, as `__register_frame` and the agent
//! need, and often has no header. So the jitdump writer evaluates the host's
//! FDEs into rows and writes them again: one CIE, one FDE per part, every
//! row's CFA and register rules stated in full, addresses relative to where
//! perf puts them, and a header with its search table.

use gimli::write::{
    Address, CallFrameInstruction, CommonInformationEntry, EhFrame as EhFrameWriter, EndianVec,
    FrameDescriptionEntry, FrameTable,
};
use gimli::{
    BaseAddresses, CfaRule, CieOrFde, EhFrame as EhFrameReader, Encoding, Format, LittleEndian,
    Register, RegisterRule, UnwindContext, UnwindSection, constants,
};

use crate::info::EhFrame;

/// `.eh_frame` and `.eh_frame_hdr` for a method of `code_size` bytes at
/// `code_start`, laid out as perf maps them; `None` if the host's tables
/// cover none of the code or use rules this rewrite does not carry (DWARF
/// expressions).
pub(crate) fn perf_layout(
    eh: &EhFrame,
    code_start: u64,
    code_size: u64,
) -> Option<(Vec<u8>, Vec<u8>)> {
    let section = EhFrameReader::new(&eh.frame, LittleEndian);
    let bases = BaseAddresses::default().set_eh_frame(eh.frame.as_ptr() as u64);
    let mut context = UnwindContext::new();
    // Where the code starts, from the start of the rewritten `.eh_frame`.
    let gap = code_size.next_multiple_of(8);
    let mut table = FrameTable::default();
    let mut cie_id = None;
    let mut starts = Vec::new();
    let mut entries = section.entries(&bases);
    while let Ok(Some(entry)) = entries.next() {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let fde = partial.parse(|s, b, o| s.cie_from_offset(b, o)).ok()?;
        let begin = fde.initial_address();
        if begin < code_start || begin + fde.len() > code_start + code_size {
            continue;
        }
        let cie = fde.cie();
        let id = *cie_id.get_or_insert_with(|| {
            let mut c = CommonInformationEntry::new(
                Encoding {
                    format: Format::Dwarf32,
                    version: 1,
                    address_size: 8,
                },
                u8::try_from(cie.code_alignment_factor()).unwrap_or(1),
                i8::try_from(cie.data_alignment_factor()).unwrap_or(-8),
                cie.return_address_register(),
            );
            c.fde_address_encoding = constants::DW_EH_PE_pcrel | constants::DW_EH_PE_sdata4;
            table.add_cie(c)
        });
        // pc-relative: the writer subtracts the field's own offset.
        let relative = (begin - code_start).wrapping_sub(gap);
        let mut out = FrameDescriptionEntry::new(Address::Constant(relative), fde.len() as u32);
        let mut rows = fde.rows(&section, &bases, &mut context).ok()?;
        let mut previous: Vec<Register> = Vec::new();
        while let Some(row) = rows.next_row().ok()? {
            let at = (row.start_address() - begin) as u32;
            let CfaRule::RegisterAndOffset { register, offset } = *row.cfa() else {
                return None;
            };
            out.add_instruction(
                at,
                CallFrameInstruction::Cfa(register, i32::try_from(offset).ok()?),
            );
            let mut now = Vec::new();
            for (reg, rule) in row.registers() {
                let instruction = match *rule {
                    RegisterRule::Offset(n) => {
                        CallFrameInstruction::Offset(*reg, i32::try_from(n).ok()?)
                    }
                    RegisterRule::ValOffset(n) => {
                        CallFrameInstruction::ValOffset(*reg, i32::try_from(n).ok()?)
                    }
                    RegisterRule::SameValue => CallFrameInstruction::SameValue(*reg),
                    RegisterRule::Undefined => CallFrameInstruction::Undefined(*reg),
                    RegisterRule::Register(from) => CallFrameInstruction::Register(*reg, from),
                    _ => return None,
                };
                out.add_instruction(at, instruction);
                now.push(*reg);
            }
            for gone in previous.iter().filter(|r| !now.contains(r)) {
                out.add_instruction(at, CallFrameInstruction::Restore(*gone));
            }
            previous = now;
        }
        starts.push(begin - code_start);
        table.add_fde(id, out);
    }
    if starts.is_empty() {
        return None;
    }
    let mut frame = EhFrameWriter(EndianVec::new(gimli::RunTimeEndian::Little));
    table.write_eh_frame(&mut frame).ok()?;
    let mut frame = frame.0.into_vec();
    // The terminator perf's readers stop at.
    frame.extend_from_slice(&0u32.to_le_bytes());
    let header = header(&frame, gap, &starts)?;
    Some((frame, header))
}

/// The `.eh_frame_hdr` placed right after `frame`: version 1, a pc-relative
/// pointer back to `.eh_frame`, the FDE count, and the sorted search table
/// (function start, FDE), both relative to the header.
fn header(frame: &[u8], gap: u64, starts: &[u64]) -> Option<Vec<u8>> {
    let section = EhFrameReader::new(frame, LittleEndian);
    let bases = BaseAddresses::default();
    let mut fdes = Vec::new();
    let mut entries = section.entries(&bases);
    while let Some(entry) = entries.next().ok()? {
        if let CieOrFde::Fde(partial) = entry {
            fdes.push(partial.offset());
        }
    }
    if fdes.len() != starts.len() {
        return None;
    }
    let frame_len = frame.len() as i64;
    let mut rows: Vec<(i32, i32)> = starts
        .iter()
        .zip(&fdes)
        .map(|(&start, &fde)| {
            // The code is `gap` before `.eh_frame`, which is `frame_len`
            // before the header.
            let function = start as i64 - gap as i64 - frame_len;
            let entry = fde as i64 - frame_len;
            Some((i32::try_from(function).ok()?, i32::try_from(entry).ok()?))
        })
        .collect::<Option<_>>()?;
    rows.sort();
    let mut out = vec![
        1,
        (constants::DW_EH_PE_pcrel | constants::DW_EH_PE_sdata4).0,
        constants::DW_EH_PE_udata4.0,
        (constants::DW_EH_PE_datarel | constants::DW_EH_PE_sdata4).0,
    ];
    // From this field (at offset 4) back to the start of `.eh_frame`.
    out.extend_from_slice(&i32::try_from(-(frame_len + 4)).ok()?.to_le_bytes());
    out.extend_from_slice(&(rows.len() as u32).to_le_bytes());
    for (function, entry) in rows {
        out.extend_from_slice(&function.to_le_bytes());
        out.extend_from_slice(&entry.to_le_bytes());
    }
    Some(out)
}

/// Where perf's generated ELF file puts the code: `GEN_ELF_TEXT_OFFSET`, the
/// ELF header and one program header rounded up to 16.
#[cfg(test)]
const TEXT_OFFSET: usize = 0x80;

#[cfg(test)]
mod tests {
    use super::*;
    use gimli::write::EhFrame as W;
    use gimli::{EhFrameHdr, X86_64};

    /// A host's table: absolute address, `push rbp; mov rbp, rsp` rules.
    fn host_table(start: u64, len: u32) -> EhFrame {
        let encoding = Encoding {
            format: Format::Dwarf32,
            version: 1,
            address_size: 8,
        };
        let mut cie = CommonInformationEntry::new(encoding, 1, -8, X86_64::RA);
        cie.add_instruction(CallFrameInstruction::Cfa(X86_64::RSP, 8));
        cie.add_instruction(CallFrameInstruction::Offset(X86_64::RA, -8));
        let mut table = FrameTable::default();
        let cie = table.add_cie(cie);
        let mut fde = FrameDescriptionEntry::new(Address::Constant(start), len);
        fde.add_instruction(1, CallFrameInstruction::CfaOffset(16));
        fde.add_instruction(1, CallFrameInstruction::Offset(X86_64::RBP, -16));
        fde.add_instruction(4, CallFrameInstruction::CfaRegister(X86_64::RBP));
        table.add_fde(cie, fde);
        let mut w = W(EndianVec::new(gimli::RunTimeEndian::Little));
        table.write_eh_frame(&mut w).unwrap();
        EhFrame {
            frame: w.0.into_vec().into(),
            header: Box::default(),
        }
    }

    #[test]
    fn the_rewritten_tables_give_the_same_rules_where_perf_maps_them() {
        let (start, size) = (0x7f00_1234_0000u64, 20u64);
        let (frame, hdr) = perf_layout(&host_table(start, 20), start, size).unwrap();
        // Where perf's ELF file puts them, relative to the code at `text`.
        let text = TEXT_OFFSET as u64;
        let frame_at = text + size.next_multiple_of(8);
        let hdr_at = frame_at + frame.len() as u64;
        let bases = BaseAddresses::default()
            .set_eh_frame(frame_at)
            .set_eh_frame_hdr(hdr_at);
        let parsed = EhFrameHdr::new(&hdr, LittleEndian)
            .parse(&bases, 8)
            .unwrap();
        assert_eq!(parsed.eh_frame_ptr(), gimli::Pointer::Direct(frame_at));
        let section = EhFrameReader::new(&frame, LittleEndian);
        let table = parsed.table().unwrap();
        let mut context = UnwindContext::new();
        let rule = |offset: u64, context: &mut UnwindContext<usize>| {
            let fde = table
                .fde_for_address(
                    &section,
                    &bases,
                    text + offset,
                    EhFrameReader::cie_from_offset,
                )
                .unwrap();
            let row = fde
                .unwind_info_for_address(&section, &bases, context, text + offset)
                .unwrap();
            (
                row.cfa().clone(),
                row.register(X86_64::RA),
                row.register(X86_64::RBP),
            )
        };
        assert_eq!(
            rule(0, &mut context),
            (
                CfaRule::RegisterAndOffset {
                    register: X86_64::RSP,
                    offset: 8
                },
                RegisterRule::Offset(-8),
                RegisterRule::Undefined
            )
        );
        assert_eq!(
            rule(2, &mut context),
            (
                CfaRule::RegisterAndOffset {
                    register: X86_64::RSP,
                    offset: 16
                },
                RegisterRule::Offset(-8),
                RegisterRule::Offset(-16)
            )
        );
        assert_eq!(
            rule(19, &mut context),
            (
                CfaRule::RegisterAndOffset {
                    register: X86_64::RBP,
                    offset: 16
                },
                RegisterRule::Offset(-8),
                RegisterRule::Offset(-16)
            )
        );
        // Past the code: no FDE.
        assert!(
            table
                .fde_for_address(
                    &section,
                    &bases,
                    text + size,
                    EhFrameReader::cie_from_offset
                )
                .is_err()
        );
    }

    #[test]
    fn tables_for_other_code_are_left_out() {
        assert_eq!(perf_layout(&host_table(0x1000, 20), 0x2000, 20), None);
    }
}
