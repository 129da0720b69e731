//! The end map's words: where each block ends, beside the nibble map that says
//! where it starts, so that a lookup is exact without reading code memory:
//! what a writer marks and clears, and the checks a lookup runs. The words live
//! anywhere: in the heap's mapping (`ends`), copied out of another
//! process, or in loom's atomics (this file is built alone under `--cfg loom`,
//! so the models in `loom-tests/` run these checks as they ship).
//!
//! One byte per 32-byte bucket, eight to a 64-bit word (the same 256 bytes of
//! code as one nibble-map word). Bits 0–5 hold the offset of the last code byte
//! of a block ending in the bucket, plus one (0: none ends there); bit 7 says a
//! stub starts in the bucket. Bit 6 lets a v2 lookup whose start lies in the
//! previous word read one end word, not two: bit 6 of byte `j` says the block
//! that starts in bucket `j` of the previous word runs into this word (for a
//! start named by a nibble there), and bit 6 of byte 0 also says a block that
//! covered the whole previous word ended at its last byte (for a start named
//! by a pointer there; see [`RUNS_ON`] for why the two never meet). The
//! allocator pads every extent so that no two blocks end in one bucket and no
//! block starts in the bucket where the previous one ends, so one byte per
//! bucket is enough.
//!
//! A lookup that the start map answers with start `S` for address `A`, without
//! a v2 pointer word proving `A` inside, asks: is the first end at or after `S`
//! (which is `S`'s own) before `A`? In v2 the start map only names `S` from `A`'s word or
//! the word before (a nibble there, or a pointer word covering it), and bit
//! 6 carries what the word before would say into `A`'s: one end word
//! answers. The .NET map words are untouched.

use crate::nibble::V2Origin;
use crate::sync::{AtomicU64, Ordering};

/// Code bytes one end word covers.
pub(crate) const WORD_BYTES: u64 = 256;
/// Code bytes one end byte covers.
pub(crate) const BUCKET: u64 = 32;
/// Bit 7 of an end byte: a stub starts in this bucket.
const STUB: u64 = 0x80;
/// Bits 0–5 of an end byte: last byte's offset + 1.
const END: u64 = 0x3F;
/// Bit 6 of an end byte: the block that starts in this bucket of the
/// previous word runs into this word (its last byte lies here or further).
/// Scans (here and in other processes) mask it out with [`END`].
///
/// It names the block by its start's bucket, rather than flagging that some
/// block runs on, because a flag would vouch for whichever start a reader
/// found: a block being published marks the end map before the start map
/// shows its start, and a freed block's marks stay until its extent is
/// reclaimed, so a reader that found an earlier start in the same word would
/// take the flag for its own. A bucket holds at most one start among the
/// blocks live, being published or awaiting reclamation (the allocator's
/// padding), so a bit for the reader's bucket is its block's.
///
/// Byte 0's bit is shared with [`PREV_END`]. A reader asks it as `RUNS_ON`
/// only when the start map named a start in bucket 0 of the previous word,
/// and as `PREV_END` only when a pointer there named a block that covers that
/// whole word: one reserved extent cannot hold both, and `PREV_END` is set
/// only by a block that started before the word whose last byte it ends on.
pub(crate) const RUNS_ON: u64 = 0x40;
/// Bit 6 of a word's first byte: a block that started before the previous
/// word ended at that word's last byte. Scans mask it out with [`END`].
pub(crate) const PREV_END: u64 = 0x40;

/// [`RUNS_ON`] in every byte: what a reader would test if the bit were the
/// plain flag "some block runs on" (the seeded defect `RunsOnAnyBucket`,
/// switched on only in loom builds).
const RUNS_ON_ANY: u64 = u64::from_ne_bytes([RUNS_ON as u8; 8]);

/// The writer's side of a heap's end words: marks and clears, made under the
/// heap's lock (its only writer), in words that readers load at any time.
#[derive(Clone, Copy)]
pub struct EndWords<'a>(&'a [AtomicU64]);

impl<'a> EndWords<'a> {
    /// The writer's side of `words`, one per 256 bytes of span from offset 0.
    pub fn new(words: &'a [AtomicU64]) -> Self {
        Self(words)
    }

    /// The word covering `offset`, which must lie in the span.
    pub(crate) fn word(self, offset: u64) -> &'a AtomicU64 {
        let index = (offset / WORD_BYTES) as usize;
        assert!(
            index < self.0.len(),
            "end map offset {offset:#x} out of range"
        );
        &self.0[index]
    }

    /// Marks a block of `size` bytes (at least 1) at offset `start`, before
    /// the start map publishes it.
    ///
    /// # Panics
    /// If the block does not lie in the span: the heap's allocator only
    /// places blocks inside it.
    pub fn mark(self, start: u64, size: u64, stub: bool) {
        let last = start + size.max(1) - 1;
        self.update(last, |w| w | ((last % BUCKET) + 1) << shift(last));
        if self.ends_a_word(start, last) {
            self.update(last + 1, |w| w | PREV_END);
        }
        if stub {
            self.update(start, |w| w | STUB << shift(start));
        }
        if let Some(next) = next_word(start, last) {
            self.update(next, |w| w | RUNS_ON << shift(start));
        }
    }

    /// Clears a block's marks when its extent is reclaimed (no reader can
    /// still be looking at it), or when the start map refused it.
    ///
    /// # Panics
    /// As [`EndWords::mark`].
    pub fn clear(self, start: u64, size: u64) {
        let last = start + size.max(1) - 1;
        self.update(last, |w| w & !(END << shift(last)));
        if self.ends_a_word(start, last) {
            self.update(last + 1, |w| w & !PREV_END);
        }
        self.update(start, |w| w & !(STUB << shift(start)));
        if let Some(next) = next_word(start, last) {
            self.update(next, |w| w & !(RUNS_ON << shift(start)));
        }
    }

    /// Whether a block from `start` to `last` ends on the last byte of a word
    /// that it covers whole and that another word follows: where it sets
    /// [`PREV_END`] in the next word.
    fn ends_a_word(self, start: u64, last: u64) -> bool {
        last % WORD_BYTES == WORD_BYTES - 1
            && next_word(start, last).is_some()
            && last / WORD_BYTES + 1 < self.0.len() as u64
    }

    /// Rewrites the word covering `offset`. A load and a store, not a
    /// read-modify-write instruction: the heap's lock makes its holder the only
    /// writer.
    fn update(self, offset: u64, f: impl FnOnce(u64) -> u64) {
        let word = self.word(offset);
        // Relaxed (both): readers see a mark through the start map's Release
        // store that follows it (they load after their Acquire load of the map
        // word), and a cleared mark only after the grace period that separates
        // the block's lookups from its reclamation.
        word.store(f(word.load(Ordering::Relaxed)), Ordering::Relaxed);
    }
}

/// The first byte of the word after `start`'s, when the block from `start`
/// to `last` runs into it: where the block sets [`RUNS_ON`].
fn next_word(start: u64, last: u64) -> Option<u64> {
    let next = start - start % WORD_BYTES + WORD_BYTES;
    (last >= next).then_some(next)
}

/// Bit position of the byte for `offset`'s bucket within its word.
#[inline(always)]
fn shift(offset: u64) -> u64 {
    (offset % WORD_BYTES) / BUCKET * 8
}

/// Each bucket's end offset + 1 (0: none ends there), stub flags dropped.
const ENDS: u64 = u64::from_ne_bytes([END as u8; 8]);

/// For each bucket, the end bits (stub flags dropped) of the buckets before
/// it. A table: one load where a shifted mask took three instructions, and
/// the mask comes with the stub flags already dropped.
const ENDS_BELOW: [u64; 8] = {
    let mut table = [0; 8];
    let mut bucket = 1;
    while bucket < 8 {
        table[bucket] = ENDS & ((1 << (8 * bucket)) - 1);
        bucket += 1;
    }
    table
};

/// [`ENDS_BELOW`] with [`PREV_END`]: what a block covering the previous word
/// can have left in the address's word before the address's bucket.
const COVERED_BELOW: [u64; 8] = {
    let mut table = ENDS_BELOW;
    let mut bucket = 0;
    while bucket < 8 {
        table[bucket] |= PREV_END;
        bucket += 1;
    }
    table
};

/// `table`'s mask for `a`'s bucket ([`ENDS_BELOW`] or [`COVERED_BELOW`]).
#[inline(always)]
fn below(table: &[u64; 8], a: u64) -> u64 {
    // Indexed through `shift`, which the in-bucket test computes anyway.
    table[(shift(a) / 8) as usize]
}

/// Whether `word` marks an end in `a`'s bucket before `a` (the bucket's stub
/// and previous-end flags are masked off here). An end byte `e` marks the
/// last byte at `e - 1` in its bucket; 0 wraps past every bound.
#[inline(always)]
fn ends_in_bucket_before(word: u64, a: u64) -> bool {
    ((word >> shift(a)) & END).wrapping_sub(1) < a % BUCKET
}

/// The end map's read side: a copyable pointer, like the start map's.
#[derive(Clone, Copy, Debug)]
pub struct RawEnds {
    base: *const AtomicU64,
}

impl RawEnds {
    /// A view of the end words `words`: offset 0 is the first. The heap reads
    /// its own map through it, and the remote reader the words it copied out
    /// of another process.
    ///
    /// # Safety
    /// `words` outlives every use of the view, and every offset it is asked
    /// about lies within `words.len()` words.
    pub unsafe fn over(words: &[AtomicU64]) -> Self {
        Self {
            base: words.as_ptr(),
        }
    }

    /// The end word covering `offset`.
    ///
    /// # Safety
    /// `offset` lies inside the heap's span, and the heap is alive.
    #[inline]
    unsafe fn load(self, offset: u64) -> u64 {
        // SAFETY: the caller's contract; the map has a word per 256 bytes of span.
        // Relaxed: ordered after the caller's Acquire load of the start-map word
        // that named the block (the writer marks before it publishes).
        unsafe { (*self.base.add((offset / WORD_BYTES) as usize)).load(Ordering::Relaxed) }
    }

    /// Whether the first block end at or after `lo` comes before `a`: with
    /// `lo` at a block's start (or inside it), whether that block ends before
    /// `a`. Reads the end words from `lo`'s forward, stopping at the first end
    /// or at `a`'s word: in v2 at most two; in v1 as many as the block is long
    /// (not as far as `a` is: an address in freed space far past a small block
    /// costs one or two words).
    ///
    /// # Safety
    /// `lo <= a`, both inside the span of a live heap.
    #[inline]
    pub unsafe fn ends_between(self, lo: u64, a: u64) -> bool {
        let mut word_start = lo - lo % WORD_BYTES;
        loop {
            // SAFETY: `word_start` lies between `lo`'s word and `a`'s, in the span.
            let mut bits = unsafe { self.load(word_start) };
            while bits != 0 {
                let byte = bits.trailing_zeros() as u64 / 8;
                let end = (bits >> (byte * 8)) & END;
                bits &= !(0xFF << (byte * 8));
                if end != 0 {
                    let last = word_start + byte * BUCKET + end - 1;
                    if last >= lo {
                        return last < a;
                    }
                }
            }
            word_start += WORD_BYTES;
            if word_start > a {
                return false;
            }
        }
    }

    /// [`RawEnds::ends_between`] for a v2 lookup whose start map named
    /// `start` from `a`'s own word: one end word, no loop. Any end in the
    /// buckets from `start`'s up to `a`'s, or in `a`'s bucket before `a`, is
    /// the block's own: the allocator never starts a block in the bucket where
    /// another ends, so an end in `start`'s bucket lies after `start`.
    ///
    /// # Safety
    /// `start <= a`, both in one word of the span of a live heap.
    #[inline(always)]
    pub unsafe fn ends_before_in_word(self, start: u64, a: u64) -> bool {
        // SAFETY: `a` is inside the span (the caller's contract).
        let word = unsafe { self.load(a) };
        ((word & below(&ENDS_BELOW, a)) >> shift(start)) != 0 || ends_in_bucket_before(word, a)
    }

    /// [`RawEnds::ends_between`] for a v2 lookup whose start map named
    /// `start` from a nibble in the word before `a`'s: one end word, no loop.
    /// The block ended before `a` if [`RUNS_ON`] in `a`'s word is clear for
    /// `start`'s bucket (it ended in its own word, after `start`), or if it
    /// ends in `a`'s word before `a`. Any such end is the block's own: a
    /// later block would start in `a`'s word before `a`, and the start map
    /// would have named it instead.
    ///
    /// # Safety
    /// `start` lies in the word before `a`'s, both inside the span of a live
    /// heap.
    #[inline(always)]
    pub unsafe fn ends_before_from_prev(self, start: u64, a: u64) -> bool {
        // SAFETY: `a` is inside the span (the caller's contract).
        let word = unsafe { self.load(a) };
        // `RUNS_ON` tested inverted: clear for `start`'s bucket, it ended in
        // its own word.
        let ended_in_own_word = if crate::sync::defect!(RunsOnAnyBucket) {
            u64::from(word & RUNS_ON_ANY == 0)
        } else {
            (!word >> shift(start)) & RUNS_ON
        };
        ended_in_own_word | (word & below(&ENDS_BELOW, a)) != 0 || ends_in_bucket_before(word, a)
    }

    /// [`RawEnds::ends_before_from_prev`] when a pointer in the word before
    /// `a`'s named the start: the block covers that whole word, so it can only
    /// have ended at that word's last byte (which [`PREV_END`] in `a`'s word
    /// records) or in `a`'s word. One end word.
    ///
    /// # Safety
    /// `a` lies inside the span of a live heap.
    #[inline(always)]
    pub unsafe fn ends_before_after_covered(self, a: u64) -> bool {
        // SAFETY: `a` is inside the span (the caller's contract).
        let word = unsafe { self.load(a) };
        (word & below(&COVERED_BELOW, a)) != 0 || ends_in_bucket_before(word, a)
    }

    /// Whether the block at `start`, which a v2 start map named for `offset`
    /// from the word `origin` says, ends before `offset`: the check for that
    /// origin (see [`V2Origin`]), over one end word at most.
    ///
    /// # Safety
    /// `start <= offset`, both inside the span of a live heap, and `origin`
    /// is where the start map found `start`.
    #[inline(always)]
    pub unsafe fn ended(self, offset: u64, start: u64, origin: V2Origin) -> bool {
        // SAFETY (each check): the caller's contract; the origin says which
        // word holds `start` (a nibble in `offset`'s word or the one before),
        // or that a pointer in the word before names it (the block covers
        // that word).
        match origin {
            V2Origin::Covered => false,
            V2Origin::OwnWord => unsafe { self.ends_before_in_word(start, offset) },
            V2Origin::PrevWord => unsafe { self.ends_before_from_prev(start, offset) },
            V2Origin::PrevCovered => unsafe { self.ends_before_after_covered(offset) },
        }
    }

    /// Whether the block starting at `start` is a stub.
    ///
    /// # Safety
    /// `start` is a start the start map named, in a live heap.
    #[inline]
    pub unsafe fn is_stub(self, start: u64) -> bool {
        // SAFETY: the caller's contract.
        (unsafe { self.load(start) } >> shift(start)) & STUB != 0
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;
    use std::sync::atomic::Ordering::Relaxed;

    use super::{BUCKET, EndWords, PREV_END, RUNS_ON, RawEnds, WORD_BYTES};
    use crate::test_rng::Xorshift;

    /// `n` zeroed end words, in plain memory (so that miri can run these
    /// tests; the heap's own words live in a mapping, see `ends`).
    fn words(n: usize) -> Vec<AtomicU64> {
        (0..n).map(|_| AtomicU64::new(0)).collect()
    }

    /// The read side of `words`, which outlives it in each test.
    fn raw(words: &[AtomicU64]) -> RawEnds {
        // SAFETY: every test keeps `words` alive while it uses the view, and
        // asks only about offsets in its span.
        unsafe { RawEnds::over(words) }
    }

    /// The loop-free v2 checks against the model (a block's last byte) and
    /// the looping scan, for every address a v2 start map would attribute to
    /// each block of random layouts that keep the allocator's rule (no block
    /// starts in the bucket where the previous one ends).
    #[test]
    fn loop_free_checks_agree_with_the_scan_on_allocator_layouts() {
        const WORDS: usize = 96;
        let span = WORDS as u64 * WORD_BYTES;
        let mut rng = Xorshift::new(0x9E37_79B9_7F4A_7C15);
        let mut next = |below: u64| rng.below(below);
        // Addresses checked through each branch: own word, previous word's
        // start, previous word covered; and of the last, those past a block
        // that ended at the previous word's last byte (the `PREV_END` bit).
        let mut checked = [0u64; 4];
        for _ in 0..40 {
            let map = words(WORDS);
            let ends = raw(&map);
            let w = EndWords::new(&map);
            let mut blocks = Vec::new();
            let mut from = 0;
            loop {
                let start = from + next(80) * 4;
                let size = if next(4) == 0 {
                    1 + next(1500)
                } else {
                    1 + next(120)
                };
                if start + size > span {
                    break;
                }
                w.mark(start, size, next(3) == 0);
                let last = start + size - 1;
                blocks.push((start, last));
                from = (last / BUCKET + 1) * BUCKET;
            }
            for (i, &(start, last)) in blocks.iter().enumerate() {
                let next_start = blocks.get(i + 1).map_or(span, |b| b.0);
                for a in start..next_start {
                    let (a_word, s_word) = (a / WORD_BYTES, start / WORD_BYTES);
                    let prev_base = a_word.wrapping_sub(1).wrapping_mul(WORD_BYTES);
                    // Where a v2 map would find `start` for `a`, and the
                    // matching check; `None` when it would not (or proves `a`
                    // inside without the end map).
                    // SAFETY: every offset lies in the span of the live map,
                    // and each call meets its check's word contract.
                    let fast = unsafe {
                        if a_word == s_word {
                            Some((0, ends.ends_before_in_word(start, a)))
                        } else if a_word == s_word + 1 {
                            Some((1, ends.ends_before_from_prev(start, a)))
                        } else if prev_base > start && prev_base + WORD_BYTES - 1 <= last {
                            // A pointer in the previous word; `a`'s word is
                            // not one (the block does not cover it whole).
                            (last < a_word * WORD_BYTES + WORD_BYTES - 1)
                                .then(|| (2, ends.ends_before_after_covered(a)))
                        } else {
                            None
                        }
                    };
                    if let Some((branch, fast)) = fast {
                        // SAFETY: as above.
                        let scan = unsafe { ends.ends_between(start, a) };
                        assert_eq!(fast, last < a, "block {start}..={last}, address {a}");
                        assert_eq!(scan, last < a, "scan: block {start}..={last}, address {a}");
                        checked[branch] += 1;
                        if branch == 2 && last == prev_base + WORD_BYTES - 1 {
                            checked[3] += 1;
                        }
                    }
                }
            }
        }
        // Every layout is the same for this fixed seed: a changed count means
        // the test stopped checking what it did.
        assert_eq!(checked, EXPECTED_CHECKS);
    }
    const EXPECTED_CHECKS: [u64; 4] = [282_200, 344_352, 99_456, 728];

    /// A block that runs into the next word vouches for itself only: not for
    /// an earlier start in its word, which a reader finds while the runner is
    /// being published (marked, its start not yet in the start map) or after
    /// it was freed (its start gone, its marks kept until reclamation).
    #[test]
    fn a_block_that_runs_on_vouches_only_for_itself() {
        let map = words(4);
        let ends = raw(&map);
        let w = EndWords::new(&map);
        w.mark(260, 40, false); // bytes 260..=299, in word 1
        w.mark(400, 300, false); // bytes 400..=699, from word 1 into 2
        // SAFETY: offsets inside the 1024-byte span, the starts in word 1.
        unsafe {
            assert!(ends.ends_before_from_prev(260, 600));
            assert!(ends.ends_before_from_prev(260, 512));
            assert!(!ends.ends_before_from_prev(400, 600));
            assert!(!ends.ends_before_from_prev(400, 699));
            assert!(ends.ends_before_from_prev(400, 700));
        }
        w.clear(400, 300);
        // Relaxed: this thread wrote the map.
        assert_eq!(w.word(512).load(Relaxed), 0);
        // Word 2 exactly, from its bucket 0: it ends on its own word's last
        // byte, so word 3's bit 6 of byte 0 stays clear (as `PREV_END` it is
        // only for a block that covered word 2 from before; as `RUNS_ON` it
        // would say this block goes on).
        w.mark(512, 256, false);
        // Relaxed: as above.
        assert_eq!(w.word(768).load(Relaxed), 0);
        // SAFETY: as above; the start lies in word 2.
        assert!(unsafe { ends.ends_before_from_prev(512, 768) });
    }

    #[test]
    fn ends_are_found_exactly_and_cleared() {
        let map = words(16);
        let ends = raw(&map);
        let w = EndWords::new(&map);
        w.mark(48, 100, false); // last byte 147
        w.mark(304, 1000, true); // last byte 1303, stub
        // SAFETY: offsets inside the 4096-byte span.
        unsafe {
            assert!(!ends.ends_between(48, 147));
            assert!(ends.ends_between(48, 148));
            assert!(ends.ends_between(100, 300));
            assert!(!ends.ends_between(148, 1303));
            assert!(ends.ends_between(304, 1304));
            assert!(ends.is_stub(304) && !ends.is_stub(48));
            assert!(ends.ends_between(0, 4095));
        }
        // 304..=1303 runs out of word 1: word 2 says so, and only word 2.
        // Relaxed: this thread wrote the map.
        assert_eq!(w.word(512).load(Relaxed), RUNS_ON << 8);
        // Relaxed: as above.
        assert_eq!(w.word(768).load(Relaxed), 0);
        // SAFETY: offsets inside the span.
        unsafe {
            // 304..=1303 runs on into word 2, with no end in it: inside, at
            // any byte.
            assert!(!ends.ends_before_from_prev(304, 512));
            assert!(!ends.ends_before_from_prev(304, 767));
            // 48..=147 never left word 0: nothing runs on into word 1.
            assert!(ends.ends_before_from_prev(48, 256));
        }
        // Last byte 2047, word 7's last: the flag goes in word 8's first byte,
        // and the block runs from word 6 into 7.
        w.mark(1536, 512, false);
        // Relaxed: this thread wrote the map.
        assert_eq!(w.word(2048).load(Relaxed), PREV_END);
        // Relaxed: as above.
        assert_eq!(w.word(1792).load(Relaxed), RUNS_ON | 32 << 56);
        // SAFETY: offsets inside the span.
        unsafe {
            assert!(!ends.ends_before_from_prev(1536, 1792));
            assert!(!ends.ends_before_from_prev(1536, 2047));
        }
        // SAFETY: word 7 is the block's pointer word, before 2048's.
        assert!(unsafe { ends.ends_before_after_covered(2048) });
        w.clear(1536, 512);
        // Relaxed: as above.
        assert_eq!(w.word(2048).load(Relaxed), 0);
        // Relaxed: as above.
        assert_eq!(w.word(1792).load(Relaxed), 0);
        // SAFETY: as above.
        assert!(!unsafe { ends.ends_before_after_covered(2048) });
        // Covering word 7 and ending in word 8 at 2135: inside up to there.
        w.mark(1536, 600, false);
        // SAFETY: word 7 is the block's pointer word, before word 8's
        // addresses.
        unsafe {
            assert!(!ends.ends_before_after_covered(2048));
            assert!(!ends.ends_before_after_covered(2135));
            assert!(ends.ends_before_after_covered(2136));
        }
        w.clear(1536, 600);
        // Relaxed: as above.
        assert_eq!(w.word(1792).load(Relaxed), 0);
        // Relaxed: as above.
        assert_eq!(w.word(2048).load(Relaxed), 0);
        // A block ending at the span's last byte has no next word to mark: its
        // end byte lands in word 15's last byte, and nothing past it is
        // touched (`word` would panic there).
        w.mark(3840, 256, false);
        // Relaxed: as above.
        assert_eq!(w.word(3840).load(Relaxed), 32 << 56);
        w.clear(3840, 256);
        // Relaxed: as above.
        assert_eq!(w.word(3840).load(Relaxed), 0);
        w.clear(304, 1000);
        // Relaxed: as above.
        assert_eq!(w.word(512).load(Relaxed), 0);
        // SAFETY: as above.
        unsafe {
            assert!(!ends.ends_between(304, 4095));
            assert!(!ends.is_stub(304));
            assert!(ends.ends_between(0, 4095));
        }
    }
}
