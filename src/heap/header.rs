//! Code headers: what the runtime knows about a published method, kept outside
//! executable memory and reached through the slot before the code.
//!
//! A header is one 64-byte cache line in its heap's slab (`slab`): the
//! method's id, size and name (in the heap's name arena, `names`), its unwind
//! rows, and one word the writer keeps (the reference's generation, the tier
//! and the alignment). Everything a method may lack (unwind and debug
//! entries, GC info, a cold part, `.eh_frame`, registrations with the
//! unwinder or gdb) is behind one pointer that is null when it has none, so
//! a method published with `CodeInfo::new` alone costs its header and its
//! name's bytes.

use std::fmt;
use std::sync::Arc;

use super::frame_registration::FrameRegistration;
use super::names::Name;
#[cfg(feature = "gdb-jit")]
use crate::gdb::GdbRegistration;
use crate::info::{CodeInfo, DebugEntry, EhFrame, GcInfo, JitKind, UnwindEntry};
use crate::unwind::UnwindRow;

/// What a header registered outside the heap on the method's behalf; withdrawn
/// when the header is reclaimed, after every reader and executor has left.
#[derive(Default)]
pub(crate) struct Registrations {
    pub(crate) frame: Option<FrameRegistration>,
    #[cfg(feature = "gdb-jit")]
    pub(crate) gdb: Option<GdbRegistration>,
}

impl Registrations {
    fn is_empty(&self) -> bool {
        #[cfg(feature = "gdb-jit")]
        let gdb = self.gdb.is_none();
        #[cfg(not(feature = "gdb-jit"))]
        let gdb = true;
        self.frame.is_none() && gdb
    }
}

/// The parts of a method only some methods have.
struct Extras {
    /// The info as the host published it (the name is read from it).
    info: Arc<CodeInfo>,
    /// The method's `.eh_frame` evaluated into rows (`rows_ptr`, `rows_len`).
    rows: Box<[UnwindRow]>,
    _registrations: Registrations,
}

/// A published method's header. `#[repr(C)]`, so that an out-of-process
/// reader finds the id, size, name and unwind rows at the offsets the
/// descriptor gives (`docs/descriptor.md`); aligned to a cache line, so that
/// a lookup reads one line of it.
#[repr(C, align(64))]
pub struct CodeHeader {
    method_id: u64,
    code_size: u64,
    name_ptr: *const u8,
    name_len: usize,
    rows_ptr: *const UnwindRow,
    rows_len: usize,
    /// Null for a method with nothing beyond its id, name and tier.
    extras: Option<Box<Extras>>,
    /// The writer's word: the reference's generation (bits 8 and up), the
    /// tier (bits 6 and 7) and log2 of the alignment the block was reserved
    /// with (bits 0 to 5).
    packed: u64,
}

// The whole point of the layout: one cache line per header.
const _: () = assert!(size_of::<CodeHeader>() == 64 && align_of::<CodeHeader>() == 64);

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

// SAFETY: a header is immutable once published; `name_ptr` points into the
// heap's name arena (freed only when the header is) or into the extras' info,
// and `rows_ptr` into the extras' rows, both owned and never changed.
unsafe impl Send for CodeHeader {}
// SAFETY: as above; shared access is read-only.
unsafe impl Sync for CodeHeader {}

/// Generations fit in 56 bits: a heap publishing a method every 100 ns would
/// need two centuries to exhaust them.
pub(crate) const GENERATION_LIMIT: u64 = 1 << 56;

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

/// A method's info as a publish gets it: from the host, or shared with the
/// block a move copies (no clone of its unwind and debug data).
pub(crate) enum HostInfo {
    Owned(CodeInfo),
    Shared(Arc<CodeInfo>),
}

impl HostInfo {
    pub(crate) fn get(&self) -> &CodeInfo {
        match self {
            Self::Owned(info) => info,
            Self::Shared(info) => info,
        }
    }

    fn into_shared(self) -> Arc<CodeInfo> {
        match self {
            Self::Owned(info) => Arc::new(info),
            Self::Shared(info) => info,
        }
    }
}

/// Whether a method needs more than its id, name and tier.
fn has_extras(info: &CodeInfo, rows: &[UnwindRow], registrations: &Registrations) -> bool {
    !(info.unwind.is_empty()
        && info.debug.is_empty()
        && info.gc.is_none()
        && info.cold_offset.is_none()
        && info.eh_frame.is_none()
        && rows.is_empty()
        && registrations.is_empty())
}

fn kind_bits(kind: JitKind) -> u64 {
    match kind {
        JitKind::Baseline => 0,
        JitKind::Optimized => 1,
        JitKind::Instrumented => 2,
        JitKind::Precompiled => 3,
    }
}

/// Everything about a method the heap keeps, before it has a slot.
pub(crate) struct NewHeader {
    pub(crate) info: HostInfo,
    /// Whether listeners hear of the method: the load event then shares the
    /// info's `Arc` with them.
    pub(crate) share: bool,
    pub(crate) rows: Box<[UnwindRow]>,
    pub(crate) code_size: u64,
    pub(crate) registrations: Registrations,
    /// Below [`GENERATION_LIMIT`].
    pub(crate) generation: u64,
    /// A power of two up to 2^63.
    pub(crate) align: u64,
}

impl NewHeader {
    /// Whether the header keeps its name in the heap's arena (true for a
    /// method with nothing else: one with extras reads it from their info).
    pub(crate) fn name_in_arena(&self) -> bool {
        !has_extras(self.info.get(), &self.rows, &self.registrations)
    }

    /// The header; `arena_name` is the name's copy in the heap's arena when
    /// [`NewHeader::name_in_arena`], else `None`. Also returns the info to
    /// give listeners, when they hear of the method.
    pub(crate) fn build(self, arena_name: Option<Name>) -> (CodeHeader, Option<Arc<CodeInfo>>) {
        let Self {
            info,
            share,
            rows,
            code_size,
            registrations,
            generation,
            align,
        } = self;
        debug_assert!(generation < GENERATION_LIMIT && align.is_power_of_two());
        let packed =
            generation << 8 | kind_bits(info.get().kind) << 6 | u64::from(align.trailing_zeros());
        let method_id = info.get().method_id;
        let (name_ptr, name_len, extras, shared) = match arena_name {
            Some(name) => (
                name.ptr.as_ptr().cast_const(),
                name.len,
                None,
                share.then(|| info.into_shared()),
            ),
            None => {
                let info = info.into_shared();
                let extras = Box::new(Extras {
                    info: Arc::clone(&info),
                    rows,
                    _registrations: registrations,
                });
                let name = (extras.info.name.as_ptr(), extras.info.name.len());
                (name.0, name.1, Some(extras), share.then_some(info))
            }
        };
        // Null without rows, as the descriptor documents.
        let (rows_ptr, rows_len) = match &extras {
            Some(e) if !e.rows.is_empty() => (e.rows.as_ptr(), e.rows.len()),
            _ => (std::ptr::null(), 0),
        };
        let header = CodeHeader {
            method_id,
            code_size,
            name_ptr,
            name_len,
            rows_ptr,
            rows_len,
            extras,
            packed,
        };
        (header, shared)
    }
}

impl CodeHeader {
    /// The name's bytes in the heap's arena, if it is kept there (to give
    /// back when the header is reclaimed).
    pub(crate) fn arena_name(&self) -> Option<Name> {
        self.extras.is_none().then(|| Name {
            ptr: std::ptr::NonNull::new(self.name_ptr.cast_mut())
                .unwrap_or(std::ptr::NonNull::dangling()),
            len: self.name_len,
        })
    }

    /// The generation of the reference that frees or moves the block.
    pub(crate) fn generation(&self) -> u64 {
        self.packed >> 8
    }

    /// The alignment the block was reserved with (kept by moves).
    pub(crate) fn align(&self) -> u64 {
        1 << (self.packed & 63)
    }

    /// The method's unwind rules: its `.eh_frame` evaluated at publish into
    /// rows sorted by code offset (empty without one), as readers in other
    /// processes find them.
    ///
    /// Read from the header's own line (`rows_ptr`, `rows_len`), not
    /// through the extras: the signal handler steps every JIT frame with
    /// them.
    pub fn unwind_rows(&self) -> &[UnwindRow] {
        if self.rows_len == 0 {
            return &[];
        }
        // SAFETY: a non-zero `rows_len` comes with `rows_ptr` into the
        // extras' rows, which the header owns and never changes.
        unsafe { std::slice::from_raw_parts(self.rows_ptr, self.rows_len) }
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
        if self.name_len == 0 {
            return "";
        }
        // SAFETY: `name_ptr` and `name_len` are a `str`'s bytes copied into
        // the heap's arena, or the extras' info's name; either lives, unchanged,
        // as long as the header.
        unsafe {
            std::str::from_utf8_unchecked(std::slice::from_raw_parts(self.name_ptr, self.name_len))
        }
    }

    /// The compiler tier.
    pub fn kind(&self) -> JitKind {
        match self.packed >> 6 & 3 {
            0 => JitKind::Baseline,
            1 => JitKind::Optimized,
            2 => JitKind::Instrumented,
            _ => JitKind::Precompiled,
        }
    }

    /// Unwind entries: the main body first, then one per funclet (empty if
    /// the host gave none).
    pub fn unwind(&self) -> &[UnwindEntry] {
        self.extras.as_ref().map_or(&[], |e| &e.info.unwind)
    }

    /// Native-offset → source rows (empty if the host gave none).
    pub fn debug(&self) -> &[DebugEntry] {
        self.extras.as_ref().map_or(&[], |e| &e.info.debug)
    }

    /// GC info, if the method has any.
    pub fn gc(&self) -> Option<&GcInfo> {
        self.extras.as_ref().and_then(|e| e.info.gc.as_ref())
    }

    /// Where the cold part begins (the hot part's size), if the method has one.
    pub fn cold_offset(&self) -> Option<u32> {
        self.extras.as_ref().and_then(|e| e.info.cold_offset)
    }

    /// The method's DWARF unwinding tables, if the host gave them.
    pub fn eh_frame(&self) -> Option<&EhFrame> {
        self.extras.as_ref().and_then(|e| e.info.eh_frame.as_ref())
    }

    /// The info the host published, for code events and listings: shared
    /// when the method has more than an id, a name and a tier (the header
    /// keeps it), made afresh (one allocation) otherwise. Listeners tell
    /// versions apart by [`crate::events::BlockId`], not by this `Arc`.
    pub fn to_info(&self) -> Arc<CodeInfo> {
        match &self.extras {
            Some(e) => Arc::clone(&e.info),
            None => Arc::new(CodeInfo::new(self.method_id, self.name(), self.kind())),
        }
    }

    /// The unwind entry covering `offset` and its index (0 = main body).
    pub fn unwind_at(&self, offset: u64) -> Option<(usize, &UnwindEntry)> {
        let unwind = self.unwind();
        let i = unwind.partition_point(|e| u64::from(e.begin) <= offset);
        let entry = unwind.get(i.checked_sub(1)?)?;
        (offset < u64::from(entry.end)).then_some((i - 1, entry))
    }

    /// The debug row in effect at `offset`.
    pub fn debug_at(&self, offset: u64) -> Option<&DebugEntry> {
        let debug = self.debug();
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
            .field("kind", &self.kind())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::heap::names::NameArena;

    /// Rows given at publish read back from the header's own fields, and a
    /// method given none has none (and a null `rows_ptr`, as documented).
    #[test]
    fn unwind_rows_read_back_from_the_header_line() {
        let rows: Box<[UnwindRow]> = (0..3)
            .map(|i| UnwindRow {
                offset: 4 * i,
                cfa: 8 + i as i32,
                ..UnwindRow::default()
            })
            .collect();
        for given in [rows.clone(), Box::default()] {
            let new = NewHeader {
                info: HostInfo::Owned(CodeInfo::new(1, "f", JitKind::Optimized)),
                share: false,
                rows: given.clone(),
                code_size: 16,
                registrations: Registrations::default(),
                generation: 1,
                align: 16,
            };
            let (header, _) = new.build(None);
            assert_eq!(header.unwind_rows(), &*given);
            assert_eq!(header.rows_ptr.is_null(), given.is_empty());
        }
    }

    /// The writer's word keeps the generation, tier and alignment apart,
    /// at their extremes; a method with nothing but an id, a name and a tier
    /// has no extras, and one with a cold part has them.
    #[test]
    fn the_packed_word_and_extras_round_trip() {
        let kinds = [
            JitKind::Baseline,
            JitKind::Optimized,
            JitKind::Instrumented,
            JitKind::Precompiled,
        ];
        let mut arena = NameArena::default();
        for (i, kind) in kinds.into_iter().enumerate() {
            for (generation, align) in [(1, 8), (GENERATION_LIMIT - 1, 1 << 63), (12345, 1 << 16)] {
                let mut info = CodeInfo::new(i as u64, "name", kind);
                info.cold_offset = (i % 2 == 1).then_some(3);
                let new = NewHeader {
                    info: HostInfo::Owned(info),
                    share: false,
                    rows: Box::default(),
                    code_size: 7,
                    registrations: Registrations::default(),
                    generation,
                    align,
                };
                assert_eq!(new.name_in_arena(), i % 2 == 0);
                let name = new.name_in_arena().then(|| arena.insert("name"));
                let (header, shared) = new.build(name);
                let header_name = name;
                assert!(shared.is_none());
                assert_eq!(
                    (header.generation(), header.align(), header.kind()),
                    (generation, align, kind)
                );
                assert_eq!(
                    (
                        header.name(),
                        header.cold_offset(),
                        header.arena_name().is_some()
                    ),
                    ("name", (i % 2 == 1).then_some(3), i % 2 == 0)
                );
                assert_eq!(*header.to_info(), {
                    let mut info = CodeInfo::new(i as u64, "name", kind);
                    info.cold_offset = (i % 2 == 1).then_some(3);
                    info
                });
                if let Some(name) = header.arena_name() {
                    assert_eq!(Some(name), header_name);
                    // SAFETY: the header is dropped right after; its name is
                    // given back once.
                    unsafe { arena.free(name) };
                }
            }
        }
    }
}
