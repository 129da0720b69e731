//! The signal handler's stack walk, run on a stack the caller lays out: what
//! the `handler_walk` fuzz target drives (feature `fuzzing`; not a stable
//! API). It is the handler's own code, from the same registers and bounds a
//! sample gives it, without a signal.

use std::sync::OnceLock;

use super::StackEnds;
use super::handler::{Registers, walk_frame_pointers, walk_mixed};
use super::native::ModuleTable;
use super::record::RawFrame;
use crate::ExecutionManager;
use crate::epoch::EpochError;
use crate::unwind::{Stack, StackEnd};

/// What one walk recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Walk {
    /// Each frame's address: the pc, then the return addresses.
    pub frames: Vec<usize>,
    /// Why it ended: one count, in one reason.
    pub end: StackEnds,
}

/// The process's objects' unwind rows, evaluated once.
fn modules() -> &'static ModuleTable {
    static TABLE: OnceLock<ModuleTable> = OnceLock::new();
    TABLE.get_or_init(|| ModuleTable::load(None))
}

/// Walks the stack `[lo, hi)` from `pc`, `sp` and `fp` over `manager`'s
/// code, recording at most `max_depth` frames, as the agent's handler does:
/// by unwind rows, native frames by this process's objects' rows, when
/// `mixed`; by frame pointers otherwise. `None` when `sp` is outside the
/// stack (the handler drops such a sample).
///
/// # Safety
/// `[lo, hi)` is mapped and readable for the whole call.
pub unsafe fn walk(
    manager: &ExecutionManager,
    (pc, sp, fp): (usize, usize, usize),
    (lo, hi): (usize, usize),
    max_depth: usize,
    mixed: bool,
) -> Result<Option<Walk>, EpochError> {
    if !(lo..=hi).contains(&sp) {
        return Ok(None);
    }
    let reader = manager.register_reader()?;
    let guard = manager.pin(&reader)?;
    let stack = Stack { lo: sp, hi };
    let regs = Registers { pc, fp, sp, lr: 0 };
    let mut frames = vec![RawFrame::default(); max_depth];
    let frameless = manager.frameless_stubs();
    let (depth, end) = if mixed {
        // SAFETY: no rule cache is given.
        let walked = unsafe {
            walk_mixed(
                &guard,
                Some(modules()),
                None,
                frameless,
                &stack,
                regs,
                &mut frames,
            )
        };
        (walked.depth, walked.end)
    } else {
        walk_frame_pointers(&guard, frameless, &stack, regs, &mut frames)
    };
    let mut ends = StackEnds::default();
    *match end {
        StackEnd::Root => &mut ends.root,
        StackEnd::DepthLimit => &mut ends.depth_limit,
        StackEnd::NoUnwindInfo => &mut ends.no_unwind_info,
        StackEnd::Unsupported => &mut ends.unsupported,
        StackEnd::BadStack => &mut ends.bad_stack,
        StackEnd::FramePointer => &mut ends.frame_pointer,
    } += 1;
    Ok(Some(Walk {
        frames: frames[..depth.min(max_depth)]
            .iter()
            .map(|f| f.addr)
            .collect(),
        end: ends,
    }))
}
