//! What a host says about a method when it publishes it: name, tier, unwind,
//! debug and GC info. These types are shared by the heap (which keeps them in
//! code headers), by code events and by images, and depend on nothing else.

use std::fmt;
use std::sync::Arc;

/// The compiler tier that produced a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum JitKind {
    /// Quick, unoptimized code (tier 0).
    Baseline,
    /// Optimized code (tier 1).
    Optimized,
    /// Code with profiling instrumentation.
    Instrumented,
    /// Ahead-of-time compiled code from a precompiled image.
    Precompiled,
}

/// Unwind data for one region of a method: the main body first, then one entry
/// per funclet. Offsets are relative to the code start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnwindEntry {
    /// First byte covered.
    pub begin: u32,
    /// One past the last byte covered.
    pub end: u32,
    /// Opaque unwind bytes (for example a DWARF CFI fragment).
    pub data: Box<[u8]>,
}

/// One row of a method's native-offset → source mapping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DebugEntry {
    /// Offset from the code start where this row begins.
    pub offset: u32,
    /// Source line (1-based).
    pub line: u32,
    /// Source column (1-based; 0 if unknown).
    pub column: u32,
    /// Source file.
    pub file: Arc<str>,
}

/// GC information: an encoding version and opaque bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GcInfo {
    /// Version of the encoding.
    pub version: u32,
    /// Encoded GC info.
    pub bytes: Box<[u8]>,
}

/// DWARF unwinding tables for a method, as perf's jitdump unwinding record
/// carries them: the `.eh_frame` data and its `.eh_frame_hdr` index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EhFrame {
    /// The `.eh_frame` section contents.
    pub frame: Box<[u8]>,
    /// The `.eh_frame_hdr` section contents.
    pub header: Box<[u8]>,
}

/// What the host supplies when it publishes a method.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeInfo {
    /// The runtime's opaque method identity.
    pub method_id: u64,
    /// A name for profilers.
    pub name: String,
    /// Compiler tier.
    pub kind: JitKind,
    /// Sorted, non-overlapping unwind entries; the first, if any, starts at 0.
    pub unwind: Vec<UnwindEntry>,
    /// Sorted by offset; every offset inside the code.
    pub debug: Vec<DebugEntry>,
    /// GC info, if the method has any.
    pub gc: Option<GcInfo>,
    /// Where the cold part begins, as an offset into the code (hot size); the cold
    /// part runs to the end of the block.
    pub cold_offset: Option<u32>,
    /// DWARF unwinding tables for profilers, if the host has them.
    pub eh_frame: Option<EhFrame>,
}

impl CodeInfo {
    /// A method with just an id, a name and a tier.
    pub fn new(method_id: u64, name: impl Into<String>, kind: JitKind) -> Self {
        Self {
            method_id,
            name: name.into(),
            kind,
            unwind: Vec::new(),
            debug: Vec::new(),
            gc: None,
            cold_offset: None,
            eh_frame: None,
        }
    }

    /// Checks the info against a block of `size` bytes.
    pub fn validate(&self, size: u64) -> Result<(), InfoError> {
        if let Some(first) = self.unwind.first()
            && first.begin != 0
        {
            return Err(InfoError::MainBodyNotFirst);
        }
        let mut prev_end = 0;
        for e in &self.unwind {
            if e.begin >= e.end || u64::from(e.end) > size {
                return Err(InfoError::UnwindOutOfRange {
                    begin: e.begin,
                    end: e.end,
                });
            }
            if e.begin < prev_end {
                return Err(InfoError::UnwindUnsorted { begin: e.begin });
            }
            prev_end = e.end;
        }
        for pair in self.debug.windows(2) {
            if pair[1].offset < pair[0].offset {
                return Err(InfoError::DebugUnsorted {
                    offset: pair[1].offset,
                });
            }
        }
        if let Some(last) = self.debug.last()
            && u64::from(last.offset) >= size
        {
            return Err(InfoError::DebugOutOfRange {
                offset: last.offset,
            });
        }
        if let Some(cold) = self.cold_offset
            && (cold == 0 || u64::from(cold) >= size)
        {
            return Err(InfoError::ColdOutOfRange { offset: cold });
        }
        Ok(())
    }
}

/// Why a [`CodeInfo`] was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InfoError {
    /// The first unwind entry does not start at offset 0.
    MainBodyNotFirst,
    /// An unwind entry is empty or reaches past the code.
    UnwindOutOfRange {
        /// First address (or offset) of the range.
        begin: u32,
        /// One past the last address (or offset).
        end: u32,
    },
    /// Unwind entries overlap or are out of order.
    UnwindUnsorted {
        /// First address (or offset) of the range.
        begin: u32,
    },
    /// Debug rows are out of order.
    DebugUnsorted {
        /// Offset in bytes.
        offset: u32,
    },
    /// A debug row lies past the code.
    DebugOutOfRange {
        /// Offset in bytes.
        offset: u32,
    },
    /// The `.eh_frame` to register is not a chain of records within its bytes.
    BadEhFrame {
        /// Offset of the first bad record.
        offset: u32,
    },
    /// The cold part would be empty or cover the whole block.
    ColdOutOfRange {
        /// Offset in bytes.
        offset: u32,
    },
}

impl fmt::Display for InfoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::MainBodyNotFirst => f.write_str("first unwind entry must start at offset 0"),
            Self::UnwindOutOfRange { begin, end } => {
                write!(
                    f,
                    "unwind entry {begin:#x}..{end:#x} is empty or past the code"
                )
            }
            Self::UnwindUnsorted { begin } => {
                write!(f, "unwind entry at {begin:#x} overlaps or is out of order")
            }
            Self::DebugUnsorted { offset } => write!(f, "debug row at {offset:#x} is out of order"),
            Self::DebugOutOfRange { offset } => {
                write!(f, "debug row at {offset:#x} is past the code")
            }
            Self::BadEhFrame { offset } => {
                write!(
                    f,
                    ".eh_frame record at {offset:#x} is malformed or runs past the data"
                )
            }
            Self::ColdOutOfRange { offset } => {
                write!(f, "cold part at {offset:#x} is empty or the whole block")
            }
        }
    }
}

impl std::error::Error for InfoError {}
