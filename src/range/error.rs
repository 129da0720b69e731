//! Errors of the range-section map.

use std::fmt;

/// A rejected range-map operation; the map is unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RangeError {
    /// `begin >= end`.
    Empty { begin: usize, end: usize },
    /// The range reaches address bit 57 or above.
    OutOfRange { begin: usize, end: usize },
    /// The range overlaps the section that begins at `existing`.
    Overlap { begin: usize, existing: usize },
    /// No section begins at this address.
    NotFound { begin: usize },
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
        }
    }
}

impl std::error::Error for RangeError {}
