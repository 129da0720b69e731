//! The writer: set and delete, in the order concurrent readers rely on.

use super::encoding::{
    BUCKET_BYTES, START_ALIGN, WORD_BYTES, bucket_in_word, bucket_shift, decode_pointer,
    encode_pointer, is_pointer, nibble_at, nibble_for, start_offset, word_index,
};
use super::{MapError, MapVersion, MapWriter};
use crate::map_words::WordStore;

impl<S: WordStore> MapWriter<S> {
    /// Records a block `[start, start + size)`.
    ///
    /// Writes the start nibble first, then (v2) the pointer words in ascending
    /// order, so a reader sees either nothing, or a start with a prefix of its
    /// pointers, each of which already names the right start.
    pub fn set(&mut self, start: u64, size: u64) -> Result<(), MapError> {
        self.check_set(start, size, Scan::WholeBlock)?;
        self.write(start, size);
        Ok(())
    }

    /// Records a block that the caller's allocator already keeps disjoint from
    /// every live block. Skips the O(size) overlap scan of [`MapWriter::set`] but
    /// keeps its O(1) checks: size, alignment, range, and the start's own word.
    pub fn set_allocated(&mut self, start: u64, size: u64) -> Result<(), MapError> {
        self.check_set(start, size, Scan::StartWord)?;
        self.write(start, size);
        Ok(())
    }

    /// Whether [`MapWriter::set_allocated`] of the block would succeed; the
    /// map is unchanged either way. A writer that must act between the check
    /// and the store (announce the block) checks first, then stores with
    /// [`MapWriter::set_checked`].
    pub(crate) fn check_allocated(&self, start: u64, size: u64) -> Result<(), MapError> {
        self.check_set(start, size, Scan::StartWord)
    }

    /// Stores a block that [`MapWriter::check_allocated`] accepted, with the
    /// map unchanged since (the caller holds the one writer): it cannot fail.
    pub(crate) fn set_checked(&mut self, start: u64, size: u64) {
        debug_assert_eq!(
            self.check_set(start, size, Scan::StartWord),
            Ok(()),
            "the block was checked, and nothing has changed the map since"
        );
        self.write(start, size);
    }

    fn write(&mut self, start: u64, size: u64) {
        let map = &*self.map;
        let index = word_index(start);
        let shift = bucket_shift(bucket_in_word(start));
        let set_nibble = || {
            let word = map.words.load(index);
            map.words.store(index, word | (nibble_for(start) << shift));
        };
        // The nibble goes first: a reader that found the block through a pointer
        // word must also find it through the start nibble on its next lookup.
        let pointers_first = crate::sync::defect!(PointersBeforeNibble);
        if !pointers_first {
            set_nibble();
        }
        if map.version == MapVersion::V2 {
            let pointer = encode_pointer(start as u32);
            for i in index + 1..word_index(start + size) {
                map.words.store(i, pointer);
            }
        }
        if pointers_first {
            set_nibble();
        }
    }

    /// Removes the block starting at `start`: clears its nibble, then (v2) its
    /// pointer words, walking forward while they decode to `start`.
    pub fn delete(&mut self, start: u64) -> Result<(), MapError> {
        let map = &*self.map;
        if !start.is_multiple_of(START_ALIGN) {
            return Err(MapError::Misaligned { start });
        }
        if start >= map.span {
            return Err(MapError::OutOfRange { start, size: 0 });
        }
        let index = word_index(start);
        let bucket = bucket_in_word(start);
        let word = map.words.load(index);
        if is_pointer(word) || nibble_at(word, bucket) != nibble_for(start) {
            return Err(MapError::NotPresent { start });
        }
        map.words
            .store(index, word & !(0xF << bucket_shift(bucket)));
        if map.version == MapVersion::V2 {
            let pointer = encode_pointer(start as u32);
            let mut i = index + 1;
            while i < map.word_count() && map.words.load(i) == pointer {
                map.words.store(i, 0);
                i += 1;
            }
        }
        Ok(())
    }

    /// Validates a set without changing anything.
    fn check_set(&self, start: u64, size: u64, scan: Scan) -> Result<(), MapError> {
        let map = &*self.map;
        if size == 0 {
            return Err(MapError::ZeroSize);
        }
        if !start.is_multiple_of(START_ALIGN) {
            return Err(MapError::Misaligned { start });
        }
        let end = start
            .checked_add(size)
            .filter(|&end| end <= map.span)
            .ok_or(MapError::OutOfRange { start, size })?;
        let first = word_index(start);
        let own_bucket =
            first as u64 * (WORD_BYTES / BUCKET_BYTES) + u64::from(bucket_in_word(start));
        let last = match scan {
            Scan::WholeBlock => word_index(end - 1),
            Scan::StartWord => first,
        };
        for i in first..=last {
            let word = map.words.load(i);
            if word == 0 {
                continue;
            }
            if is_pointer(word) {
                return Err(MapError::Overlap {
                    start,
                    existing: u64::from(decode_pointer(word)),
                });
            }
            for bucket in 0..8 {
                let nibble = nibble_at(word, bucket);
                if nibble == 0 {
                    continue;
                }
                let existing = start_offset(i, bucket, nibble);
                if existing / BUCKET_BYTES == own_bucket {
                    return Err(MapError::BucketOccupied { start, existing });
                }
                if existing > start && existing < end {
                    return Err(MapError::Overlap { start, existing });
                }
            }
        }
        Ok(())
    }
}

/// How much of a new block's range `check_set` inspects.
#[derive(Clone, Copy)]
enum Scan {
    /// Every word the block touches: finds any overlap the map can see.
    WholeBlock,
    /// Only the start's word: bucket conflicts and a start inside a pointer word.
    StartWord,
}
