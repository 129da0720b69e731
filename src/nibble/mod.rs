//! Nibble maps: address → code start, bit-exact with the .NET runtime's v1 and v2.
//!
//! A [`MapWriter`] owns the only write access to its [`NibbleMap`]; readers share
//! the map (`Arc<NibbleMap>`) and look up with no lock while the writer works.

pub mod encoding;
mod error;
mod read;
mod write;

use std::sync::Arc;

pub use error::MapError;
// The heap's exact lookup inlines it (not built under loom).
#[cfg(not(loom))]
pub(crate) use read::find_v2_with;
pub use read::{Capped, Starts, V2Origin, find_v1, find_v1_capped, find_v2, find_v2_placed};

#[cfg(not(loom))]
use crate::map_words::MmapWords;
use crate::map_words::WordRead;
use encoding::{MAX_SPAN, WORD_BYTES};

/// Which encoding and lookup a map uses. One byte, 1 or 2, as out-of-process
/// readers see it (see [`crate::remote`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MapVersion {
    /// Start nibbles only; lookups walk back word by word, so their cost is
    /// linear in the method's size (a 4 GiB heap can need millions of reads).
    /// Lock-free and signal-safe, but not bounded: a caller with a budget uses
    /// [`find_v1_capped`] or refuses v1 heaps.
    V1 = 1,
    /// Start nibbles plus relative pointers in fully covered words; lookups read at
    /// most two words.
    V2 = 2,
}

impl MapVersion {
    /// Whether a lookup reads a bounded number of words (two): true for v2 only.
    pub fn is_bounded(self) -> bool {
        self == Self::V2
    }
}

impl std::str::FromStr for MapVersion {
    type Err = MapError;

    fn from_str(s: &str) -> Result<Self, MapError> {
        match s {
            "v1" => Ok(Self::V1),
            "v2" => Ok(Self::V2),
            _ => Err(MapError::UnknownVersion),
        }
    }
}

impl std::fmt::Display for MapVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::V1 => "v1",
            Self::V2 => "v2",
        })
    }
}

/// Number of words a map covering `span` bytes needs.
pub const fn words_for_span(span: u64) -> usize {
    span.div_ceil(WORD_BYTES) as usize
}

/// A nibble map over offsets `[0, span)` from its base. Shared by readers.
pub struct NibbleMap<S> {
    version: MapVersion,
    span: u64,
    words: S,
}

impl<S: WordRead> NibbleMap<S> {
    /// The encoding version.
    pub fn version(&self) -> MapVersion {
        self.version
    }

    /// Bytes covered.
    pub fn span(&self) -> u64 {
        self.span
    }

    /// The raw word storage.
    pub fn words(&self) -> &S {
        &self.words
    }

    /// Number of words.
    pub fn word_count(&self) -> usize {
        words_for_span(self.span)
    }

    /// Word `index` (0 when out of range).
    pub fn word(&self, index: usize) -> u32 {
        if index < self.word_count() {
            self.words.load(index)
        } else {
            0
        }
    }

    /// `(index, word)` for every non-zero word, ascending.
    pub fn nonzero_words(&self) -> impl Iterator<Item = (usize, u32)> + '_ {
        (0..self.word_count())
            .map(|i| (i, self.words.load(i)))
            .filter(|&(_, w)| w != 0)
    }

    /// The code start the map gives for `offset`, per its version's semantics.
    /// Lock-free; safe to call while the writer works.
    pub fn find(&self, offset: u64) -> Option<u64> {
        match self.version {
            MapVersion::V2 => find_v2(&self.words, offset),
            MapVersion::V1 => self.find_v1_outlined(offset),
        }
    }

    /// [`find_v1`] out of line and marked cold, so that the v2 lookup is
    /// the fall-through path of [`NibbleMap::find`] (it was a taken jump
    /// past the inlined walk). A v1 lookup reads as many words as its method
    /// is long; one jump more is nothing beside that.
    #[cold]
    #[inline(never)]
    fn find_v1_outlined(&self, offset: u64) -> Option<u64> {
        find_v1(&self.words, offset)
    }

    /// Live starts in ascending order.
    pub fn starts(&self) -> Starts<'_, S> {
        Starts::new(&self.words)
    }
}

/// The single writer of a [`NibbleMap`]. Not `Clone`: holding `&mut MapWriter`
/// is what serializes writes.
pub struct MapWriter<S> {
    map: Arc<NibbleMap<S>>,
}

#[cfg(not(loom))]
impl MapWriter<MmapWords> {
    /// A map of `version` covering `span` bytes, in a lazily committed mapping
    /// (advised for huge pages when it is 2 MiB or more).
    pub fn new(version: MapVersion, span: u64) -> Result<Self, MapError> {
        Self::with_huge_pages(version, span, true)
    }

    /// As [`MapWriter::new`], choosing whether a large map uses huge pages.
    pub fn with_huge_pages(version: MapVersion, span: u64, huge: bool) -> Result<Self, MapError> {
        check_span(span)?;
        let words = MmapWords::with_huge_pages(words_for_span(span), huge)
            .map_err(|_| MapError::NoMemory)?;
        Self::with_store(version, span, words)
    }
}

impl<S: WordRead> MapWriter<S> {
    /// A map of `version` covering `span` bytes in `words`, which must be zeroed and
    /// hold at least [`words_for_span`]`(span)` words.
    pub fn with_store(version: MapVersion, span: u64, words: S) -> Result<Self, MapError> {
        check_span(span)?;
        if words.word_count() < words_for_span(span) {
            return Err(MapError::StoreTooSmall);
        }
        Ok(Self {
            map: Arc::new(NibbleMap {
                version,
                span,
                words,
            }),
        })
    }

    /// The shared map, for readers.
    pub fn map(&self) -> &Arc<NibbleMap<S>> {
        &self.map
    }
}

fn check_span(span: u64) -> Result<(), MapError> {
    if span >= MAX_SPAN {
        Err(MapError::SpanTooLarge { span })
    } else {
        Ok(())
    }
}
