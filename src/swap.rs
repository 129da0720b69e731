//! A value that readers borrow under an epoch guard while a writer replaces
//! it: the agent's table of native unwind rows, which signal handlers search
//! while the collector rebuilds it after a `dlopen`.
//!
//! A reader loads the pointer and borrows the value for as long as its
//! guard stays pinned. The writer swaps a new box in and gets the old one
//! back as a [`Retired`], which frees it only once every guard pinned before
//! the swap has unpinned. The loom model
//! `a_swapped_table_outlives_the_handler_that_reads_it` checks both halves:
//! a reader sees the new value whole, and never a freed one.

use std::sync::{Arc, Mutex};

use crate::epoch::{Domain, ForeignGuard, Guard};
use crate::sync::{AtomicPtr, Ordering, defect};

/// A boxed `T` that readers borrow under a guard of one [`Domain`], and that
/// writers replace.
pub struct Swap<T> {
    current: AtomicPtr<T>,
    domain: Arc<Domain>,
    /// Writers take turns, so that [`Swap::update`] reads the value it
    /// replaces while no other writer can retire it.
    writer: Mutex<()>,
}

/// A value taken out of a [`Swap`]: dropped once the grace period of every
/// guard pinned before it left has passed. Dropped earlier, it is leaked
/// rather than freed under a reader; hand it to something that keeps it until
/// then, such as [`ExecutionManager::retire`](crate::ExecutionManager::retire).
pub struct Retired<T> {
    value: Option<Box<T>>,
    tag: u64,
    domain: Arc<Domain>,
}

impl<T> Swap<T> {
    /// A swap holding `value`, read under guards of `domain`.
    pub fn new(value: T, domain: Arc<Domain>) -> Self {
        Self {
            current: AtomicPtr::new(Box::into_raw(Box::new(value))),
            domain,
            writer: Mutex::new(()),
        }
    }

    /// The value, for as long as `guard` stays pinned; [`ForeignGuard`] if
    /// the guard is pinned in another domain, whose grace periods do not
    /// hold this one's values. Async-signal-safe: one compare and one load.
    #[inline]
    pub fn get<'g>(&self, guard: &'g Guard<'_>) -> Result<&'g T, ForeignGuard> {
        guard.check(&self.domain)?;
        // Acquire: pairs with the writer's swap, so the value is seen as built.
        let value = self.current.load(Ordering::Acquire);
        // SAFETY: the pointer came from `Box::into_raw`; a value that leaves
        // the swap is freed only after the grace period of every guard of
        // this domain pinned before it left (`Retired`), and `guard` is one.
        Ok(unsafe { &*value })
    }

    /// Replaces the value with what `f` makes of the current one, if it
    /// makes anything, and hands back the old one.
    pub fn update(&self, f: impl FnOnce(&T) -> Option<T>) -> Option<Retired<T>> {
        // A poisoned lock only means a writer panicked in `f`: the swap holds
        // a whole value either way.
        let _turn = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        // Acquire: the value as its writer built it.
        let current = self.current.load(Ordering::Acquire);
        // SAFETY: only a writer retires values, and writers take turns: the
        // current one stays in the swap, and alive, until this one swaps it.
        let new = f(unsafe { &*current })?;
        let new = Box::into_raw(Box::new(new));
        let order = if defect!(RelaxedSwap) {
            Ordering::Relaxed
        } else {
            // AcqRel: Release publishes the new value to the readers' Acquire
            // loads; Acquire is for the old value handed back.
            Ordering::AcqRel
        };
        let old = self.current.swap(new, order);
        Some(Retired {
            // SAFETY: `old` came from `Box::into_raw` and has just left the
            // swap; `Retired` frees it only after its grace period.
            value: Some(unsafe { Box::from_raw(old) }),
            tag: self.domain.retire_tag(),
            domain: Arc::clone(&self.domain),
        })
    }
}

impl<T> Drop for Swap<T> {
    fn drop(&mut self) {
        // Relaxed: `&mut self` means no reader or writer is left.
        let value = self.current.load(Ordering::Relaxed);
        // SAFETY: from `Box::into_raw`; no guard can borrow it any more.
        drop(unsafe { Box::from_raw(value) });
    }
}

impl<T> Retired<T> {
    /// Whether the value can be freed now.
    pub fn is_safe(&self) -> bool {
        self.domain.is_safe(self.tag)
    }
}

impl<T> Drop for Retired<T> {
    fn drop(&mut self) {
        let value = self.value.take();
        if defect!(SkipGracePeriod) || self.is_safe() {
            drop(value);
        } else {
            // A reader may still hold it: leaking is the one sound choice.
            std::mem::forget(value);
        }
    }
}
