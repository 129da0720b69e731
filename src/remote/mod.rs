//! Readers in other processes: the descriptor a host exports, and lookups over
//! another process's memory that are bounded, distrust what they read, and say
//! "unknown" rather than name the wrong method while the host churns.
//!
//! # How a reader finds and trusts the maps
//!
//! - [`jitmap_descriptor`] is a `#[repr(C)]` static, named by the ELF symbol
//!   tables and alone in its own section (which a stripped host keeps), that
//!   gives the layout of everything a reader touches and the roots of the
//!   managers' range maps (found in another process by
//!   `process::find_descriptor`, with the `inspect` feature).
//! - [`RemoteReader`] walks a range map (five levels, then at most
//!   [`MAX_FRAGMENTS`] fragments), a heap's start map (at most two words in v2,
//!   at most [`V1_MAX_WORDS`] in v1), its end map, the block's prefix and header,
//!   and at most [`MAX_NAME`] bytes of name. Every pointer is checked (non-null,
//!   aligned, in the user half) before it is followed, every size against its
//!   section, and every read fails cleanly on unmapped memory.
//! - A reader in another process cannot pin, so the host publishes two change
//!   sequences: one per range map, one per heap. Each is odd while its writer
//!   changes what a lookup reads, and bumped by two per change. A lookup reads
//!   both before and after it; if either differs or is odd, the answer may mix
//!   two states, and it retries (at most [`RETRIES`] times) before answering
//!   [`Unknown::Changing`]. When both match, no fragment, map word, prefix or
//!   header the lookup read changed or was freed in between (headers and
//!   fragments are freed only after the change that unlinked them), so the
//!   answer was true at the moment of the second read. This relies on the
//!   reads being done in program order, as `process_vm_readv` and the eBPF
//!   helpers copy on x86-64 (TSO); the writer orders its stores with Release.
//!
//! # Several managers in one process
//!
//! Each [`crate::ExecutionManager`] takes one of [`MAX_MANAGERS`] entries of the
//! descriptor when it is created and frees it when dropped; a reader tries each
//! registered range map in turn. A process with more live managers than entries
//! has the extra ones invisible to other processes
//! ([`crate::ExecutionManager::remote_index`] says which).
//!
//! ```
//! use jitmap::remote::{self, ProcessMemory, RemoteReader, Resolution};
//! use jitmap::{CodeInfo, ExecutionManager, HeapConfig, JitKind};
//!
//! let manager = ExecutionManager::new(8);
//! let heap = manager.create_heap(HeapConfig { span: 1 << 20, ..HeapConfig::default() })?;
//! let mut r = heap.reserve(100)?;
//! r.code_mut().fill(0xC3);
//! let code = r.publish(CodeInfo::new(42, "answer", JitKind::Optimized))?;
//!
//! // Here the "other process" is this one, read through process_vm_readv.
//! let memory = ProcessMemory::new(std::process::id() as i32);
//! let reader = RemoteReader::new(memory, remote::descriptor_address())?;
//! match reader.resolve(code.start() as u64 + 99)? {
//!     Resolution::Method(m) => assert_eq!((m.method_id, m.name.as_str(), m.offset), (42, "answer", 99)),
//!     other => panic!("{other:?}"),
//! }
//! assert_eq!(reader.resolve(code.start() as u64 + 100)?, Resolution::Nothing);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod checks;
#[cfg(feature = "inspect")]
#[cfg_attr(docsrs, doc(cfg(feature = "inspect")))]
pub mod dotnet;
mod error;
mod memory;
#[cfg(feature = "inspect")]
#[cfg_attr(docsrs, doc(cfg(feature = "inspect")))]
pub mod process;
mod reader;
mod words;

pub use crate::manager::descriptor::{
    Descriptor, LAYOUT_VERSION, MAGIC, MAX_MANAGERS, jitmap_descriptor,
};
pub use crate::unwind::UnwindRow;
pub use error::RemoteError;
pub use memory::{Counted, Memory, MemoryImage, ProcessMemory};
pub use reader::{
    ImageMethodFound, Layout, ManagerStubNames, ReadStats, RemoteMethod, RemoteReader,
    RemoteSection, Resolution, SectionKind, Unknown,
};

/// Fragments followed in one chunk's list before the list is called corrupt.
/// Sections are at least a page, so a 128 KiB chunk holds at most 32.
pub const MAX_FRAGMENTS: usize = 32;
/// Start-map words a v1 lookup reads before answering [`Unknown::TooFar`]:
/// 1,024 words cover 256 KiB of code before the address.
pub const V1_MAX_WORDS: usize = 1024;
/// Bytes of a method name read; longer names are cut.
pub const MAX_NAME: usize = 1024;
/// Unwind rows of one method read, in one read of 16 bytes each; a header
/// that claims more is [`RemoteError::Corrupt`] (rows cut short would
/// stretch the last one read over the rest of the method).
pub const MAX_ROWS: usize = 16_384;
/// Attempts of a lookup that saw the host change under it before it answers
/// [`Unknown::Changing`].
pub const RETRIES: usize = 4;

/// The address of this process's descriptor (what another process finds through
/// the symbol table).
pub fn descriptor_address() -> u64 {
    std::ptr::from_ref(&jitmap_descriptor).addr() as u64
}
