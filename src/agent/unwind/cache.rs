//! A direct-mapped cache of native unwind rules, one per attached thread.
//!
//! Evaluating a native frame's CFI means a binary search of its object's
//! `.eh_frame_hdr`, parsing a CIE and an FDE, and running the FDE's
//! instructions up to the address: hundreds of nanoseconds. The host's
//! frames repeat from sample to sample, so each thread keeps the last rule
//! found at each of [`SLOTS`] hashed addresses. An entry holds the module
//! table's generation: a table rebuilt after a `dlopen` or `dlclose` misses
//! every older entry. JIT frames are not cached here: their code, and so
//! their rules, can change at the same address.

use super::{Rule, StackEnd};

/// Entries per thread (16 KiB of rules and keys).
pub(crate) const SLOTS: usize = 512;

#[derive(Clone, Copy)]
struct Entry {
    at: usize,
    /// 0: empty (tables are numbered from 1).
    generation: u64,
    rule: Result<Rule, StackEnd>,
}

const EMPTY: Entry = Entry {
    at: 0,
    generation: 0,
    rule: Err(StackEnd::NoUnwindInfo),
};

/// The cache. Allocated when a thread attaches; the handler only reads and
/// overwrites entries.
pub(crate) struct RuleCache {
    entries: Box<[Entry; SLOTS]>,
}

impl RuleCache {
    pub(crate) fn new() -> Self {
        Self {
            entries: Box::new([EMPTY; SLOTS]),
        }
    }

    /// The rule at `at` under table `generation`: the cached one, or
    /// `evaluate`'s answer, then cached (failures too: an address without
    /// unwind info stays without it until the table changes).
    #[inline]
    pub(crate) fn get_or(
        &mut self,
        at: usize,
        generation: u64,
        evaluate: impl FnOnce() -> Result<Rule, StackEnd>,
    ) -> Result<Rule, StackEnd> {
        // Fibonacci hashing: the top bits of the product mix every bit of
        // the address, so nearby return addresses spread over the slots.
        let slot = (at as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SLOTS.trailing_zeros());
        let entry = &mut self.entries[slot as usize];
        if entry.at == at && entry.generation == generation {
            return entry.rule;
        }
        let rule = evaluate();
        *entry = Entry {
            at,
            generation,
            rule,
        };
        rule
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hit_does_not_evaluate_and_a_new_generation_misses() {
        let mut cache = RuleCache::new();
        let mut evaluated = 0;
        for _ in 0..3 {
            let rule = cache.get_or(0x1234, 1, || {
                evaluated += 1;
                Ok(Rule::AT_ENTRY)
            });
            assert_eq!(rule, Ok(Rule::AT_ENTRY));
        }
        assert_eq!(evaluated, 1);
        let rule = cache.get_or(0x1234, 2, || {
            evaluated += 1;
            Err(StackEnd::NoUnwindInfo)
        });
        assert_eq!((rule, evaluated), (Err(StackEnd::NoUnwindInfo), 2));
        // The failure is cached too.
        let rule = cache.get_or(0x1234, 2, || unreachable!("cached"));
        assert_eq!(rule, Err(StackEnd::NoUnwindInfo));
    }
}
