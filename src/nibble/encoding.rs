//! Bit-level encoding of nibble-map words, identical to the .NET runtime's.
//!
//! A 32-bit word covers 256 bytes: eight 32-byte buckets. Bucket `k` (0 = lowest
//! address) sits at bit shift `28 - 4k`. A nibble of 1..=8 marks a code start at byte
//! `4 * (n - 1)` of its bucket; 0 means no start. In version 2 a word whose low
//! nibble is 9..=12 is instead a relative pointer to the start of the block that
//! covers the whole word.

/// Bytes covered by one bucket (one nibble).
pub const BUCKET_BYTES: u64 = 32;
/// Bytes covered by one 32-bit map word.
pub const WORD_BYTES: u64 = 256;
/// Buckets per word.
pub const BUCKETS_PER_WORD: u32 = 8;
/// Required alignment of code starts.
pub const START_ALIGN: u64 = 4;
/// Largest span a map can cover: offsets must fit in 32 bits.
pub const MAX_SPAN: u64 = 1 << 32;

/// Encodes a start offset as a version-2 relative pointer word.
pub const fn encode_pointer(offset: u32) -> u32 {
    (offset & !0xF) | (((offset & 0xF) >> 2) + 9)
}

/// Decodes a version-2 relative pointer word to its start offset.
pub const fn decode_pointer(word: u32) -> u32 {
    (word & !0xF) + (((word & 0xF) - 9) << 2)
}

/// Whether a word is a version-2 relative pointer (low nibble 9..=12).
pub const fn is_pointer(word: u32) -> bool {
    (word & 0xF) > 8
}

/// Index of the word covering `offset`.
pub const fn word_index(offset: u64) -> usize {
    (offset / WORD_BYTES) as usize
}

/// Bucket of `offset` within its word (0..8).
pub const fn bucket_in_word(offset: u64) -> u32 {
    ((offset / BUCKET_BYTES) % BUCKETS_PER_WORD as u64) as u32
}

/// Bit shift of bucket `k` inside a word.
pub const fn bucket_shift(bucket: u32) -> u32 {
    28 - 4 * bucket
}

/// Nibble value (1..=8) that marks a start at `offset`.
pub const fn nibble_for(offset: u64) -> u32 {
    ((offset % BUCKET_BYTES) / START_ALIGN) as u32 + 1
}

/// Offset of the start encoded by nibble `nibble` in bucket `bucket` of word `word`.
pub const fn start_offset(word: usize, bucket: u32, nibble: u32) -> u64 {
    word as u64 * WORD_BYTES + bucket as u64 * BUCKET_BYTES + (nibble as u64 - 1) * START_ALIGN
}

/// Nibble stored for bucket `bucket` of `word`.
pub const fn nibble_at(word: u32, bucket: u32) -> u32 {
    (word >> bucket_shift(bucket)) & 0xF
}

/// The last (highest-addressed) start in a nibble word, if any.
pub const fn last_start_in(word: u32, index: usize) -> Option<u64> {
    if word == 0 {
        return None;
    }
    // The lowest non-zero nibble is the highest-addressed bucket's: at bit
    // `shift`, bucket `7 - shift / 4`, so its start lies at
    // `index * 256 + (7 - shift / 4) * 32 + (nibble - 1) * 4`, which is
    // `index * 256 + 220 + 4 * nibble - 8 * shift`.
    let shift = word.trailing_zeros() & !3;
    let nibble = (word >> shift) & 0xF;
    Some(index as u64 * WORD_BYTES + 220 + 4 * nibble as u64 - 8 * shift as u64)
}

/// The last start in nibble word `word` (index `index`) at or before `offset`,
/// which must lie inside that word.
pub const fn start_at_or_before(word: u32, index: usize, offset: u64) -> Option<u64> {
    let bucket = bucket_in_word(offset);
    // Buckets 0..=bucket, with `bucket` in the low nibble.
    let upto = word >> bucket_shift(bucket);
    let own = upto & 0xF;
    if own != 0 && (own - 1) as u64 * START_ALIGN <= offset % BUCKET_BYTES {
        return Some(start_offset(index, bucket, own));
    }
    let earlier = upto >> 4;
    if earlier == 0 {
        return None;
    }
    // As in `last_start_in`, from the start of `offset`'s bucket: the
    // nibble at bit `shift` of `earlier` is bucket `bucket - 1 - shift / 4`'s.
    let shift = earlier.trailing_zeros() & !3;
    let nibble = (earlier >> shift) & 0xF;
    // Never below 0: the bucket lies `shift / 4 + 1` buckets past the start's.
    Some((offset - offset % BUCKET_BYTES + 4 * nibble as u64) - (8 * shift as u64 + 36))
}

#[cfg(test)]
mod tests {
    use super::{BUCKETS_PER_WORD, WORD_BYTES, bucket_shift, last_start_in, start_at_or_before};
    use crate::test_rng::Xorshift;

    /// Every start a nibble word marks, ascending, for a word at `index`:
    /// the model the arithmetic decoders are checked against.
    fn starts(word: u32, index: usize) -> Vec<u64> {
        (0..BUCKETS_PER_WORD)
            .filter_map(|bucket| {
                let nibble = (word >> bucket_shift(bucket)) & 0xF;
                (nibble != 0).then(|| {
                    index as u64 * WORD_BYTES + u64::from(bucket) * 32 + u64::from(nibble - 1) * 4
                })
            })
            .collect()
    }

    /// Both decoders against the model, for every offset of random start
    /// words (each bucket empty or holding one of its eight starts) at word
    /// indexes from 0 up, and for every word with a single start.
    #[test]
    fn decoders_agree_with_the_nibble_by_nibble_model() {
        let mut rng = Xorshift::new(0x2545_F491_4F6C_DD1D);
        let mut words: Vec<u32> = (0..BUCKETS_PER_WORD)
            .flat_map(|bucket| (1..=8).map(move |n| n << bucket_shift(bucket)))
            .collect();
        words.push(0);
        // Miri interprets each of the 256 offsets of a word: the 65 fixed
        // words and 40 random ones there, 4,000 natively.
        let random = if cfg!(miri) { 40 } else { 4000 };
        for _ in 0..random {
            let mut word = 0;
            for bucket in 0..BUCKETS_PER_WORD {
                let state = rng.next_u64();
                // Empty half the time, else one of the bucket's eight starts.
                let nibble = if state & 1 == 0 {
                    0
                } else {
                    (state >> 8) % 8 + 1
                };
                word |= (nibble as u32) << bucket_shift(bucket);
            }
            words.push(word);
        }
        let mut checked = 0u64;
        for (n, &word) in words.iter().enumerate() {
            let index = n % 3 * 1000;
            let starts = starts(word, index);
            assert_eq!(
                last_start_in(word, index),
                starts.last().copied(),
                "{word:#010x}"
            );
            for offset in index as u64 * WORD_BYTES..(index as u64 + 1) * WORD_BYTES {
                let expected = starts.iter().rev().find(|&&s| s <= offset).copied();
                assert_eq!(
                    start_at_or_before(word, index, offset),
                    expected,
                    "{word:#010x} at {offset:#x}"
                );
                checked += 1;
            }
        }
        assert_eq!(checked, (65 + random) * 256);
    }
}
