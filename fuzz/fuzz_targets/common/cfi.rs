//! Call-frame instructions from fuzz input, and the `.eh_frame` section
//! gimli writes for them: shared by the targets that build CFI.

use arbitrary::Arbitrary;
use gimli::write::{
    Address, CallFrameInstruction, CommonInformationEntry, EhFrame, EndianVec,
    FrameDescriptionEntry, FrameTable,
};
use gimli::{Encoding, Format, Register, RunTimeEndian, X86_64};

/// The registers an instruction names: the stack and frame pointers, the
/// return address, and one the rows ignore.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Reg {
    Sp,
    Fp,
    Ra,
    Rbx,
}

impl Reg {
    fn register(self) -> Register {
        match self {
            Self::Sp => X86_64::RSP,
            Self::Fp => X86_64::RBP,
            Self::Ra => X86_64::RA,
            Self::Rbx => X86_64::RBX,
        }
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Instruction {
    Cfa(Reg, i32),
    CfaOffset(i32),
    CfaRegister(Reg),
    Offset(Reg, i16),
    Restore(Reg),
    SameValue(Reg),
    Undefined(Reg),
    RegisterIn(Reg, Reg),
    RememberState,
    RestoreState,
}

impl Instruction {
    fn encode(self) -> CallFrameInstruction {
        match self {
            Self::Cfa(r, n) => CallFrameInstruction::Cfa(r.register(), n),
            Self::CfaOffset(n) => CallFrameInstruction::CfaOffset(n),
            Self::CfaRegister(r) => CallFrameInstruction::CfaRegister(r.register()),
            Self::Offset(r, n) => CallFrameInstruction::Offset(r.register(), i32::from(n) * 8),
            Self::Restore(r) => CallFrameInstruction::Restore(r.register()),
            Self::SameValue(r) => CallFrameInstruction::SameValue(r.register()),
            Self::Undefined(r) => CallFrameInstruction::Undefined(r.register()),
            Self::RegisterIn(r, s) => CallFrameInstruction::Register(r.register(), s.register()),
            Self::RememberState => CallFrameInstruction::RememberState,
            Self::RestoreState => CallFrameInstruction::RestoreState,
        }
    }
}

/// The section for `cie` and `fde` (instructions at code offsets from the
/// FDE's start), whose FDE starts at `start`; `None` if gimli cannot write
/// it (remember/restore out of order, say).
pub fn build(
    start: u64,
    len: u16,
    cie: &[Instruction],
    fde: &[(u16, Instruction)],
) -> Option<Vec<u8>> {
    let encoding = Encoding {
        format: Format::Dwarf32,
        version: 1,
        address_size: 8,
    };
    let mut c = CommonInformationEntry::new(encoding, 1, -8, X86_64::RA);
    for i in cie.iter().take(8) {
        c.add_instruction(i.encode());
    }
    let mut table = FrameTable::default();
    let c = table.add_cie(c);
    let mut f = FrameDescriptionEntry::new(Address::Constant(start), u32::from(len));
    let mut at = 0;
    for &(delta, i) in fde.iter().take(32) {
        // Instructions advance through the code in order.
        at = (at + u32::from(delta % 64)).min(u32::from(len));
        f.add_instruction(at, i.encode());
    }
    table.add_fde(c, f);
    let mut section = EhFrame(EndianVec::new(RunTimeEndian::Little));
    table.write_eh_frame(&mut section).ok()?;
    Some(section.0.into_vec())
}
