//! A bucket index over an object's sorted unwind rows, so that the handler
//! finds a native frame's row in two or three cache lines, not a binary
//! search over the whole table.
//!
//! A large program has hundreds of thousands of rows (megabytes); a binary
//! search over them touches about 18 lines, nearly all cold when a timer
//! interrupts code that has evicted them, which made `ModuleTable::rule`
//! half the handler's time at 1 kHz on the simulator. The index keeps, for
//! every [`BUCKET`] bytes of the object's code, how many rows start at or
//! below the bucket's first byte: one 4-byte read, then a search among the
//! few rows that start inside the bucket. It costs 4 bytes per 256 bytes of
//! code (1.6 %).

/// Bytes of code per bucket.
pub(crate) const BUCKET: usize = 256;

/// The most buckets an index has per row: past it, the rows are too sparse
/// for an index to pay (or one of them is bogus), and none is made.
const MAX_BUCKETS_PER_ROW: usize = 16;

/// For rows sorted by address: per bucket of [`BUCKET`] bytes from the
/// first row's address, the count of rows at or below the bucket's start.
#[derive(Debug, Default)]
pub(crate) struct RowIndex {
    first: usize,
    counts: Box<[u32]>,
}

impl RowIndex {
    /// The index of `addrs`, sorted ascending. Empty (every lookup searches
    /// the whole table) past `u32::MAX` rows, or when the rows are sparser
    /// than one per [`MAX_BUCKETS_PER_ROW`] buckets: an object's code has
    /// rows every few dozen bytes, and one bogus FDE reaching far past it
    /// must not cost the collector gigabytes of index.
    pub(crate) fn new(addrs: &[usize]) -> Self {
        let (Some(&first), Some(&last)) = (addrs.first(), addrs.last()) else {
            return Self::default();
        };
        let buckets = (last - first) / BUCKET + 1;
        if u32::try_from(addrs.len()).is_err()
            || buckets > addrs.len().saturating_mul(MAX_BUCKETS_PER_ROW)
        {
            return Self::default();
        }
        let mut counts = Vec::with_capacity(buckets);
        let mut i = 0;
        for k in 0..buckets {
            let start = first + k * BUCKET;
            while i < addrs.len() && addrs[i] <= start {
                i += 1;
            }
            counts.push(i as u32);
        }
        Self {
            first,
            counts: counts.into_boxed_slice(),
        }
    }

    /// How many of `addrs` (the slice the index was made from) are at or
    /// below `at`: what `addrs.partition_point(|&a| a <= at)` returns.
    #[inline]
    pub(crate) fn count_at_or_below(&self, addrs: &[usize], at: usize) -> usize {
        if self.counts.is_empty() {
            return addrs.partition_point(|&a| a <= at);
        }
        let Some(offset) = at.checked_sub(self.first) else {
            return 0;
        };
        let k = offset / BUCKET;
        let (lo, hi) = match self.counts.get(k) {
            Some(&lo) => (
                lo as usize,
                self.counts.get(k + 1).map_or(addrs.len(), |&c| c as usize),
            ),
            None => (self.counts[self.counts.len() - 1] as usize, addrs.len()),
        };
        lo + addrs[lo..hi].partition_point(|&a| a <= at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_rng::Xorshift;

    /// Against a plain binary search, on random tables (dense, sparse,
    /// repeated addresses) and addresses inside, between and around them.
    #[test]
    fn counts_what_a_binary_search_counts() {
        let mut rng = Xorshift::new(0x1dec);
        for round in 0..300 {
            let len = rng.below(200) as usize;
            let spread = [1u64, 16, 300, 100_000][round % 4];
            let mut addrs: Vec<usize> = (0..len)
                .map(|_| 0x40_0000 + rng.below(spread * len as u64 + 1) as usize)
                .collect();
            addrs.sort_unstable();
            let index = RowIndex::new(&addrs);
            let hi = addrs.last().copied().unwrap_or(0x40_0000) + 3 * BUCKET;
            for _ in 0..200 {
                let at = 0x40_0000 - 2 * BUCKET + rng.below((hi - 0x40_0000) as u64 + 1) as usize;
                assert_eq!(
                    index.count_at_or_below(&addrs, at),
                    addrs.partition_point(|&a| a <= at),
                    "{addrs:?} at {at:#x}"
                );
            }
            for &a in &addrs {
                for at in [a - 1, a, a + 1] {
                    assert_eq!(
                        index.count_at_or_below(&addrs, at),
                        addrs.partition_point(|&x| x <= at)
                    );
                }
            }
        }
    }

    /// Two rows 512 GiB apart: no 8 GiB index, and the plain search still
    /// counts right.
    #[test]
    fn rows_too_sparse_for_an_index_get_none() {
        let addrs = [0x1000, 0x1000 + (1 << 39)];
        let index = RowIndex::new(&addrs);
        assert!(index.counts.is_empty());
        assert_eq!(
            [0xfff, 0x1000, 0x2000, 0x1000 + (1 << 39)]
                .map(|at| index.count_at_or_below(&addrs, at)),
            [0, 1, 1, 2]
        );
        // Dense enough: indexed.
        let dense: Vec<usize> = (0..64).map(|i| 0x1000 + 40 * i).collect();
        assert_eq!(RowIndex::new(&dense).counts.len(), (63 * 40) / BUCKET + 1);
    }

    #[test]
    fn an_empty_table_counts_nothing() {
        let index = RowIndex::new(&[]);
        assert_eq!(index.count_at_or_below(&[], 5), 0);
        let one = RowIndex::new(&[0x1000]);
        assert_eq!(
            [0xfff, 0x1000, 0x5000].map(|at| one.count_at_or_below(&[0x1000], at)),
            [0, 1, 1]
        );
    }
}
