//! Errors of the code-heap layer.

use std::fmt;

use crate::epoch::{EpochError, ForeignGuard};
use crate::hex::hex_struct;
use crate::info::InfoError;
use crate::nibble::MapError;

/// A rejected heap operation. The heap is unchanged whenever one is returned
/// (a failed publish gives the reservation's space back, as an abort does).
#[derive(Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeapError {
    /// A reservation of 0 bytes.
    ZeroSize,
    /// A reservation larger than the heap could ever hold.
    TooLarge {
        /// Size in bytes.
        size: u64,
        /// The largest size allowed.
        max: u64,
    },
    /// An alignment that is not a power of two between 8 and the page size.
    BadAlignment {
        /// The alignment asked for.
        align: u64,
    },
    /// No free range fits the reservation, even after reclaiming.
    HeapFull {
        /// Size in bytes.
        size: u64,
    },
    /// An unwind room above [`MAX_UNWIND_ROOM`](crate::MAX_UNWIND_ROOM).
    BadUnwindRoom {
        /// The room asked for.
        room: u64,
    },
    /// A heap span of 0, or of 4 GiB or more.
    BadSpan {
        /// The span asked for.
        span: u64,
    },
    /// The block was already freed.
    DoubleFree {
        /// Address (or offset) of the block's first code byte.
        start: usize,
    },
    /// The reference is a moved block's old one; the block now starts at `to`.
    Moved {
        /// Address (or offset) of the block's first code byte.
        start: usize,
        /// Where the block starts now.
        to: usize,
    },
    /// The reference belongs to another heap.
    ForeignRef,
    /// The heap asked for the GDB JIT interface in a build without the
    /// `gdb-jit` feature.
    GdbJitUnavailable,
    /// The reference was never handed out by this heap.
    UnknownRef {
        /// Address (or offset) of the block's first code byte.
        start: usize,
    },
    /// The block is a stub, and the operation needs a method.
    NotAMethod {
        /// Address (or offset) of the block's first code byte.
        start: usize,
    },
    /// A stub kind outside 1..=15.
    BadStubKind {
        /// The stub kind.
        kind: u8,
    },
    /// The code info does not fit the block.
    Info(InfoError),
    /// The reader registry refused.
    Epoch(EpochError),
    /// The nibble map refused (an allocator invariant was broken).
    Map(MapError),
    /// Mapping or protecting memory failed with this OS error.
    Memory {
        /// The OS error number.
        errno: i32,
    },
    /// A lookup was given a guard from another reader domain.
    ForeignGuard,
    /// The method's `.eh_frame` cannot follow it to a new address: it is
    /// registered with the system unwinder (which holds its address), or an
    /// FDE's start is not an absolute address that a move could rewrite.
    PositionDependent {
        /// Address of the block's first code byte.
        start: usize,
    },
    /// A byte range that is not inside the block.
    OutsideBlock {
        /// Address of the block's first code byte.
        start: usize,
        /// The range's first offset in the block.
        begin: u64,
        /// Its end (exclusive).
        end: u64,
        /// The block's size.
        size: u64,
    },
    /// A reservation cannot grow: its final size is 1 to its reserved size.
    BeyondReservation {
        /// The size asked for.
        size: u64,
        /// The reservation's size.
        reserved: u64,
    },
    /// The heap keeps no writable alias of published code (flip mode).
    NotPatchable {
        /// Address of the block's first code byte.
        start: usize,
    },
}

impl fmt::Display for HeapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ZeroSize => f.write_str("reservation of 0 bytes"),
            Self::TooLarge { size, max } => {
                write!(f, "reservation of {size} bytes exceeds the heap's {max}")
            }
            Self::BadAlignment { align } => write!(
                f,
                "alignment {align} is not a power of two in 8..=page size"
            ),
            Self::HeapFull { size } => write!(f, "no free space for {size} bytes"),
            Self::BadUnwindRoom { room } => write!(
                f,
                "unwind room of {room} bytes exceeds {}",
                super::MAX_UNWIND_ROOM
            ),
            Self::BadSpan { span } => {
                write!(f, "heap span {span:#x} must be non-zero and under 4 GiB")
            }
            Self::DoubleFree { start } => write!(f, "block at {start:#x} was already freed"),
            Self::Moved { start, to } => {
                write!(
                    f,
                    "block at {start:#x} was moved to {to:#x}; use its new reference"
                )
            }
            Self::ForeignRef => f.write_str("code reference belongs to another heap"),
            Self::GdbJitUnavailable => f.write_str(
                "the GDB JIT interface needs jitmap's `gdb-jit` feature, which this build lacks",
            ),
            Self::UnknownRef { start } => {
                write!(f, "no block at {start:#x} was handed out by this heap")
            }
            Self::NotAMethod { start } => write!(f, "block at {start:#x} is a stub, not a method"),
            Self::BadStubKind { kind } => write!(f, "stub kind {kind} is outside 1..=15"),
            Self::Info(e) => write!(f, "invalid code info: {e}"),
            Self::Epoch(e) => write!(f, "{e}"),
            Self::Map(e) => write!(f, "nibble map: {e}"),
            Self::Memory { errno } => write!(
                f,
                "memory mapping failed: {}",
                std::io::Error::from_raw_os_error(*errno)
            ),
            Self::ForeignGuard => write!(f, "{ForeignGuard}"),
            Self::PositionDependent { start } => write!(
                f,
                "block at {start:#x} has an .eh_frame that cannot follow it (registered, or not absolute), so it cannot move"
            ),
            Self::NotPatchable { start } => write!(
                f,
                "block at {start:#x} is in a flip-mode heap, which cannot patch published code"
            ),
            Self::OutsideBlock {
                start,
                begin,
                end,
                size,
            } => write!(
                f,
                "bytes {begin}..{end} are not inside the block at {start:#x} ({size} bytes)"
            ),
            Self::BeyondReservation { size, reserved } => write!(
                f,
                "a final size of {size} bytes is not within the reservation's 1..={reserved}"
            ),
        }
    }
}

/// Each wrapper shows its inner error's message, so its source is the inner
/// error's own source: a chain printed whole names each cause once.
impl std::error::Error for HeapError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Info(e) => e.source(),
            Self::Epoch(e) => e.source(),
            Self::Map(e) => e.source(),
            _ => None,
        }
    }
}

impl From<std::io::Error> for HeapError {
    fn from(e: std::io::Error) -> Self {
        Self::Memory {
            errno: e.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}

impl From<InfoError> for HeapError {
    fn from(e: InfoError) -> Self {
        Self::Info(e)
    }
}

impl From<EpochError> for HeapError {
    fn from(e: EpochError) -> Self {
        Self::Epoch(e)
    }
}

impl From<MapError> for HeapError {
    fn from(e: MapError) -> Self {
        Self::Map(e)
    }
}

impl From<ForeignGuard> for HeapError {
    fn from(_: ForeignGuard) -> Self {
        Self::ForeignGuard
    }
}

impl fmt::Debug for HeapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::ZeroSize => f.write_str("ZeroSize"),
            Self::TooLarge { size, max } => {
                hex_struct!(f, "TooLarge", "size" => size, "max" => max)
            }
            Self::BadAlignment { align } => hex_struct!(f, "BadAlignment", "align" => align),
            Self::HeapFull { size } => hex_struct!(f, "HeapFull", "size" => size),
            Self::BadUnwindRoom { room } => hex_struct!(f, "BadUnwindRoom", "room" => room),
            Self::BadSpan { span } => hex_struct!(f, "BadSpan", "span" => span),
            Self::DoubleFree { start } => hex_struct!(f, "DoubleFree", "start" => start),
            Self::Moved { start, to } => hex_struct!(f, "Moved", "start" => start, "to" => to),
            Self::ForeignRef => f.write_str("ForeignRef"),
            Self::GdbJitUnavailable => f.write_str("GdbJitUnavailable"),
            Self::UnknownRef { start } => hex_struct!(f, "UnknownRef", "start" => start),
            Self::NotAMethod { start } => hex_struct!(f, "NotAMethod", "start" => start),
            Self::BadStubKind { kind } => {
                f.debug_struct("BadStubKind").field("kind", &kind).finish()
            }
            Self::Info(e) => f.debug_tuple("Info").field(&e).finish(),
            Self::Epoch(e) => f.debug_tuple("Epoch").field(&e).finish(),
            Self::Map(e) => f.debug_tuple("Map").field(&e).finish(),
            Self::Memory { errno } => f.debug_struct("Memory").field("errno", &errno).finish(),
            Self::ForeignGuard => f.write_str("ForeignGuard"),
            Self::PositionDependent { start } => {
                hex_struct!(f, "PositionDependent", "start" => start)
            }
            Self::NotPatchable { start } => hex_struct!(f, "NotPatchable", "start" => start),
            Self::OutsideBlock {
                start,
                begin,
                end,
                size,
            } => f
                .debug_struct("OutsideBlock")
                .field("start", &format_args!("{start:#x}"))
                .field("begin", &begin)
                .field("end", &end)
                .field("size", &size)
                .finish(),
            Self::BeyondReservation { size, reserved } => f
                .debug_struct("BeyondReservation")
                .field("size", &size)
                .field("reserved", &reserved)
                .finish(),
        }
    }
}
