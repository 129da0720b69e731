//! A jitdump reader and validator: parses a file without trusting it, lists its
//! records, and reports every way it departs from what Linux perf accepts.

use std::fmt;

use super::jitdump::{
    CODE_CLOSE, CODE_DEBUG_INFO, CODE_LOAD, CODE_MOVE, CODE_UNWINDING_INFO, HEADER_SIZE,
    LOAD_FIXED_SIZE, MAGIC, MOVE_SIZE, RECORD_HEADER_SIZE, VERSION,
};

/// The file header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileHeader {
    /// Format version (perf accepts 1).
    pub version: u32,
    /// Header size (40).
    pub total_size: u32,
    /// ELF machine.
    pub elf_mach: u32,
    /// Process id.
    pub pid: u32,
    /// Creation time.
    pub timestamp: u64,
    /// Flags.
    pub flags: u64,
}

/// One debug row as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DebugRow {
    /// Absolute address.
    pub addr: u64,
    /// Line.
    pub line: u32,
    /// Column (the format's discriminator).
    pub column: u32,
    /// File name.
    pub file: String,
}

/// One record's content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    /// A code load.
    Load {
        /// Process id.
        pid: u32,
        /// Thread id.
        tid: u32,
        /// Virtual address of the code.
        vma: u64,
        /// Address of the code.
        code_addr: u64,
        /// Code size in bytes.
        code_size: u64,
        /// The load's unique index.
        code_index: u64,
        /// Function name.
        name: String,
        /// The code bytes.
        code: Vec<u8>,
    },
    /// A code move.
    Move {
        /// Process id.
        pid: u32,
        /// Thread id.
        tid: u32,
        /// Virtual address of the code.
        vma: u64,
        /// Address before the move.
        old_addr: u64,
        /// Address after the move.
        new_addr: u64,
        /// Code size in bytes.
        code_size: u64,
        /// The load's unique index.
        code_index: u64,
    },
    /// Debug info for the next load.
    DebugInfo {
        /// Address of the code.
        code_addr: u64,
        /// The debug rows.
        rows: Vec<DebugRow>,
    },
    /// Unwinding info for the next load: `.eh_frame` then `.eh_frame_hdr`.
    UnwindingInfo {
        /// `.eh_frame` bytes.
        eh_frame: Vec<u8>,
        /// `.eh_frame_hdr` bytes.
        eh_frame_hdr: Vec<u8>,
        /// Bytes of unwinding data mapped next to the code (0: none).
        mapped_size: u64,
    },
    /// The close marker.
    Close,
    /// An id this reader does not know.
    Unknown {
        /// The record id.
        id: u32,
    },
}

/// A record and where it sits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Byte offset of the record header.
    pub offset: usize,
    /// Record size from its header.
    pub size: u32,
    /// Timestamp from its header.
    pub timestamp: u64,
    /// Parsed content.
    pub body: Body,
}

/// A departure from what perf accepts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// Shorter than a header.
    ShortHeader {
        /// Bytes available.
        len: usize,
    },
    /// The magic is not `JiTD` in this machine's byte order.
    BadMagic {
        /// The magic read.
        magic: u32,
    },
    /// A version other than 1.
    BadVersion {
        /// The version read.
        version: u32,
    },
    /// A header size other than 40.
    BadHeaderSize {
        /// Size in bytes.
        size: u32,
    },
    /// A record size below the 16-byte record header.
    RecordTooSmall {
        /// Offset in bytes.
        offset: usize,
        /// Size in bytes.
        size: u32,
    },
    /// The file ends inside a record.
    TruncatedTail {
        /// Offset in bytes.
        offset: usize,
        /// Size in bytes.
        size: u32,
        /// Bytes left in the file.
        available: usize,
    },
    /// A record's fields do not fit its size, or a name is unterminated.
    Malformed {
        /// Offset in bytes.
        offset: usize,
        /// What is wrong.
        what: &'static str,
    },
    /// A load record with bytes after its code (perf would misread the code).
    LoadPadding {
        /// Offset in bytes.
        offset: usize,
        /// Bytes after the code.
        extra: usize,
    },
    /// Debug rows whose addresses do not ascend.
    UnsortedDebug {
        /// Offset in bytes.
        offset: usize,
    },
    /// A move record whose size is not 64.
    BadMoveSize {
        /// Offset in bytes.
        offset: usize,
        /// Size in bytes.
        size: u32,
    },
    /// A close record with a payload.
    BadCloseSize {
        /// Offset in bytes.
        offset: usize,
        /// Size in bytes.
        size: u32,
    },
    /// A record id this reader does not know.
    UnknownRecord {
        /// Offset in bytes.
        offset: usize,
        /// The record id.
        id: u32,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ShortHeader { len } => {
                write!(f, "file of {len} bytes is shorter than the 40-byte header")
            }
            Self::BadMagic { magic } => {
                write!(f, "magic {magic:#010x} is not JiTD in native byte order")
            }
            Self::BadVersion { version } => write!(f, "version {version}: perf accepts only 1"),
            Self::BadHeaderSize { size } => write!(f, "header size {size}: must be 40"),
            Self::RecordTooSmall { offset, size } => {
                write!(f, "record at {offset}: size {size} is under 16")
            }
            Self::TruncatedTail {
                offset,
                size,
                available,
            } => {
                write!(
                    f,
                    "record at {offset}: size {size} but only {available} bytes remain"
                )
            }
            Self::Malformed { offset, what } => write!(f, "record at {offset}: {what}"),
            Self::LoadPadding { offset, extra } => {
                write!(
                    f,
                    "load at {offset}: {extra} bytes after the code (padding is not allowed)"
                )
            }
            Self::UnsortedDebug { offset } => {
                write!(f, "debug info at {offset}: addresses do not ascend")
            }
            Self::BadMoveSize { offset, size } => {
                write!(f, "move at {offset}: size {size}, expected 64")
            }
            Self::BadCloseSize { offset, size } => {
                write!(f, "close at {offset}: size {size}, expected 16")
            }
            Self::UnknownRecord { offset, id } => write!(f, "record at {offset}: unknown id {id}"),
        }
    }
}

/// The result of checking a file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// The header, if the file has 40 bytes.
    pub header: Option<FileHeader>,
    /// Every complete record, in file order.
    pub records: Vec<Record>,
    /// Every violation found.
    pub violations: Vec<Violation>,
    /// Bytes up to the end of the last complete record.
    pub clean_len: usize,
}

/// A bounds-checked cursor.
struct Cursor<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let bytes = self.data.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(bytes)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_ne_bytes(b.try_into().unwrap_or_default()))
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|b| u64::from_ne_bytes(b.try_into().unwrap_or_default()))
    }
    fn c_str(&mut self) -> Option<String> {
        let rest = self.data.get(self.at..)?;
        let len = rest.iter().position(|&b| b == 0)?;
        let s = String::from_utf8_lossy(&rest[..len]).into_owned();
        self.at += len + 1;
        Some(s)
    }
    fn left(&self) -> usize {
        self.data.len().saturating_sub(self.at)
    }
}

/// Checks a whole jitdump file held in memory.
pub fn check(bytes: &[u8]) -> Report {
    let mut report = Report::default();
    let mut c = Cursor { data: bytes, at: 0 };
    let (
        Some(magic),
        Some(version),
        Some(total_size),
        Some(elf_mach),
        Some(_pad),
        Some(pid),
        Some(timestamp),
        Some(flags),
    ) = (
        c.u32(),
        c.u32(),
        c.u32(),
        c.u32(),
        c.u32(),
        c.u32(),
        c.u64(),
        c.u64(),
    )
    else {
        report
            .violations
            .push(Violation::ShortHeader { len: bytes.len() });
        return report;
    };
    if magic != MAGIC {
        report.violations.push(Violation::BadMagic { magic });
        return report;
    }
    if version != VERSION {
        report.violations.push(Violation::BadVersion { version });
    }
    if total_size as usize != HEADER_SIZE {
        report
            .violations
            .push(Violation::BadHeaderSize { size: total_size });
    }
    report.header = Some(FileHeader {
        version,
        total_size,
        elf_mach,
        pid,
        timestamp,
        flags,
    });
    let mut offset = (total_size as usize).max(HEADER_SIZE);
    report.clean_len = offset.min(bytes.len());
    while offset < bytes.len() {
        let mut h = Cursor {
            data: bytes,
            at: offset,
        };
        let (Some(id), Some(size), Some(timestamp)) = (h.u32(), h.u32(), h.u64()) else {
            report.violations.push(Violation::TruncatedTail {
                offset,
                size: 0,
                available: bytes.len() - offset,
            });
            break;
        };
        if (size as usize) < RECORD_HEADER_SIZE {
            report
                .violations
                .push(Violation::RecordTooSmall { offset, size });
            break;
        }
        let available = bytes.len() - offset;
        if size as usize > available {
            report.violations.push(Violation::TruncatedTail {
                offset,
                size,
                available,
            });
            break;
        }
        let body = &bytes[offset + RECORD_HEADER_SIZE..offset + size as usize];
        match parse_body(id, body, offset, size, &mut report.violations) {
            Some(body) => report.records.push(Record {
                offset,
                size,
                timestamp,
                body,
            }),
            None => report.violations.push(Violation::Malformed {
                offset,
                what: "fields do not fit the record",
            }),
        }
        offset += size as usize;
        report.clean_len = offset;
    }
    report
}

fn parse_body(
    id: u32,
    body: &[u8],
    offset: usize,
    size: u32,
    violations: &mut Vec<Violation>,
) -> Option<Body> {
    let mut c = Cursor { data: body, at: 0 };
    Some(match id {
        CODE_LOAD => {
            if body.len() < LOAD_FIXED_SIZE {
                return None;
            }
            let (pid, tid, vma, code_addr, code_size, code_index) =
                (c.u32()?, c.u32()?, c.u64()?, c.u64()?, c.u64()?, c.u64()?);
            let Some(name) = c.c_str() else {
                violations.push(Violation::Malformed {
                    offset,
                    what: "unterminated function name",
                });
                return Some(Body::Unknown { id });
            };
            let code = c.take(usize::try_from(code_size).ok()?)?.to_vec();
            if c.left() > 0 {
                violations.push(Violation::LoadPadding {
                    offset,
                    extra: c.left(),
                });
            }
            Body::Load {
                pid,
                tid,
                vma,
                code_addr,
                code_size,
                code_index,
                name,
                code,
            }
        }
        CODE_MOVE => {
            if size as usize != MOVE_SIZE {
                violations.push(Violation::BadMoveSize { offset, size });
            }
            let (pid, tid) = (c.u32()?, c.u32()?);
            let (vma, old_addr, new_addr, code_size, code_index) =
                (c.u64()?, c.u64()?, c.u64()?, c.u64()?, c.u64()?);
            Body::Move {
                pid,
                tid,
                vma,
                old_addr,
                new_addr,
                code_size,
                code_index,
            }
        }
        CODE_DEBUG_INFO => {
            let code_addr = c.u64()?;
            let count = c.u64()?;
            let mut rows: Vec<DebugRow> = Vec::new();
            for _ in 0..count {
                let addr = c.u64()?;
                let (line, column) = (c.u32()?, c.u32()?);
                let file = c.c_str()?;
                rows.push(DebugRow {
                    addr,
                    line,
                    column,
                    file,
                });
            }
            if rows.windows(2).any(|w| w[1].addr < w[0].addr) {
                violations.push(Violation::UnsortedDebug { offset });
            }
            Body::DebugInfo { code_addr, rows }
        }
        CODE_UNWINDING_INFO => {
            let (data_size, hdr_size, mapped_size) = (c.u64()?, c.u64()?, c.u64()?);
            let data = c.take(usize::try_from(data_size).ok()?)?;
            let split = data.len().checked_sub(usize::try_from(hdr_size).ok()?)?;
            Body::UnwindingInfo {
                eh_frame: data[..split].to_vec(),
                eh_frame_hdr: data[split..].to_vec(),
                mapped_size,
            }
        }
        CODE_CLOSE => {
            if size as usize != RECORD_HEADER_SIZE {
                violations.push(Violation::BadCloseSize { offset, size });
            }
            Body::Close
        }
        _ => {
            violations.push(Violation::UnknownRecord { offset, id });
            Body::Unknown { id }
        }
    })
}
