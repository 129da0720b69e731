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

use std::ptr::NonNull;
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
    /// From `Box::into_raw`. Kept raw, not as a `Box`, until it is freed: a
    /// `Box` asserts unique access, which readers' borrows still deny.
    value: NonNull<T>,
    tag: u64,
    domain: Arc<Domain>,
}

// SAFETY: a `Retired` owns its value as a `Box` would, and gives no access
// to it: sending it sends the value.
unsafe impl<T: Send> Send for Retired<T> {}

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
            // The seeded defect (loom builds only): no publication.
            Ordering::Relaxed
        } else {
            // AcqRel: Release publishes the new value to the readers' Acquire
            // loads; Acquire is for the old value handed back.
            Ordering::AcqRel
        };
        let old = self.current.swap(new, order);
        Some(Retired {
            // `Box::into_raw` gives no null pointer.
            value: NonNull::new(old)?,
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
    /// Frees the value if its grace period has passed; otherwise a reader
    /// may still hold it, and leaking it is the one sound choice.
    fn drop(&mut self) {
        if defect!(SkipGracePeriod) || self.is_safe() {
            // SAFETY: from `Box::into_raw`, out of the swap, and no guard
            // pinned before it left is still pinned: no reader borrows it.
            drop(unsafe { Box::from_raw(self.value.as_ptr()) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replaced_value_is_freed_only_after_the_guards_pinned_before() {
        let domain = Domain::new(2);
        let swap = Swap::new(vec![1u8], Arc::clone(&domain));
        let reader = domain.register().unwrap();
        let guard = reader.pin().unwrap();
        let old = swap.get(&guard).unwrap();
        let retired = swap.update(|v| Some(vec![v[0] + 1])).unwrap();
        assert!(!retired.is_safe());
        // The old value is still readable under the guard pinned before.
        assert_eq!(old, &[1]);
        assert_eq!(swap.get(&guard).unwrap(), &[2]);
        drop(guard);
        assert!(retired.is_safe());
        drop(retired);
        assert!(swap.update(|_| None).is_none());
        let other = Domain::new(1);
        let stranger = other.register().unwrap();
        assert!(swap.get(&stranger.pin().unwrap()).is_err());
    }
}
