//! Why stack walks ended, as a profile counts them.

/// Why the handlers' stack walks ended, counted over a profile in timer
/// periods (a walk counts 1 plus its signal's overrun, as its stack does).
/// Only
/// `root` is a complete stack; every other end is a stack cut short, and
/// the walk says so here rather than guessing a frame.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackEnds {
    /// The outermost frame was reached (`_start`, a thread's start routine,
    /// or a zero return address).
    pub root: u64,
    /// `AgentConfig::max_depth` frames were recorded.
    pub depth_limit: u64,
    /// A native address outside every loaded object's unwind tables (an
    /// object loaded since the collector's last pass, or code with no
    /// `.eh_frame`).
    pub no_unwind_info: u64,
    /// CFI the handler does not evaluate: a CFA computed by a DWARF
    /// expression other than the PLT's (signal trampolines), or a frame that needs a frame
    /// pointer whose value an inner frame's CFI lost.
    pub unsupported: u64,
    /// A step would have read off the thread's stack or misaligned, or did
    /// not move towards the stack's base.
    pub bad_stack: u64,
    /// `Unwind::FramePointer`: the chain reached a frame pointer it could
    /// not follow (which is also how a complete chain ends).
    pub frame_pointer: u64,
}

impl std::ops::AddAssign for StackEnds {
    fn add_assign(&mut self, other: Self) {
        self.root += other.root;
        self.depth_limit += other.depth_limit;
        self.no_unwind_info += other.no_unwind_info;
        self.unsupported += other.unsupported;
        self.bad_stack += other.bad_stack;
        self.frame_pointer += other.frame_pointer;
    }
}

impl StackEnds {
    /// Periods counted: the walks, each with its weight.
    pub fn total(&self) -> u64 {
        self.root
            + self.depth_limit
            + self.no_unwind_info
            + self.unsupported
            + self.bad_stack
            + self.frame_pointer
    }
}
