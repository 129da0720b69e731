//! A function's `.eh_frame`, built from Cranelift's own unwind information
//! (never by hand) for the function's final address: what the heap registers
//! with the system unwinder (so panics unwind through Cranelift frames) and
//! what jitdump's unwinding records carry.

use cranelift_codegen::isa::TargetIsa;
use cranelift_codegen::isa::unwind::UnwindInfo;
use gimli::RunTimeEndian;
use gimli::write::{Address, EhFrame, EndianVec, FrameTable};

/// The `.eh_frame` section (one CIE, one FDE) of a function at `address`
/// whose Cranelift unwind information is `info`; `None` when the ISA or the
/// function has no System V unwind information.
pub(crate) fn eh_frame(
    isa: &dyn TargetIsa,
    info: &UnwindInfo,
    address: usize,
) -> Option<Box<[u8]>> {
    let UnwindInfo::SystemV(info) = info else {
        return None;
    };
    let mut table = FrameTable::default();
    let cie = table.add_cie(isa.create_systemv_cie()?);
    table.add_fde(cie, info.to_fde(Address::Constant(address as u64)));
    let mut section = EhFrame(EndianVec::new(RunTimeEndian::Little));
    table.write_eh_frame(&mut section).ok()?;
    Some(section.0.into_vec().into_boxed_slice())
}
