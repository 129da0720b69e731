//! One frame's unwind rule in the only form the handler applies: the
//! canonical frame address (CFA) as a register plus an offset, and where the
//! return address and the caller's frame pointer were saved relative to it.
//! A DWARF CFI row reduces to this, or is refused; so does the frame-pointer
//! convention.

use gimli::{CfaRule, RegisterRule, UnwindContextStorage, UnwindTableRow};

use super::StackEnd;

/// The register a CFA is computed from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Base {
    /// The stack pointer.
    Sp,
    /// The frame pointer.
    Fp,
}

/// Where the caller's frame pointer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Saved {
    /// Not changed by this frame.
    Same,
    /// Saved in the word at CFA + offset.
    At(i32),
    /// Not recoverable by these rules.
    Lost,
}

/// How to step from one frame to its caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rule {
    pub(crate) base: Base,
    /// CFA = base + offset.
    pub(crate) offset: i32,
    /// The return address is the word at CFA + this; `None` in the outermost
    /// frame.
    pub(crate) ra: Option<i32>,
    pub(crate) fp: Saved,
}

#[cfg(target_arch = "x86_64")]
mod regs {
    use gimli::{Register, X86_64};
    pub(super) const SP: Register = X86_64::RSP;
    pub(super) const FP: Register = X86_64::RBP;
    pub(super) const RA: Register = X86_64::RA;
    /// Return address and saved frame pointer below a frame-pointer frame.
    pub(super) const FRAME: (i32, i32, i32) = (16, -8, -16);
}

#[cfg(target_arch = "aarch64")]
mod regs {
    use gimli::{AArch64, Register};
    pub(super) const SP: Register = AArch64::SP;
    pub(super) const FP: Register = AArch64::X29;
    pub(super) const RA: Register = AArch64::X30;
    /// The frame record: x29 and x30 at the frame pointer, CFA 16 above.
    pub(super) const FRAME: (i32, i32, i32) = (16, -8, -16);
}

impl Rule {
    /// A frame that keeps the frame-pointer convention: the CFA is 16 bytes
    /// above the frame pointer, under it the return address, then the
    /// caller's frame pointer.
    pub(crate) const FRAME_POINTER: Rule = Rule {
        base: Base::Fp,
        offset: regs::FRAME.0,
        ra: Some(regs::FRAME.1),
        fp: Saved::At(regs::FRAME.2),
    };

    /// A function at its first instruction, or at its `ret`: the return
    /// address is the top word, the frame pointer the caller's.
    pub(crate) const AT_ENTRY: Rule = Rule {
        base: Base::Sp,
        offset: 8,
        ra: Some(-8),
        fp: Saved::Same,
    };

    /// A function just past `push rbp`: the return address above the saved
    /// frame pointer, which is the top word.
    pub(crate) const AFTER_PUSH: Rule = Rule {
        base: Base::Sp,
        offset: 16,
        ra: Some(-8),
        fp: Saved::At(-16),
    };

    /// The rule a CFI row gives, if the handler can apply it.
    pub(crate) fn from_row<S: UnwindContextStorage<usize>>(
        row: &UnwindTableRow<usize, S>,
    ) -> Result<Rule, StackEnd> {
        let (base, offset) = match *row.cfa() {
            CfaRule::RegisterAndOffset { register, offset } => {
                let base = match register {
                    r if r == regs::SP => Base::Sp,
                    r if r == regs::FP => Base::Fp,
                    _ => return Err(StackEnd::Unsupported),
                };
                (base, i32::try_from(offset).map_err(|_| StackEnd::BadStack)?)
            }
            CfaRule::Expression(_) => return Err(StackEnd::Unsupported),
        };
        let ra = match row.register(regs::RA) {
            RegisterRule::Offset(n) => Some(small(n)?),
            RegisterRule::Undefined => None,
            _ => return Err(StackEnd::Unsupported),
        };
        Ok(Rule {
            base,
            offset,
            ra,
            fp: saved(row.register(regs::FP))?,
        })
    }
}

/// The frame pointer's rule. A callee-saved register without a rule keeps
/// its value (gimli reports such a register as `Undefined`).
fn saved(rule: RegisterRule<usize>) -> Result<Saved, StackEnd> {
    Ok(match rule {
        RegisterRule::Undefined | RegisterRule::SameValue => Saved::Same,
        RegisterRule::Offset(n) => Saved::At(small(n)?),
        _ => Saved::Lost,
    })
}

/// A CFA-relative offset in range for a stack read.
fn small(n: i64) -> Result<i32, StackEnd> {
    i32::try_from(n).map_err(|_| StackEnd::BadStack)
}
