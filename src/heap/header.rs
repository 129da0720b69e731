//! Code headers: what the runtime knows about a published method, kept outside
//! executable memory and reached through the slot before the code.

use std::fmt;
use std::sync::Arc;

use super::frame_registration::FrameRegistration;
#[cfg(feature = "gdb-jit")]
use crate::gdb::GdbRegistration;
use crate::info::{CodeInfo, DebugEntry, UnwindEntry};
use crate::unwind::UnwindRow;

/// What a header registered outside the heap on the method's behalf; withdrawn
/// when the header is reclaimed, after every reader and executor has left.
#[derive(Default)]
pub(crate) struct Registrations {
    pub(crate) _frame: Option<FrameRegistration>,
    #[cfg(feature = "gdb-jit")]
    pub(crate) _gdb: Option<GdbRegistration>,
}

/// A published method's header. The first fields are `#[repr(C)]` with a fixed
/// layout, so an out-of-process reader can read the id, size and name.
#[repr(C)]
pub struct CodeHeader {
    method_id: u64,
    code_size: u64,
    name_ptr: *const u8,
    name_len: usize,
    rows_ptr: *const UnwindRow,
    rows_len: usize,
    info: Arc<CodeInfo>,
    /// The method's `.eh_frame` evaluated into rows (`rows_ptr`, `rows_len`).
    rows: Box<[UnwindRow]>,
    _registrations: Registrations,
}

/// Where out-of-process readers find a [`CodeHeader`]'s fixed fields (byte
/// offsets; all six are 8 bytes wide).
pub(crate) struct HeaderLayout {
    pub(crate) method_id: usize,
    pub(crate) code_size: usize,
    pub(crate) name_ptr: usize,
    pub(crate) name_len: usize,
    pub(crate) rows_ptr: usize,
    pub(crate) rows_len: usize,
}

/// The layout of [`CodeHeader`], for the descriptor.
pub(crate) const HEADER_LAYOUT: HeaderLayout = HeaderLayout {
    method_id: std::mem::offset_of!(CodeHeader, method_id),
    code_size: std::mem::offset_of!(CodeHeader, code_size),
    name_ptr: std::mem::offset_of!(CodeHeader, name_ptr),
    name_len: std::mem::offset_of!(CodeHeader, name_len),
    rows_ptr: std::mem::offset_of!(CodeHeader, rows_ptr),
    rows_len: std::mem::offset_of!(CodeHeader, rows_len),
};

// SAFETY: a header is immutable once published; `name_ptr` points into `info.name`,
// which the shared, immutable `CodeInfo` owns and never mutates or moves, and
// `rows_ptr` into `rows`, which the header owns and never changes.
unsafe impl Send for CodeHeader {}
// SAFETY: as above; shared access is read-only.
unsafe impl Sync for CodeHeader {}

/// The unwind rows of a method of `code_size` bytes at `code_start`: its
/// `.eh_frame` evaluated, or none without one. Evaluated before the heap's
/// lock is taken, so that publishers do not wait on each other's DWARF.
pub(crate) fn unwind_rows(info: &CodeInfo, code_start: usize, code_size: u64) -> Box<[UnwindRow]> {
    info.eh_frame.as_ref().map_or_else(Box::default, |eh| {
        crate::unwind::rows::rows(&eh.frame, code_start, code_size)
    })
}

/// A method's `.eh_frame` for its code moved from `from` to `to`, or `None`
/// if it cannot be moved (see `unwind::rows::relocate`).
pub(crate) fn relocated_eh_frame(frame: &[u8], from: usize, to: usize) -> Option<Box<[u8]>> {
    crate::unwind::rows::relocate(frame, from, to)
}

impl CodeHeader {
    /// The header of a method of `code_size` bytes with its unwind `rows`
    /// ([`unwind_rows`]).
    pub(crate) fn new(
        info: Arc<CodeInfo>,
        rows: Box<[UnwindRow]>,
        code_size: u64,
        registrations: Registrations,
    ) -> Self {
        Self {
            _registrations: registrations,
            method_id: info.method_id,
            code_size,
            name_ptr: info.name.as_ptr(),
            name_len: info.name.len(),
            rows_ptr: rows.as_ptr(),
            rows_len: rows.len(),
            info,
            rows,
        }
    }

    /// The method's unwind rules: its `.eh_frame` evaluated at publish into
    /// rows sorted by code offset (empty without one), as readers in other
    /// processes find them.
    pub fn unwind_rows(&self) -> &[UnwindRow] {
        &self.rows
    }

    /// The runtime's method id.
    pub fn method_id(&self) -> u64 {
        self.method_id
    }

    /// Code size in bytes (hot and cold parts together).
    pub fn code_size(&self) -> u64 {
        self.code_size
    }

    /// The method's name.
    pub fn name(&self) -> &str {
        &self.info.name
    }

    /// The full info the host published.
    pub fn info(&self) -> &CodeInfo {
        &self.info
    }

    /// The info, shared (code events carry the same `Arc`).
    pub fn shared_info(&self) -> &Arc<CodeInfo> {
        &self.info
    }

    /// The unwind entry covering `offset` and its index (0 = main body).
    pub fn unwind_at(&self, offset: u64) -> Option<(usize, &UnwindEntry)> {
        let unwind = &self.info.unwind;
        let i = unwind.partition_point(|e| u64::from(e.begin) <= offset);
        let entry = unwind.get(i.checked_sub(1)?)?;
        (offset < u64::from(entry.end)).then_some((i - 1, entry))
    }

    /// The debug row in effect at `offset`.
    pub fn debug_at(&self, offset: u64) -> Option<&DebugEntry> {
        let debug = &self.info.debug;
        let i = debug.partition_point(|e| u64::from(e.offset) <= offset);
        debug.get(i.checked_sub(1)?)
    }
}

impl fmt::Debug for CodeHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CodeHeader")
            .field("method_id", &self.method_id)
            .field("code_size", &self.code_size)
            .field("name", &self.name())
            .finish_non_exhaustive()
    }
}
