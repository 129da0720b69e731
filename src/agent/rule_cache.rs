//! A thread's cache of the native rules its handler looked up last.
//!
//! A thread's samples share most of their native frames: the same callers
//! below the same hot code. Looking each one up in the object's rows reads
//! cache lines (and pages) that the sampled code has evicted since the last
//! signal, a millisecond ago; this cache keeps the answers in a few lines of
//! the thread's own record instead. 64 entries, direct-mapped by address,
//! each tagged with the loader counts of the table it came from, so a rule
//! from a table the collector has since replaced (after a `dlopen` or a
//! `dlclose`) is never used: the counts only grow, so no two tables share
//! them.

use std::cell::UnsafeCell;

use super::native::ModuleTable;
use crate::unwind::{Rule, StackEnd};

/// Entries; a power of two.
const ENTRIES: usize = 64;

#[derive(Clone, Copy)]
struct Entry {
    at: usize,
    /// The loader counts of the table the rule came from.
    loader: (u64, u64),
    rule: Result<Rule, StackEnd>,
}

/// The cache; written only by its thread's one sample producer.
pub(crate) struct RuleCache {
    entries: UnsafeCell<[Entry; ENTRIES]>,
}

// SAFETY: the entries are read and written only by the owning thread's one
// sample producer (the handler, or `sample_now`, which `enter_producer`
// lets in one at a time); other threads only hold the record.
unsafe impl Sync for RuleCache {}

impl Default for RuleCache {
    fn default() -> Self {
        Self {
            // Loader counts (0, 0) are no table's: a live process has
            // loaded objects, so an empty entry never matches.
            entries: UnsafeCell::new(
                [Entry {
                    at: 0,
                    loader: (0, 0),
                    rule: Err(StackEnd::NoUnwindInfo),
                }; ENTRIES],
            ),
        }
    }
}

impl RuleCache {
    /// `table`'s rule at `at`, from the cache when the entry for `at` came
    /// from this table.
    ///
    /// # Safety
    /// The caller is the owning thread's one sample producer.
    #[inline]
    pub(crate) unsafe fn rule(&self, table: &ModuleTable, at: usize) -> Result<Rule, StackEnd> {
        // SAFETY: the caller's contract: no other reference to the entries
        // exists while this one lives.
        let entries = unsafe { &mut *self.entries.get() };
        // Fibonacci hashing: the top bits of the product spread nearby
        // return addresses over the entries.
        let hash = at.wrapping_mul(0x9E37_79B9_7F4A_7C15_u64 as usize);
        let slot = &mut entries[hash >> (usize::BITS - ENTRIES.trailing_zeros())];
        let loader = table.loader();
        if slot.at == at && slot.loader == loader {
            return slot.rule;
        }
        let rule = table.rule(at);
        *slot = Entry { at, loader, rule };
        rule
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cache answers what the table answers, and never answers for a
    /// table made at other loader counts with a rule cached from this one.
    #[test]
    fn a_cached_rule_is_the_tables_and_only_its_tables() {
        let table = ModuleTable::load(None);
        let other = ModuleTable::empty((table.loader().0 + 1, table.loader().1));
        let cache = RuleCache::default();
        let here = a_cached_rule_is_the_tables_and_only_its_tables as *const () as usize;
        let getpid = libc::getpid as *const () as usize;
        for _ in 0..2 {
            for at in [here, here + 1, getpid, 8] {
                // SAFETY: this test is the cache's only user.
                assert_eq!(unsafe { cache.rule(&table, at) }, table.rule(at));
            }
        }
        assert!(table.rule(here).is_ok());
        // SAFETY: as above.
        assert_eq!(
            unsafe { cache.rule(&other, here) },
            Err(StackEnd::NoUnwindInfo)
        );
        // SAFETY: as above.
        assert_eq!(unsafe { cache.rule(&table, here) }, table.rule(here));
    }
}
