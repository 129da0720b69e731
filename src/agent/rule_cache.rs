//! A thread's cache of the native frames its handler looked up last.
//!
//! A thread's samples share most of their native frames: the same callers
//! below the same hot code. Looking each one up in the range map (to know it
//! is native code) and in the object's rows reads cache lines (and pages)
//! that the sampled code has evicted since the last signal, a millisecond
//! ago; this cache keeps the answers in a few lines of the thread's own
//! record instead. 64 entries, direct-mapped by address, each tagged with
//! two things:
//! - the loader counts of the table its rule came from, so a rule from a
//!   table the collector has since replaced (after a `dlopen` or a
//!   `dlclose`) is never used: the counts only grow, so no two tables share
//!   them;
//! - the range map's change sequence read before the walk that found no
//!   section at the address: while the sequence reads the same (and even),
//!   no section has been added or removed, so the address is still outside
//!   every heap and image, and the handler skips the range map for it
//!   ([`RuleCache::native`]).

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
    /// The range map's change sequence before the walk that found `at`
    /// outside every section.
    seq: u64,
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
                    seq: 0,
                    rule: Err(StackEnd::NoUnwindInfo),
                }; ENTRIES],
            ),
        }
    }
}

impl RuleCache {
    /// The entry `at` maps to. Fibonacci hashing: the top bits of the
    /// product spread nearby return addresses over the entries.
    #[inline]
    fn slot(&self, at: usize) -> *mut Entry {
        let hash = at.wrapping_mul(0x9E37_79B9_7F4A_7C15_u64 as usize);
        let index = hash >> (usize::BITS - ENTRIES.trailing_zeros());
        // In bounds: `index` has the log2(ENTRIES) top bits of the hash.
        self.entries.get().cast::<Entry>().wrapping_add(index)
    }

    /// `table`'s rule at `at` when `at` is known to be native code: its
    /// entry came from this table, and from a walk that found no section
    /// after the range map's sequence read `seq`, which is even. `None`:
    /// the caller classifies `at` through the range map.
    ///
    /// # Safety
    /// The caller is the owning thread's one sample producer.
    #[inline]
    pub(crate) unsafe fn native(
        &self,
        table: &ModuleTable,
        at: usize,
        seq: u64,
    ) -> Option<Result<Rule, StackEnd>> {
        // SAFETY: `slot` points at one of the entries (in bounds, aligned,
        // initialized); by the caller's contract no other reference to the
        // entries exists while this one lives.
        let slot = unsafe { &*self.slot(at) };
        (seq & 1 == 0 && slot.at == at && slot.seq == seq && slot.loader == table.loader())
            .then_some(slot.rule)
    }

    /// `table`'s rule at `at`, a native frame: a walk of the range map,
    /// after its sequence read `seq`, found no section there. From the
    /// cache when the entry for `at` came from this table; the entry keeps
    /// `seq` for [`RuleCache::native`].
    ///
    /// # Safety
    /// The caller is the owning thread's one sample producer.
    #[inline]
    pub(crate) unsafe fn rule(
        &self,
        table: &ModuleTable,
        at: usize,
        seq: u64,
    ) -> Result<Rule, StackEnd> {
        // SAFETY: as in `native`.
        let slot = unsafe { &mut *self.slot(at) };
        let loader = table.loader();
        if slot.at != at || slot.loader != loader {
            *slot = Entry {
                at,
                loader,
                seq,
                rule: table.rule(at),
            };
        }
        slot.seq = seq;
        slot.rule
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
                assert_eq!(unsafe { cache.rule(&table, at, 2) }, table.rule(at));
            }
        }
        assert!(table.rule(here).is_ok());
        // SAFETY: as above.
        assert_eq!(
            unsafe { cache.rule(&other, here, 2) },
            Err(StackEnd::NoUnwindInfo)
        );
        // SAFETY: as above.
        assert_eq!(unsafe { cache.rule(&table, here, 2) }, table.rule(here));
    }

    /// An address is known native only at the even sequence its walk read
    /// (the range map unchanged since) and under the table its rule came
    /// from; a later walk at a new sequence makes it known at that one.
    #[test]
    fn an_address_is_known_native_only_while_the_range_map_is_unchanged() {
        let table = ModuleTable::load(None);
        let other = ModuleTable::empty((table.loader().0 + 1, table.loader().1));
        let cache = RuleCache::default();
        let here =
            an_address_is_known_native_only_while_the_range_map_is_unchanged as *const () as usize;
        // SAFETY: this test is the cache's only user (and the closures' calls
        // are one at a time).
        let native = |t: &ModuleTable, at: usize, seq: u64| unsafe { cache.native(t, at, seq) };
        // SAFETY: as above.
        let rule = |t: &ModuleTable, at: usize, seq: u64| unsafe { cache.rule(t, at, seq) };
        assert_eq!(native(&table, here, 4), None);
        assert_eq!(rule(&table, here, 4), table.rule(here));
        assert_eq!(native(&table, here, 4), Some(table.rule(here)));
        // A change began (odd) or ended (6) since: not known.
        assert_eq!(native(&table, here, 5), None);
        assert_eq!(native(&table, here, 6), None);
        // Another table, or another address in the same entry: not known.
        assert_eq!(native(&other, here, 4), None);
        assert_eq!(native(&table, here + 1, 4), None);
        // A walk at 6 found it native again: known at 6, no longer at 4.
        assert_eq!(rule(&table, here, 6), table.rule(here));
        assert_eq!(native(&table, here, 6), Some(table.rule(here)));
        assert_eq!(native(&table, here, 4), None);
        // Stored during a change (odd): never known.
        assert_eq!(rule(&table, here, 7), table.rule(here));
        assert_eq!(native(&table, here, 7), None);
    }
}
