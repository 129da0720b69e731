//! Unwinding: the rules that step a frame, the rows they are kept in, and
//! their evaluation from `.eh_frame`. Shared by the heap (a method's rows,
//! made at publish), the agent's handler (which steps JIT frames by those
//! rows and native frames by their objects' rows) and the out-of-process
//! readers (which read the rows through the descriptor).
//!
//! Every step is one `Rule` applied to three registers (pc, stack pointer,
//! frame pointer), reading at most two words, each checked to lie on the
//! thread's stack and be aligned; the new stack pointer must rise. A frame
//! that cannot be stepped ends the stack with a `StackEnd` reason, which
//! the agent counts: it never guesses.
//!
//! A native frame costs the handler a binary search in its object's rows,
//! and so does a JIT frame, in its method's rows: no DWARF is evaluated in
//! the handler. Nothing here allocates, locks or makes a system call in a
//! step (`tests/agent_torture.rs` counts the handler's allocations).

pub(crate) mod eh_frame;
pub mod plt;
pub mod rows;
pub(crate) mod rule;

pub use plt::{PltStub, plt_entry_rule_ranges, plt_stub_at, plt_stubs, preferred};
pub use rows::{UnwindRow, object_rows};
pub(crate) use rule::{Base, Ra, Rule, Saved};

/// Why a stack walk ended. The agent counts each reason
/// ([`super::StackEnds`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StackEnd {
    /// The outermost frame: its CFI says there is no return address
    /// (`_start`, a thread's start), or the return address is zero.
    Root,
    /// `max_depth` frames were recorded.
    DepthLimit,
    /// A native pc outside every loaded object's unwind tables.
    NoUnwindInfo,
    /// CFI the handler does not evaluate (a CFA computed by a DWARF
    /// expression other than the PLT's, such as a signal trampoline's, or a
    /// return address kept in a register).
    Unsupported,
    /// A step would read off the stack or misaligned, or would not move
    /// towards the stack's base.
    BadStack,
    /// The frame-pointer walk ([`super::Unwind::FramePointer`]) met a frame
    /// pointer it cannot follow, or a zero return address.
    FramePointer,
}

/// The registers a step needs: the pc, the stack pointer, the frame
/// pointer, which is `None` once a frame's CFI says its value is lost, and
/// the link register, known only in the interrupted frame (and only where
/// calls leave the return address in it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Regs {
    pub(crate) pc: usize,
    pub(crate) sp: usize,
    pub(crate) fp: Option<usize>,
    pub(crate) lr: Option<usize>,
}

/// The interrupted thread's stack, for validated reads.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Stack {
    pub(crate) lo: usize,
    pub(crate) hi: usize,
}

impl Stack {
    /// The word at `addr`, if it lies inside the stack and is aligned.
    #[inline]
    pub(crate) fn read(&self, addr: usize) -> Option<usize> {
        if addr < self.lo || !addr.is_multiple_of(8) || addr.checked_add(8)? > self.hi {
            return None;
        }
        // SAFETY: `addr` is aligned and inside the interrupted thread's own
        // stack, between its stack pointer and its base: mapped and readable.
        Some(unsafe { std::ptr::read_volatile(addr as *const usize) })
    }
}

/// Applies `rule` to the frame `regs` describe: the caller's registers.
#[inline]
pub(crate) fn step(regs: Regs, rule: Rule, stack: &Stack) -> Result<Regs, StackEnd> {
    let base = match rule.base {
        rule::Base::Sp => regs.sp,
        rule::Base::Fp => regs.fp.ok_or(StackEnd::Unsupported)?,
    };
    let cfa = base
        .checked_add_signed(rule.offset as isize)
        .ok_or(StackEnd::BadStack)?;
    // The caller's frame lies above this one: a CFA below the stack pointer
    // is corrupt data. Equal is a frame that keeps its return address in
    // the link register and has not moved the stack pointer (an aarch64
    // leaf): that step is allowed once, from the interrupted frame, since
    // the link register is known there only. The outermost frame steps
    // nowhere: its CFA may be its own stack pointer (aarch64's
    // `thread_start`, whose CFA is sp + 0).
    let ra = match rule.ra {
        Ra::Undefined => {
            return if cfa >= regs.sp {
                Err(StackEnd::Root)
            } else {
                Err(StackEnd::BadStack)
            };
        }
        Ra::Link if cfa >= regs.sp => regs.lr.ok_or(StackEnd::Unsupported)?,
        Ra::At(offset) if cfa > regs.sp => slot(cfa, offset, stack)?,
        _ => return Err(StackEnd::BadStack),
    };
    // A return address signed by pointer authentication names no code as it
    // is: its code is stripped before anything looks it up.
    let ra = crate::arch::strip_code_address(ra);
    if ra == 0 {
        return Err(StackEnd::Root);
    }
    let fp = match rule.fp {
        rule::Saved::Same => regs.fp,
        rule::Saved::At(offset) => Some(slot(cfa, offset, stack)?),
        rule::Saved::Lost => None,
    };
    Ok(Regs {
        pc: ra,
        sp: cfa,
        fp,
        // The caller's link register was the callee's to overwrite.
        lr: None,
    })
}

/// The word at `cfa + offset`, checked against the stack.
#[inline]
fn slot(cfa: usize, offset: i32, stack: &Stack) -> Result<usize, StackEnd> {
    cfa.checked_add_signed(offset as isize)
        .and_then(|addr| stack.read(addr))
        .ok_or(StackEnd::BadStack)
}

#[cfg(test)]
mod tests {
    use super::rule::{Base, Saved};
    use super::*;
    use crate::unwind::Ra;

    fn on(words: &[usize]) -> Stack {
        let lo = words.as_ptr() as usize;
        Stack {
            lo,
            hi: lo + words.len() * 8,
        }
    }

    #[test]
    fn a_frame_pointer_step_reads_the_saved_pair() {
        let words = [0usize, 0, 0x1111, 0x4242, 0];
        let stack = on(&words);
        let fp = stack.lo + 16;
        let regs = Regs {
            pc: 1,
            sp: stack.lo,
            fp: Some(fp),
            lr: None,
        };
        let next = step(regs, Rule::FRAME_POINTER, &stack).unwrap();
        assert_eq!(
            next,
            Regs {
                pc: 0x4242,
                sp: fp + 16,
                fp: Some(0x1111),
                lr: None,
            }
        );
    }

    #[test]
    fn an_entry_step_takes_the_return_address_where_the_call_left_it() {
        let words = [0x77usize, 9];
        let stack = on(&words);
        let regs = Regs {
            pc: 1,
            sp: stack.lo,
            fp: Some(5),
            lr: Some(0x99),
        };
        let next = step(regs, Rule::AT_ENTRY, &stack).unwrap();
        let expected = if crate::arch::RETURN_ADDRESS_IN_LINK_REGISTER {
            // aarch64: x30, and the stack pointer stays.
            Regs {
                pc: 0x99,
                sp: stack.lo,
                fp: Some(5),
                lr: None,
            }
        } else {
            // x86-64: the top word, popped.
            Regs {
                pc: 0x77,
                sp: stack.lo + 8,
                fp: Some(5),
                lr: None,
            }
        };
        assert_eq!(next, expected);
    }

    #[test]
    fn the_link_register_is_read_only_in_the_interrupted_frame() {
        let words = [0usize; 2];
        let stack = on(&words);
        let leaf = Regs {
            pc: 1,
            sp: stack.lo,
            fp: Some(5),
            lr: Some(0x99),
        };
        let link = Rule {
            base: Base::Sp,
            offset: 0,
            ra: Ra::Link,
            fp: Saved::Same,
        };
        let caller = step(leaf, link, &stack).unwrap();
        assert_eq!(caller.pc, 0x99);
        // The caller's own x30 is lost: a second such step would loop.
        assert_eq!(step(caller, link, &stack), Err(StackEnd::Unsupported));
        // A link step never lowers the stack pointer.
        let sinking = Rule {
            offset: -16,
            ..link
        };
        assert_eq!(step(leaf, sinking, &stack), Err(StackEnd::BadStack));
    }

    #[test]
    fn each_bad_step_ends_with_its_reason() {
        let words = [0usize, 0x10, 0, 0];
        let stack = on(&words);
        let regs = Regs {
            pc: 1,
            sp: stack.lo,
            fp: None,
            lr: None,
        };
        // The frame pointer is lost, and the rule needs it.
        assert_eq!(
            step(regs, Rule::FRAME_POINTER, &stack),
            Err(StackEnd::Unsupported)
        );
        // A CFA that does not rise.
        let sinking = Rule {
            base: Base::Sp,
            offset: 0,
            ra: Ra::At(-8),
            fp: Saved::Same,
        };
        assert_eq!(step(regs, sinking, &stack), Err(StackEnd::BadStack));
        // A return address slot past the stack's base.
        let far = Rule {
            offset: 64,
            ..sinking
        };
        assert_eq!(step(regs, far, &stack), Err(StackEnd::BadStack));
        // A misaligned slot.
        let odd = Rule {
            offset: 12,
            ..sinking
        };
        assert_eq!(step(regs, odd, &stack), Err(StackEnd::BadStack));
        // No return address: the root.
        let root = Rule {
            offset: 8,
            ra: Ra::Undefined,
            ..sinking
        };
        assert_eq!(step(regs, root, &stack), Err(StackEnd::Root));
        // Also where the CFA is the stack pointer; below it, corrupt.
        let at_sp = Rule { offset: 0, ..root };
        assert_eq!(step(regs, at_sp, &stack), Err(StackEnd::Root));
        let below = Rule { offset: -8, ..root };
        assert_eq!(step(regs, below, &stack), Err(StackEnd::BadStack));
        // A zero return address is the root too.
        let zero = Rule {
            offset: 24,
            ..sinking
        };
        assert_eq!(step(regs, zero, &stack), Err(StackEnd::Root));
        // And a good one.
        let good = Rule {
            offset: 16,
            ..sinking
        };
        assert_eq!(
            step(regs, good, &stack),
            Ok(Regs {
                pc: 0x10,
                sp: stack.lo + 16,
                fp: None,
                lr: None,
            })
        );
    }
}
