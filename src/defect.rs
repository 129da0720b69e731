//! Seeded defects for the loom suite: each can be switched on (per OS thread,
//! which loom's model threads share with the test that starts them) to prove
//! that the models catch it. Compiled only under `--cfg loom`; elsewhere the
//! `defect!` macro is the constant `false`.

use std::cell::Cell;

/// A deliberate bug in one protocol step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Defect {
    /// Map words published with Relaxed instead of Release.
    RelaxedPublish,
    /// v2 pointer words written before the start nibble.
    PointersBeforeNibble,
    /// Retired memory reclaimed without waiting for the grace period.
    SkipGracePeriod,
    /// A nested unpin clears the reader's slot, ending the outer guard too.
    NestedUnpinClears,
    /// A re-pin at depth 0 (and the reader's final clear on drop) stores the slot
    /// Relaxed, outside the release sequence of the previous unpin.
    RelaxedRepin,
    /// The call counter elects its crossing with a load and a store instead of
    /// a compare-and-swap.
    CheckThenSetCrossing,
    /// A change sequence's odd value is not fenced before the change's stores.
    SeqNoFence,
    /// A guard answers from the range-map section it remembers without
    /// checking that the map's write sequence is unchanged.
    SectionCacheUnchecked,
    /// An exact v2 lookup takes any block's "runs on" bit in the end word for
    /// its own block's, as if the bit were a plain flag.
    RunsOnAnyBucket,
    /// Detaching a thread clears its token and reads the handlers' count
    /// without the fence that pairs with the handler's.
    UnfencedDetach,
    /// A [`crate::swap::Swap`] publishes its new value with a Relaxed swap.
    RelaxedSwap,
    /// A [`crate::CallCell`] publishes its new entry with a Relaxed swap.
    RelaxedCellSet,
}

thread_local! {
    static ACTIVE: Cell<Option<Defect>> = const { Cell::new(None) };
}

/// Switches `defect` on (or all off with `None`) for this thread.
pub fn seed(defect: Option<Defect>) {
    ACTIVE.with(|a| a.set(defect));
}

/// Whether `defect` is switched on for this thread.
pub fn on(defect: Defect) -> bool {
    ACTIVE.with(|a| a.get() == Some(defect))
}
