//! A plain model of a nibble map: the live blocks in a `BTreeMap`, the exact answer
//! each map version must give for any address, and an independent encoder that
//! rebuilds the canonical words from the live blocks.

use std::collections::BTreeMap;

use jitmap::MapVersion;
use jitmap::nibble::encoding::{
    BUCKET_BYTES, START_ALIGN, WORD_BYTES, bucket_in_word, bucket_shift, encode_pointer,
    nibble_for, word_index,
};
use jitmap::nibble::words_for_span;

/// What the model says of a proposed block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Valid: both maps must accept it.
    Valid,
    /// Invalid in a way every map can see (size, alignment, range, a start in the
    /// same bucket or inside the block): both maps must reject it unchanged.
    Visible,
    /// Overlaps the tail of an earlier block that the map may not see; must not be
    /// submitted, since the map's contract assumes the allocator prevents it.
    Hidden,
}

/// The live blocks of a map over `[0, span)`.
#[derive(Clone, Debug, Default)]
pub struct MapModel {
    span: u64,
    live: BTreeMap<u64, u64>,
}

impl MapModel {
    /// An empty model over `[0, span)`.
    pub fn new(span: u64) -> Self {
        Self {
            span,
            live: BTreeMap::new(),
        }
    }

    /// Live blocks as `start → size`.
    pub fn live(&self) -> &BTreeMap<u64, u64> {
        &self.live
    }

    /// Judges a proposed `set`.
    pub fn judge(&self, start: u64, size: u64) -> Verdict {
        let Some(end) = start.checked_add(size) else {
            return Verdict::Visible;
        };
        if size == 0 || !start.is_multiple_of(START_ALIGN) || end > self.span {
            return Verdict::Visible;
        }
        let bucket_lo = start - start % BUCKET_BYTES;
        let visible = self
            .live
            .range(bucket_lo..end.max(bucket_lo + BUCKET_BYTES))
            .any(|(&s, _)| s / BUCKET_BYTES == start / BUCKET_BYTES || s > start);
        if visible {
            return Verdict::Visible;
        }
        match self.live.range(..=start).next_back() {
            Some((&s, &len)) if s + len > start => Verdict::Hidden,
            _ => Verdict::Valid,
        }
    }

    /// Records a block the maps accepted.
    pub fn insert(&mut self, start: u64, size: u64) {
        self.live.insert(start, size);
    }

    /// Removes a block; returns whether it was live.
    pub fn remove(&mut self, start: u64) -> bool {
        self.live.remove(&start).is_some()
    }

    /// The live block containing `addr`, as `(start, size)`.
    pub fn containing(&self, addr: u64) -> Option<(u64, u64)> {
        self.live
            .range(..=addr)
            .next_back()
            .filter(|&(&s, &len)| addr < s + len)
            .map(|(&s, &len)| (s, len))
    }

    /// The exact answer of `version`'s lookup at `addr`, inside or outside blocks.
    ///
    /// v1 names the last start at or before `addr`. v2 names it only while `addr`
    /// is in the start's word, the word after it, or the word after a word the
    /// block fully covers; past that it answers none.
    pub fn expected(&self, version: MapVersion, addr: u64) -> Option<u64> {
        if addr >= self.span {
            return None;
        }
        let (&start, &size) = self.live.range(..=addr).next_back()?;
        match version {
            MapVersion::V1 => Some(start),
            MapVersion::V2 => {
                let word = word_index(addr);
                let reaches =
                    word <= word_index(start) + 1 || (word as u64) * WORD_BYTES <= start + size;
                reaches.then_some(start)
            }
        }
    }

    /// The canonical words of a map of `version` holding exactly the live blocks,
    /// computed directly from the encoding rules (not through the writer).
    pub fn canonical_words(&self, version: MapVersion) -> Vec<u32> {
        let mut words = vec![0u32; words_for_span(self.span)];
        for (&start, &size) in &self.live {
            let index = word_index(start);
            words[index] |= nibble_for(start) << bucket_shift(bucket_in_word(start));
            if version == MapVersion::V2 {
                let covered = index + 1..word_index(start + size).max(index + 1);
                words[covered].fill(encode_pointer(start as u32));
            }
        }
        words
    }
}
