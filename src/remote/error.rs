//! Errors of readers in other processes.

use std::fmt;

/// Why a remote read or lookup failed. A lookup that merely saw the host change
/// is not an error: it answers [`super::Unknown::Changing`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RemoteError {
    /// The bytes at `addr` could not be read (`errno` from the kernel: EFAULT
    /// for unmapped memory, EPERM without ptrace permission, ESRCH for no such
    /// process).
    Unreadable {
        /// First address of the read.
        addr: u64,
        /// Bytes asked for.
        len: usize,
        /// The error number.
        errno: i32,
    },
    /// A value read failed a sanity check: the memory is not what the descriptor
    /// says, or is hostile.
    Corrupt {
        /// Which check failed.
        what: &'static str,
        /// Where the value was read, or the value itself for a bad pointer.
        addr: u64,
    },
    /// The descriptor is missing its magic value, or has a layout this reader
    /// does not know.
    BadDescriptor {
        /// What did not match.
        what: &'static str,
    },
    /// `/proc/PID/...` could not be read.
    Proc {
        /// The process.
        pid: i32,
        /// The error number (ENOENT: no such process).
        errno: i32,
    },
    /// The process runs a .NET runtime whose layout this reader does not know.
    UnsupportedRuntime {
        /// The runtime's version string.
        version: String,
    },
    /// No mapped ELF file of the process defines the symbol.
    SymbolNotFound {
        /// The process.
        pid: i32,
        /// The symbol looked for.
        symbol: &'static str,
    },
    /// An assembly's PE file or ECMA-335 metadata could not be read.
    BadMetadata {
        /// What was wrong.
        what: &'static str,
    },
    /// No mapped ELF file of the process holds a jitmap descriptor, by its
    /// symbol or by its section.
    DescriptorNotFound {
        /// The process.
        pid: i32,
    },
    /// The host kept changing what was read (managers registered and
    /// dropped) through every attempt.
    Changing {
        /// What was read.
        what: &'static str,
    },
}

impl fmt::Display for RemoteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unreadable { addr, len, errno } => write!(
                f,
                "cannot read {len} bytes at {addr:#x}: {}",
                std::io::Error::from_raw_os_error(*errno)
            ),
            Self::Corrupt { what, addr } => write!(f, "corrupt memory: {what} ({addr:#x})"),
            Self::BadDescriptor { what } => write!(f, "not a jitmap descriptor: {what}"),
            Self::Proc { pid, errno } => write!(
                f,
                "cannot read /proc/{pid}: {}",
                std::io::Error::from_raw_os_error(*errno)
            ),
            Self::UnsupportedRuntime { version } => {
                write!(f, "unsupported .NET runtime {version}: only 8.0.x is known")
            }
            Self::SymbolNotFound { pid, symbol } => {
                write!(f, "process {pid} maps no ELF file that defines {symbol}")
            }
            Self::BadMetadata { what } => write!(f, "unreadable .NET metadata: {what}"),
            Self::DescriptorNotFound { pid } => write!(
                f,
                "process {pid} maps no ELF file that defines jitmap_descriptor, as a symbol \
                 or as the section a stripped host keeps: it does not link jitmap"
            ),
            Self::Changing { what } => {
                write!(f, "the host kept changing its {what} while they were read")
            }
        }
    }
}

impl std::error::Error for RemoteError {}
