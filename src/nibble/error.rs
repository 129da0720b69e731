//! Errors of the nibble-map layer.

use std::fmt;

/// A rejected map operation. The map is unchanged whenever one is returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MapError {
    /// The start is not 4-byte aligned.
    Misaligned {
        /// Address (or offset) of the block's first code byte.
        start: u64,
    },
    /// Another start already sits in the start's 32-byte bucket.
    BucketOccupied {
        /// Address (or offset) of the block's first code byte.
        start: u64,
        /// Where the conflicting entry begins.
        existing: u64,
    },
    /// The block would overlap a live block that the map can see.
    Overlap {
        /// Address (or offset) of the block's first code byte.
        start: u64,
        /// Where the conflicting entry begins.
        existing: u64,
    },
    /// The block's start or end lies beyond the map.
    OutOfRange {
        /// Address (or offset) of the block's first code byte.
        start: u64,
        /// Size in bytes.
        size: u64,
    },
    /// The map would span 4 GiB or more; offsets must fit in 32 bits.
    SpanTooLarge {
        /// The span asked for.
        span: u64,
    },
    /// A block of size 0.
    ZeroSize,
    /// No start is set at this offset.
    NotPresent {
        /// Address (or offset) of the block's first code byte.
        start: u64,
    },
    /// The storage holds fewer words than the span needs.
    StoreTooSmall,
    /// The word storage could not be mapped.
    NoMemory,
    /// A version name other than `v1` or `v2`.
    UnknownVersion,
}

impl fmt::Display for MapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Misaligned { start } => write!(f, "start {start:#x} is not 4-byte aligned"),
            Self::BucketOccupied { start, existing } => write!(
                f,
                "start {start:#x} shares a 32-byte bucket with start {existing:#x}"
            ),
            Self::Overlap { start, existing } => {
                write!(f, "block at {start:#x} overlaps block at {existing:#x}")
            }
            Self::OutOfRange { start, size } => {
                write!(f, "block {start:#x}+{size:#x} lies beyond the map")
            }
            Self::SpanTooLarge { span } => write!(f, "span {span:#x} is 4 GiB or more"),
            Self::ZeroSize => f.write_str("block size is 0"),
            Self::NotPresent { start } => write!(f, "no start at {start:#x}"),
            Self::StoreTooSmall => f.write_str("word storage is smaller than the span"),
            Self::NoMemory => f.write_str("cannot map word storage"),
            Self::UnknownVersion => f.write_str("map version must be v1 or v2"),
        }
    }
}

impl std::error::Error for MapError {}
