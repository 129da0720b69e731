//! A change sequence: how a writer tells readers that cannot pin (readers in
//! another process, eBPF programs) whether what they read was stable.
//!
//! The writer, already serialized by its own lock, brackets every change of
//! what such readers read with [`ChangeSeq::begin`] and [`ChangeSeq::end`]:
//! the value is odd during a change and grows by two per change. A reader
//! takes [`ChangeSeq::read`] before its reads and [`ChangeSeq::validate`]
//! after them; if the value is the same and even, no change overlapped them.
//! The in-process form of the reader exists for the loom model; the
//! out-of-process readers follow the same steps with plain copies.

use crate::sync::{AtomicU64, Ordering, fence};

/// A writer's change sequence. Transparent: out-of-process readers read it as
/// a u64 at the address the descriptor gives. Odd while a change is under
/// way, bumped by two per change (see the unit test below for the steps).
#[derive(Debug)]
#[repr(transparent)]
pub struct ChangeSeq(AtomicU64);

impl Default for ChangeSeq {
    fn default() -> Self {
        Self::new()
    }
}

impl ChangeSeq {
    /// A sequence at 0 (no change yet).
    pub fn new() -> Self {
        Self(AtomicU64::new(0))
    }

    /// Marks the start of a change. Callers are serialized by their own lock.
    pub fn begin(&self) {
        // Relaxed load: only the (serialized) writer stores the sequence.
        let seq = self.0.load(Ordering::Relaxed);
        // Relaxed store, then a Release fence: the odd value is ordered before
        // every store of the change that follows.
        self.0.store(seq | 1, Ordering::Relaxed);
        if !crate::sync::defect!(SeqNoFence) {
            fence(Ordering::Release);
        }
    }

    /// Marks the end of a change.
    pub fn end(&self) {
        // Relaxed load: as in `begin`.
        let seq = self.0.load(Ordering::Relaxed);
        // Release: the change's stores are ordered before the even value.
        self.0.store((seq | 1) + 1, Ordering::Release);
    }

    /// A reader's first step: the value before its reads.
    #[inline]
    pub fn read(&self) -> u64 {
        // Acquire: the reads that follow see at least every change whose end
        // this value shows.
        self.0.load(Ordering::Acquire)
    }

    /// A reader's last step: whether its reads since [`ChangeSeq::read`]
    /// returned `seen` overlapped no change.
    #[inline]
    pub fn validate(&self, seen: u64) -> bool {
        // Acquire fence: if a read saw a store of a change, this fence
        // synchronizes with the writer's Release fence after that change's
        // odd value, so the load below sees the odd value or a later one.
        fence(Ordering::Acquire);
        // Relaxed: ordered by the fence above.
        seen & 1 == 0 && self.0.load(Ordering::Relaxed) == seen
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::ChangeSeq;

    #[test]
    fn a_change_is_seen_while_under_way_and_after() {
        let seq = ChangeSeq::new();
        let seen = seq.read();
        assert!(seq.validate(seen)); // nothing changed
        seq.begin();
        assert!(!seq.validate(seen) && !seq.validate(seq.read())); // under way
        seq.end();
        let after = seq.read();
        assert_eq!(after, 2);
        assert!(seq.validate(after));
    }
}
