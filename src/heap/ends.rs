//! The end map's storage: the heap's end words (see `end_words` for
//! what they hold and how lookups read them) in their own mapping, followed
//! by a trailer with the heap's change sequence and id for readers in other
//! processes.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use super::end_words::{EndWords, RawEnds};
use crate::mapping::AnonMap;
use crate::seq::ChangeSeq;

/// The end map's storage, written under the heap's lock, and its trailer:
/// after the last end word, the heap's change sequence and its id, where a
/// reader in another process finds them from the end map's address and word
/// count alone (see `docs/descriptor.md`).
pub(crate) struct EndMap {
    map: AnonMap,
    words: usize,
}

/// Bytes of the trailer: the change sequence, then the heap id.
const TRAILER: usize = 16;

impl EndMap {
    /// An end map of `words` words (one per 256 bytes of span, as many as the
    /// start map has) for the heap with id `id`.
    pub(crate) fn new(words: usize, id: u64, huge: bool) -> io::Result<Self> {
        let map = AnonMap::new(words * 8 + TRAILER, region::Protection::READ_WRITE, huge)?;
        let ends = Self { map, words };
        // Relaxed: written once, before the heap is shared with anyone.
        ends.trailer_word(1).store(id, Ordering::Relaxed);
        Ok(ends)
    }

    /// Word `n` of the trailer.
    fn trailer_word(&self, n: usize) -> &AtomicU64 {
        // SAFETY: the mapping holds `words` end words and then the 16-byte
        // trailer; it is page-aligned (so every word is 8-aligned), zeroed when
        // mapped, alive as long as `self`, and only accessed atomically.
        unsafe {
            &*self
                .map
                .base()
                .as_ptr()
                .cast::<AtomicU64>()
                .add(self.words + n)
        }
    }

    /// The heap's change sequence, in the trailer.
    pub(crate) fn seq(&self) -> &ChangeSeq {
        let word: *const AtomicU64 = self.trailer_word(0);
        // SAFETY: `ChangeSeq` is a transparent `AtomicU64`; the word lives as
        // long as `self`.
        unsafe { &*word.cast::<ChangeSeq>() }
    }

    /// The end words themselves (the trailer excluded).
    fn words(&self) -> &[AtomicU64] {
        // SAFETY: the mapping holds `words` end words from its page-aligned
        // (so 8-aligned) base, zeroed when mapped, alive as long as `self`,
        // and only accessed atomically.
        unsafe { std::slice::from_raw_parts(self.map.base().as_ptr().cast(), self.words) }
    }

    /// The writer's side, for the heap's lock holder.
    pub(crate) fn writer(&self) -> EndWords<'_> {
        EndWords::new(self.words())
    }

    /// The read side.
    pub(crate) fn raw(&self) -> RawEnds {
        // SAFETY: the words live as long as the heap that owns this map, and
        // the heap's lookups ask only about offsets in its span (a word per
        // 256 bytes).
        unsafe { RawEnds::over(self.words()) }
    }

    /// Bytes of the mapping resident in memory.
    pub(crate) fn resident_bytes(&self) -> io::Result<usize> {
        self.map.resident_bytes()
    }

    /// Bytes reserved (resident or not), the trailer included.
    pub(crate) fn reserved_bytes(&self) -> usize {
        self.words * 8 + TRAILER
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::Relaxed;

    use super::EndMap;
    use crate::heap::end_words::{BUCKET, PREV_END, RUNS_ON, WORD_BYTES};

    /// The loop-free v2 checks against the model (a block's last byte) and
    /// the looping scan, for every address a v2 start map would attribute to
    /// each block of random layouts that keep the allocator's rule (no block
    /// starts in the bucket where the previous one ends).
    #[test]
    fn loop_free_checks_agree_with_the_scan_on_allocator_layouts() {
        const WORDS: usize = 96;
        let span = WORDS as u64 * WORD_BYTES;
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = |below: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % below
        };
        // Addresses checked through each branch: own word, previous word's
        // start, previous word covered; and of the last, those past a block
        // that ended at the previous word's last byte (the `PREV_END` bit).
        let mut checked = [0u64; 4];
        for _ in 0..40 {
            let map = EndMap::new(WORDS, 1, false).unwrap();
            let ends = map.raw();
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
                map.writer().mark(start, size, next(3) == 0);
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
        let map = EndMap::new(4, 1, false).unwrap();
        let ends = map.raw();
        map.writer().mark(260, 40, false); // bytes 260..=299, in word 1
        map.writer().mark(400, 300, false); // bytes 400..=699, from word 1 into 2
        // SAFETY: offsets inside the 1024-byte span, the starts in word 1.
        unsafe {
            assert!(ends.ends_before_from_prev(260, 600));
            assert!(ends.ends_before_from_prev(260, 512));
            assert!(!ends.ends_before_from_prev(400, 600));
            assert!(!ends.ends_before_from_prev(400, 699));
            assert!(ends.ends_before_from_prev(400, 700));
        }
        map.writer().clear(400, 300);
        // Relaxed: this thread wrote the map.
        assert_eq!(map.writer().word(512).load(Relaxed), 0);
        // Word 2 exactly, from its bucket 0: it ends on its own word's last
        // byte, so word 3's bit 6 of byte 0 stays clear (as `PREV_END` it is
        // only for a block that covered word 2 from before; as `RUNS_ON` it
        // would say this block goes on).
        map.writer().mark(512, 256, false);
        // Relaxed: as above.
        assert_eq!(map.writer().word(768).load(Relaxed), 0);
        // SAFETY: as above; the start lies in word 2.
        assert!(unsafe { ends.ends_before_from_prev(512, 768) });
    }

    #[test]
    fn ends_are_found_exactly_and_cleared() {
        let map = EndMap::new(16, 7, false).unwrap();
        let ends = map.raw();
        map.writer().mark(48, 100, false); // last byte 147
        map.writer().mark(304, 1000, true); // last byte 1303, stub
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
        assert_eq!(map.writer().word(512).load(Relaxed), RUNS_ON << 8);
        // Relaxed: as above.
        assert_eq!(map.writer().word(768).load(Relaxed), 0);
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
        map.writer().mark(1536, 512, false);
        // Relaxed: this thread wrote the map.
        assert_eq!(map.writer().word(2048).load(Relaxed), PREV_END);
        // Relaxed: as above.
        assert_eq!(map.writer().word(1792).load(Relaxed), RUNS_ON | 32 << 56);
        // SAFETY: offsets inside the span.
        unsafe {
            assert!(!ends.ends_before_from_prev(1536, 1792));
            assert!(!ends.ends_before_from_prev(1536, 2047));
        }
        // SAFETY: word 7 is the block's pointer word, before 2048's.
        assert!(unsafe { ends.ends_before_after_covered(2048) });
        map.writer().clear(1536, 512);
        // Relaxed: as above.
        assert_eq!(map.writer().word(2048).load(Relaxed), 0);
        // Relaxed: as above.
        assert_eq!(map.writer().word(1792).load(Relaxed), 0);
        // SAFETY: as above.
        assert!(!unsafe { ends.ends_before_after_covered(2048) });
        // Covering word 7 and ending in word 8 at 2135: inside up to there.
        map.writer().mark(1536, 600, false);
        // SAFETY: word 7 is the block's pointer word, before word 8's
        // addresses.
        unsafe {
            assert!(!ends.ends_before_after_covered(2048));
            assert!(!ends.ends_before_after_covered(2135));
            assert!(ends.ends_before_after_covered(2136));
        }
        map.writer().clear(1536, 600);
        // Relaxed: as above.
        assert_eq!(map.writer().word(1792).load(Relaxed), 0);
        // Relaxed: as above.
        assert_eq!(map.writer().word(2048).load(Relaxed), 0);
        // A block ending at the span's last byte has no next word to mark: its
        // end byte lands in word 15's last byte, and the trailer after word 15
        // (the change sequence first) stays untouched.
        map.writer().mark(3840, 256, false);
        // Relaxed: as above.
        assert_eq!(map.writer().word(3840).load(Relaxed), 32 << 56);
        // Relaxed: as above.
        assert_eq!(map.trailer_word(0).load(Relaxed), 0);
        map.writer().clear(3840, 256);
        // Relaxed: as above.
        assert_eq!(map.writer().word(3840).load(Relaxed), 0);
        map.writer().clear(304, 1000);
        // Relaxed: as above.
        assert_eq!(map.writer().word(512).load(Relaxed), 0);
        // SAFETY: as above.
        unsafe {
            assert!(!ends.ends_between(304, 4095));
            assert!(!ends.is_stub(304));
            assert!(ends.ends_between(0, 4095));
        }
        assert_eq!(map.reserved_bytes(), 128 + 16);
        // Relaxed: this thread wrote the id; no other thread is involved.
        assert_eq!(map.trailer_word(1).load(Relaxed), 7);
    }
}
