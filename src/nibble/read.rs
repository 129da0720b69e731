//! Lock-free lookups, written once over [`WordRead`].

use super::encoding::{decode_pointer, is_pointer, last_start_in, start_at_or_before, word_index};
use crate::map_words::WordRead;

/// Version-1 lookup: the start at or before `offset`, walking back one word at a
/// time until a start is found or the map begins. Cost grows with method size.
#[inline]
pub fn find_v1<W: WordRead + ?Sized>(words: &W, offset: u64) -> Option<u64> {
    let index = word_index(offset);
    if index >= words.word_count() {
        return None;
    }
    if let Some(start) = start_at_or_before(words.load(index), index, offset) {
        return Some(start);
    }
    (0..index)
        .rev()
        .find_map(|i| last_start_in(words.load(i), i))
}

/// What a capped version-1 lookup found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capped {
    /// The start at or before the offset.
    Found(u64),
    /// No start at or before the offset.
    Nothing,
    /// The walk read its cap of words without finding a start: the answer lies
    /// further back. A caller with a budget (a signal handler, an eBPF program)
    /// reports "too far", never a guess.
    TooFar,
}

/// [`find_v1`] reading at most `max_words` words (the covering word included),
/// the bounded form of the linear walk for callers that must finish in a fixed
/// number of steps. A `max_words` of 0 reads nothing and is always `TooFar`.
#[inline]
pub fn find_v1_capped<W: WordRead + ?Sized>(words: &W, offset: u64, max_words: usize) -> Capped {
    let index = word_index(offset);
    if index >= words.word_count() {
        return Capped::Nothing;
    }
    if max_words == 0 {
        return Capped::TooFar;
    }
    if let Some(start) = start_at_or_before(words.load(index), index, offset) {
        return Capped::Found(start);
    }
    let lowest = index.saturating_sub(max_words - 1);
    match (lowest..index)
        .rev()
        .find_map(|i| last_start_in(words.load(i), i))
    {
        Some(start) => Capped::Found(start),
        None if lowest == 0 => Capped::Nothing,
        None => Capped::TooFar,
    }
}

/// Version-2 lookup: reads at most two words.
///
/// The covering word answers if it is a pointer or holds a start at or before
/// `offset`; otherwise only the previous word can (a block reaching `offset` from
/// further back would have left a pointer in it).
#[inline]
pub fn find_v2<W: WordRead + ?Sized>(words: &W, offset: u64) -> Option<u64> {
    find_v2_placed(words, offset).map(|(start, _)| start)
}

/// Where a v2 lookup found its start, which bounds where the block can have
/// ended: an exact reader checks the end map only over what is not proved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum V2Origin {
    /// The word covering the offset is a pointer, which only a block covering
    /// the whole word leaves: the offset is inside the block.
    Covered,
    /// A start nibble in the offset's own word: the block starts there, and an
    /// end before the offset lies in that word.
    OwnWord,
    /// A start nibble in the previous word: an end before the offset lies
    /// after the start in that word, or in the offset's word.
    PrevWord,
    /// The previous word is a pointer, to a start further back: the block
    /// covers that whole word, so an end before the offset lies at the word's
    /// last byte or in the offset's word.
    PrevCovered,
}

/// [`find_v2`], also telling where the start was found (see [`V2Origin`]).
///
/// ```
/// use jitmap::nibble::{MapVersion, MapWriter, V2Origin, find_v2_placed};
/// let mut writer = MapWriter::new(MapVersion::V2, 4096).unwrap();
/// // Bytes 0x100..0x350: a nibble in word 1, a pointer in word 2, word 3 bare;
/// // then bytes 0x4e0..0x520, across words 4 and 5.
/// writer.set(0x100, 0x250).unwrap();
/// writer.set(0x4e0, 0x40).unwrap();
/// let words = writer.map().words();
/// assert_eq!(find_v2_placed(words, 0x120), Some((0x100, V2Origin::OwnWord)));
/// assert_eq!(find_v2_placed(words, 0x210), Some((0x100, V2Origin::Covered)));
/// // Past the block's end too: the map alone is not exact.
/// assert_eq!(find_v2_placed(words, 0x3f0), Some((0x100, V2Origin::PrevCovered)));
/// assert_eq!(find_v2_placed(words, 0x510), Some((0x4e0, V2Origin::PrevWord)));
/// ```
#[inline]
pub fn find_v2_placed<W: WordRead + ?Sized>(words: &W, offset: u64) -> Option<(u64, V2Origin)> {
    find_v2_with(words, offset, |start, origin| Some((start, origin)))
}

/// [`find_v2_placed`] handing the start and its origin to `found`, which is
/// called from the branch that found them: once inlined, each branch runs
/// `found` with its origin a constant, so a caller's check per origin costs
/// no second dispatch.
#[inline(always)]
pub(crate) fn find_v2_with<W: WordRead + ?Sized, R>(
    words: &W,
    offset: u64,
    found: impl FnOnce(u64, V2Origin) -> Option<R>,
) -> Option<R> {
    let index = word_index(offset);
    if index >= words.word_count() {
        return None;
    }
    let word = words.load(index);
    if is_pointer(word) {
        return found(u64::from(decode_pointer(word)), V2Origin::Covered);
    }
    if let Some(start) = start_at_or_before(word, index, offset) {
        return found(start, V2Origin::OwnWord);
    }
    let prev_index = index.checked_sub(1)?;
    let prev = words.load(prev_index);
    if is_pointer(prev) {
        return found(u64::from(decode_pointer(prev)), V2Origin::PrevCovered);
    }
    found(last_start_in(prev, prev_index)?, V2Origin::PrevWord)
}

/// Iterator over the live starts of a map in ascending order; pointer words are
/// skipped, so it works for both versions.
pub struct Starts<'a, W: ?Sized> {
    words: &'a W,
    index: usize,
    pending: u32,
}

impl<'a, W: WordRead + ?Sized> Starts<'a, W> {
    pub(crate) fn new(words: &'a W) -> Self {
        Self {
            words,
            index: 0,
            pending: 0,
        }
    }
}

impl<W: WordRead + ?Sized> Iterator for Starts<'_, W> {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        loop {
            if self.pending != 0 {
                let bucket = self.pending.leading_zeros() / 4;
                let nibble = super::encoding::nibble_at(self.pending, bucket);
                self.pending &= !(0xF << super::encoding::bucket_shift(bucket));
                return Some(super::encoding::start_offset(
                    self.index - 1,
                    bucket,
                    nibble,
                ));
            }
            if self.index >= self.words.word_count() {
                return None;
            }
            let word = self.words.load(self.index);
            self.index += 1;
            if !is_pointer(word) {
                self.pending = word;
            }
        }
    }
}
