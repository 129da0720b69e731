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

/// Where a frame's return address is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ra {
    /// In the word at CFA + offset.
    At(i32),
    /// Still in the link register (aarch64's x30): a function that has not
    /// saved it, or keeps no frame.
    Link,
    /// Nowhere: the outermost frame.
    Undefined,
}

/// How to step from one frame to its caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rule {
    pub(crate) base: Base,
    /// CFA = base + offset.
    pub(crate) offset: i32,
    /// Where the return address is.
    pub(crate) ra: Ra,
    pub(crate) fp: Saved,
}

use crate::arch::{self, DWARF_FP, DWARF_RA, DWARF_SP, FRAME_RECORD};

impl Rule {
    /// A frame that keeps the frame-pointer convention: the CFA is 16 bytes
    /// above the frame pointer, under it the return address, then the
    /// caller's frame pointer.
    pub(crate) const FRAME_POINTER: Rule = Rule {
        base: Base::Fp,
        offset: FRAME_RECORD.0,
        ra: Ra::At(FRAME_RECORD.1),
        fp: Saved::At(FRAME_RECORD.2),
    };

    /// A function at its first instruction, or at its return: the return
    /// address is where the call left it (the top word on x86-64, x30 on
    /// aarch64), the frame pointer the caller's.
    pub(crate) const AT_ENTRY: Rule = if arch::RETURN_ADDRESS_IN_LINK_REGISTER {
        Rule {
            base: Base::Sp,
            offset: 0,
            ra: Ra::Link,
            fp: Saved::Same,
        }
    } else {
        Rule {
            base: Base::Sp,
            offset: 8,
            ra: Ra::At(-8),
            fp: Saved::Same,
        }
    };

    /// A function just past pushing the caller's frame pointer (x86-64's
    /// `push rbp`) or its frame record (aarch64's
    /// `stp x29, x30, [sp, #-frame]!`): the return address one word above
    /// the saved frame pointer, which is the top word, and the caller's
    /// stack pointer `frame` bytes up.
    pub(crate) const fn after_push(frame: i32) -> Rule {
        Rule {
            base: Base::Sp,
            offset: frame,
            ra: Ra::At(8 - frame),
            fp: Saved::At(-frame),
        }
    }

    /// The rule a CFI row gives, if the handler can apply it.
    /// `ra_undefined`: its CFI set the return address column undefined
    /// (`DW_CFA_undefined`), which the row alone does not tell.
    pub(crate) fn from_row<S: UnwindContextStorage<usize>>(
        row: &UnwindTableRow<usize, S>,
        ra_undefined: bool,
    ) -> Result<Rule, StackEnd> {
        let (base, offset) = match *row.cfa() {
            CfaRule::RegisterAndOffset { register, offset } => {
                let base = match register {
                    r if r == DWARF_SP => Base::Sp,
                    r if r == DWARF_FP => Base::Fp,
                    _ => return Err(StackEnd::Unsupported),
                };
                (base, i32::try_from(offset).map_err(|_| StackEnd::BadStack)?)
            }
            CfaRule::Expression(_) => return Err(StackEnd::Unsupported),
        };
        Rule::with_cfa(row, base, offset, ra_undefined)
    }

    /// The rule of `row` with its CFA taken as `base` + `offset` (for a row
    /// whose CFA is an expression this form cannot hold, once it is known
    /// what the expression computes at each address: the PLT's).
    pub(crate) fn with_cfa<S: UnwindContextStorage<usize>>(
        row: &UnwindTableRow<usize, S>,
        base: Base,
        offset: i32,
        ra_undefined: bool,
    ) -> Result<Rule, StackEnd> {
        // A return address column without a rule of its own keeps the value
        // the call gave it: on aarch64 that is x30 (a leaf, or a prologue
        // before the frame record is saved). An explicit `undefined` rule
        // (which gimli's row does not tell from no rule), or no rule where
        // calls push the return address, is the outermost frame.
        let ra = match row.register(DWARF_RA) {
            RegisterRule::Offset(n) => Ra::At(small(n)?),
            RegisterRule::SameValue if arch::RETURN_ADDRESS_IN_LINK_REGISTER => Ra::Link,
            RegisterRule::Undefined if !ra_undefined && arch::RETURN_ADDRESS_IN_LINK_REGISTER => {
                Ra::Link
            }
            RegisterRule::Undefined => Ra::Undefined,
            _ => return Err(StackEnd::Unsupported),
        };
        Ok(Rule {
            base,
            offset,
            ra,
            fp: saved(row.register(DWARF_FP))?,
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
