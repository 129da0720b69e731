//! Errors of the range-section map.

use std::fmt;

use crate::hex::hex_struct;

/// A rejected range-map operation; the map is unchanged.
#[derive(Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RangeError {
    /// `begin >= end`.
    Empty {
        /// First address (or offset) of the range.
        begin: usize,
        /// One past the last address (or offset).
        end: usize,
    },
    /// The range reaches address bit 57 or above.
    OutOfRange {
        /// First address (or offset) of the range.
        begin: usize,
        /// One past the last address (or offset).
        end: usize,
    },
    /// The range overlaps the section that begins at `existing`.
    Overlap {
        /// First address (or offset) of the range.
        begin: usize,
        /// Where the conflicting entry begins.
        existing: usize,
    },
    /// No section begins at this address.
    NotFound {
        /// First address (or offset) of the range.
        begin: usize,
    },
    /// The section is larger than one section may be ([`super::MAX_SECTION_BYTES`]).
    TooLarge {
        /// First address (or offset) of the range.
        begin: usize,
        /// One past the last address (or offset).
        end: usize,
    },
    /// The section's fragments could not be allocated.
    OutOfMemory {
        /// First address (or offset) of the range.
        begin: usize,
        /// One past the last address (or offset).
        end: usize,
    },
    /// The section at `begin` is not of the kind the caller may remove.
    WrongKind {
        /// First address (or offset) of the range.
        begin: usize,
    },
}

impl fmt::Display for RangeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Empty { begin, end } => write!(f, "empty range {begin:#x}..{end:#x}"),
            Self::OutOfRange { begin, end } => {
                write!(f, "range {begin:#x}..{end:#x} is beyond 2^57")
            }
            Self::Overlap { begin, existing } => {
                write!(
                    f,
                    "range at {begin:#x} overlaps the section at {existing:#x}"
                )
            }
            Self::NotFound { begin } => write!(f, "no section begins at {begin:#x}"),
            Self::TooLarge { begin, end } => write!(
                f,
                "range {begin:#x}..{end:#x} is larger than a section may be ({:#x} bytes)",
                super::MAX_SECTION_BYTES
            ),
            Self::OutOfMemory { begin, end } => {
                write!(f, "no memory for the fragments of {begin:#x}..{end:#x}")
            }
            Self::WrongKind { begin } => {
                write!(f, "the section at {begin:#x} is not of the kind to remove")
            }
        }
    }
}

impl std::error::Error for RangeError {}

impl fmt::Debug for RangeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Empty { begin, end } => hex_struct!(f, "Empty", "begin" => begin, "end" => end),
            Self::OutOfRange { begin, end } => {
                hex_struct!(f, "OutOfRange", "begin" => begin, "end" => end)
            }
            Self::Overlap { begin, existing } => {
                hex_struct!(f, "Overlap", "begin" => begin, "existing" => existing)
            }
            Self::NotFound { begin } => hex_struct!(f, "NotFound", "begin" => begin),
            Self::TooLarge { begin, end } => {
                hex_struct!(f, "TooLarge", "begin" => begin, "end" => end)
            }
            Self::OutOfMemory { begin, end } => {
                hex_struct!(f, "OutOfMemory", "begin" => begin, "end" => end)
            }
            Self::WrongKind { begin } => hex_struct!(f, "WrongKind", "begin" => begin),
        }
    }
}
