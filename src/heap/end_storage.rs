//! The end map's storage: the heap's end words (see `end_words` for
//! what they hold and how lookups read them) in their own mapping, followed
//! by a trailer with the heap's change sequence and id for readers in other
//! processes.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use super::end_words::{EndWords, RawEnds};
use crate::change_seq::ChangeSeq;
use crate::mapping::AnonMap;

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

    /// The writer and the read side address the same words in the mapping,
    /// and the trailer follows them: a block ending on the span's last byte
    /// leaves the change sequence alone. (What the words hold is tested in
    /// `end_words`, over plain memory.)
    #[test]
    fn the_trailer_follows_the_words() {
        let map = EndMap::new(16, 7, false).unwrap();
        map.writer().mark(3840, 256, true);
        // Relaxed: this thread wrote the map; no other thread is involved.
        assert_eq!(map.writer().word(3840).load(Relaxed), 0x80 | 32 << 56);
        // SAFETY: offsets inside the 4096-byte span of the live map.
        unsafe {
            assert!(map.raw().is_stub(3840));
            assert!(!map.raw().ends_between(3840, 4095));
            assert!(!map.raw().ends_between(0, 3839));
        }
        // Relaxed: as above.
        assert_eq!(map.trailer_word(0).load(Relaxed), 0);
        // Relaxed: as above.
        assert_eq!(map.trailer_word(1).load(Relaxed), 7);
        assert_eq!(map.reserved_bytes(), 128 + 16);
        map.writer().clear(3840, 256);
        // Relaxed: as above.
        assert_eq!(map.writer().word(3840).load(Relaxed), 0);
    }
}
