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
    let skip = word.trailing_zeros() / 4;
    let bucket = BUCKETS_PER_WORD - 1 - skip;
    Some(start_offset(index, bucket, (word >> (4 * skip)) & 0xF))
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
    let skip = earlier.trailing_zeros() / 4;
    Some(start_offset(
        index,
        bucket - 1 - skip,
        (earlier >> (4 * skip)) & 0xF,
    ))
}
