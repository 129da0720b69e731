//! Heaps and what a host does with code in them: reserve, write, publish,
//! abort, free, move and patch.

use jitmap::heap::StubKind;
use jitmap::info::{DebugEntry, EhFrame, GcInfo, UnwindEntry};
use jitmap::{CodeHeap, CodeInfo, CodeRef, HeapConfig, JitKind, MapVersion, MemoryMode, OwnedHeap};
use jitmap::{Reservation, heap::HeapError};

use crate::handles::{self, Exclusive, Kept, Kind, Use};
use crate::manager::manager;
use crate::status::{Failure, call, jitmap_status};
use crate::types::{
    jitmap_code, jitmap_code_info, jitmap_heap_config, jitmap_jit_kind, jitmap_memory_mode,
};
use crate::{bits, jitmap_heap, jitmap_manager, jitmap_reservation, required, slice, utf8};

struct HeapObject {
    heap: OwnedHeap,
    _manager: Kept,
}

/// Used only through exclusive uses of its handle (one call at a time), so
/// it needs no lock.
struct ReservationObject {
    /// Borrows the code heap of the heap handle `_heap` keeps alive.
    /// `Some` but for the moment a publish holds it: a refused publish puts
    /// it back, so a failed call leaves the reservation pending.
    reservation: Option<Reservation<'static>>,
    /// Declared after the reservation, so dropped after it.
    _heap: Kept,
}

fn heap(h: *mut jitmap_heap) -> Result<Use<HeapObject>, jitmap_status> {
    handles::take(bits(h), Kind::Heap)
}

/// A `jitmap_jit_kind`'s number.
pub(crate) fn kind_number(kind: JitKind) -> u32 {
    (match kind {
        JitKind::Baseline => jitmap_jit_kind::JITMAP_JIT_BASELINE,
        JitKind::Optimized => jitmap_jit_kind::JITMAP_JIT_OPTIMIZED,
        JitKind::Instrumented => jitmap_jit_kind::JITMAP_JIT_INSTRUMENTED,
        JitKind::Precompiled => jitmap_jit_kind::JITMAP_JIT_PRECOMPILED,
    }) as u32
}

/// The tier a host may publish under number `kind`: any but precompiled,
/// which only images hold.
fn publishable_kind(kind: u32) -> Result<JitKind, Failure> {
    [JitKind::Baseline, JitKind::Optimized, JitKind::Instrumented]
        .into_iter()
        .find(|k| kind_number(*k) == kind)
        .ok_or_else(|| bad(format!("{kind} is not a jitmap_jit_kind a host publishes")))
}

fn bad(what: String) -> Failure {
    Failure::new(jitmap_status::JITMAP_STATUS_BAD_ARGUMENT, what)
}

fn flag(value: u8, what: &str) -> Result<bool, Failure> {
    match value {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(bad(format!("{what} must be 0 or 1, not {other}"))),
    }
}

/// Writes the default heap configuration: 64 MiB, map version 2, RWX,
/// 16-byte alignment, huge pages, no unwinder or debugger registration.
///
/// Async-signal-safe.
///
/// # Safety
/// `out` is NULL (nothing is written) or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_heap_config_default(out: *mut jitmap_heap_config) {
    let d = HeapConfig::default();
    if !out.is_null() {
        // SAFETY: not NULL; writable by the caller's contract.
        unsafe {
            out.write(jitmap_heap_config {
                span: d.span,
                map_version: 2,
                mode: jitmap_memory_mode::JITMAP_MEMORY_RWX as u32,
                align: d.align,
                huge_pages: u8::from(d.huge_pages),
                register_unwind: 0,
                gdb_jit: 0,
                unwind_room: d.unwind_room as u32,
            })
        };
    }
}

/// Creates a heap in the manager: its own mapping, nibble map and range in
/// the manager's lookup.
///
/// Not async-signal-safe. Owner: the caller, who destroys it with
/// `jitmap_heap_destroy` after its pending reservations, and before its
/// manager.
///
/// # Safety
/// `config` is NULL or points to a `jitmap_heap_config`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_heap_create(
    manager: *mut jitmap_manager,
    config: *const jitmap_heap_config,
    out: *mut *mut jitmap_heap,
) -> jitmap_status {
    call(|| {
        let m = self::manager(manager)?;
        required(config)?;
        required(out)?;
        // SAFETY: checked not NULL; a config by the caller's contract.
        let c = unsafe { *config };
        let version = match c.map_version {
            1 => MapVersion::V1,
            2 => MapVersion::V2,
            v => return Err(bad(format!("map_version must be 1 or 2, not {v}"))),
        };
        let mode = match c.mode {
            x if x == jitmap_memory_mode::JITMAP_MEMORY_RWX as u32 => MemoryMode::Rwx,
            x if x == jitmap_memory_mode::JITMAP_MEMORY_WRITE_XOR_EXECUTE as u32 => {
                MemoryMode::WriteXorExecute
            }
            x if x == jitmap_memory_mode::JITMAP_MEMORY_FLIP_ON_PUBLISH as u32 => {
                MemoryMode::FlipOnPublish
            }
            other => return Err(bad(format!("{other} is not a jitmap_memory_mode"))),
        };
        let config = HeapConfig {
            span: c.span,
            version,
            mode,
            align: c.align,
            huge_pages: flag(c.huge_pages, "huge_pages")?,
            register_unwind: flag(c.register_unwind, "register_unwind")?,
            gdb_jit: flag(c.gdb_jit, "gdb_jit")?,
            unwind_room: u64::from(c.unwind_room),
        };
        // This crate's own feature decides, not the library's (which a
        // workspace build may have turned on for another crate).
        if config.gdb_jit && !cfg!(feature = "gdb-jit") {
            return Err(Failure::new(
                jitmap_status::JITMAP_STATUS_GDB_JIT_UNAVAILABLE,
                "this build of jitmap-capi lacks the gdb-jit feature",
            ));
        }
        let heap = m.get().manager.create_heap(config)?;
        let handle = handles::insert(
            Kind::Heap,
            Box::new(HeapObject {
                heap,
                _manager: m.keep(),
            }),
        )?;
        // SAFETY: checked not NULL.
        unsafe { out.write(handle as *mut jitmap_heap) };
        Ok(())
    })
}

/// Destroys a heap: its code leaves every lookup at once, and its memory is
/// unmapped once every reader and online executor has passed a grace
/// period. Refused with `JITMAP_STATUS_IN_USE` while a reservation of it is
/// pending or a call on it is in progress.
///
/// Not async-signal-safe.
#[unsafe(no_mangle)]
pub extern "C" fn jitmap_heap_destroy(heap: *mut jitmap_heap) -> jitmap_status {
    call(|| {
        drop(handles::remove::<HeapObject>(bits(heap), Kind::Heap)?);
        Ok(())
    })
}

/// Reserves `size` bytes of code, aligned to `align` (0: the heap's
/// default), and writes where to write the code to `write` (may be NULL;
/// `jitmap_reservation_code` says it again, with the address the code will
/// run at). Until it is published, no lookup sees it.
///
/// Not async-signal-safe. Owner: the caller, who publishes or aborts it
/// exactly once.
///
/// # Safety
/// Each of `out`, `write`: NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_heap_reserve(
    heap: *mut jitmap_heap,
    size: u64,
    align: u64,
    out: *mut *mut jitmap_reservation,
    write: *mut *mut u8,
) -> jitmap_status {
    call(|| {
        let h = self::heap(heap)?;
        required(out)?;
        // SAFETY: the heap object, and the code heap its OwnedHeap holds,
        // live as long as a use of its handle: the reservation object keeps
        // this one (`_heap`, dropped after the reservation).
        let code_heap: &'static CodeHeap = unsafe { &*std::ptr::from_ref(&**h.get().heap.heap()) };
        let mut reservation = reserve(code_heap, size, align)?;
        // The bytes are the heap's: the pointer stays valid as the
        // reservation moves into its object.
        let bytes = reservation.code_mut().as_mut_ptr();
        let object = ReservationObject {
            reservation: Some(reservation),
            _heap: h.keep(),
        };
        let handle = handles::insert(Kind::Reservation, Box::new(object))?;
        // SAFETY: checked not NULL; `write` may be NULL, else writable.
        unsafe { out.write(handle as *mut jitmap_reservation) };
        if !write.is_null() {
            // SAFETY: as above.
            unsafe { write.write(bytes) };
        }
        Ok(())
    })
}

/// `size` bytes of `heap`, aligned to `align` (0: the heap's default).
fn reserve(heap: &CodeHeap, size: u64, align: u64) -> Result<Reservation<'_>, HeapError> {
    if align == 0 {
        heap.reserve(size)
    } else {
        heap.reserve_aligned(size, align)
    }
}

fn reservation(r: *mut jitmap_reservation) -> Result<Exclusive<ReservationObject>, jitmap_status> {
    handles::take_exclusive(bits(r), Kind::Reservation)
}

/// Where to write a reservation's code (`write`: in W^X heaps a writable
/// view at an unrelated address), the address it will run at (`address`,
/// for relocations and `.eh_frame`), and its length. Any output may be NULL.
///
/// Not async-signal-safe.
///
/// # Safety
/// Each of `write`, `address`, `len`: NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_reservation_code(
    reservation: *mut jitmap_reservation,
    write: *mut *mut u8,
    address: *mut usize,
    len: *mut u64,
) -> jitmap_status {
    call(|| {
        let mut r = self::reservation(reservation)?;
        let reservation = pending(r.get_mut())?;
        // SAFETY (all three writes): each pointer checked not NULL; writable
        // by the caller's contract.
        if !write.is_null() {
            unsafe { write.write(reservation.code_mut().as_mut_ptr()) };
        }
        if !address.is_null() {
            unsafe { address.write(reservation.address()) };
        }
        if !len.is_null() {
            unsafe { len.write(reservation.len()) };
        }
        Ok(())
    })
}

/// Sets a reservation's final code size, `size` bytes of those reserved,
/// and gives the space past it back to the heap at once: for a JIT that
/// reserves an upper bound and learns the code's size when it has emitted
/// it. Lookups then end with the code, not with the reservation. The bytes
/// kept, and the write pointer, are unchanged; the bytes from `size` on are
/// the heap's again, and another reservation may take them at once: write
/// none past `size`. 0, or more than the reservation holds, is refused
/// (`JITMAP_STATUS_BAD_ARGUMENT`), with nothing changed.
///
/// Not async-signal-safe.
///
/// # Safety
/// None beyond a handle from this library (any value is checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_reservation_shrink(
    reservation: *mut jitmap_reservation,
    size: u64,
) -> jitmap_status {
    call(|| {
        let mut r = self::reservation(reservation)?;
        pending(r.get_mut())?.shrink_to(size)?;
        Ok(())
    })
}

/// The method info `c` describes, checked against `size` bytes of code if
/// given (publish checks it again; a caller whose reservation must outlive
/// a refusal checks first).
///
/// # Safety
/// `c`'s pointers follow `jitmap_code_info`'s contract.
unsafe fn code_info(c: &jitmap_code_info, size: Option<u64>) -> Result<CodeInfo, Failure> {
    // SAFETY (every read below): the caller's contract.
    let name = unsafe { utf8(c.name, "name") }?;
    let mut info = CodeInfo::new(c.method_id, name, publishable_kind(c.kind)?);
    for e in unsafe { slice(c.unwind, c.unwind_count, "unwind") }? {
        info.unwind.push(UnwindEntry {
            begin: e.begin,
            end: e.end,
            data: unsafe { slice(e.data, e.len, "unwind data") }?.into(),
        });
    }
    for d in unsafe { slice(c.debug, c.debug_count, "debug") }? {
        info.debug.push(DebugEntry {
            offset: d.offset,
            line: d.line,
            column: d.column,
            file: unsafe { utf8(d.file, "a debug row's file") }?.into(),
        });
    }
    if c.gc_info_len > 0 {
        info.gc = Some(GcInfo {
            version: c.gc_version,
            bytes: unsafe { slice(c.gc_info, c.gc_info_len, "gc_info") }?.into(),
        });
    }
    if c.cold_offset != 0 {
        info.cold_offset = Some(c.cold_offset);
    }
    if c.eh_frame_len > 0 {
        info.eh_frame = Some(EhFrame {
            frame: unsafe { slice(c.eh_frame, c.eh_frame_len, "eh_frame") }?.into(),
            header: unsafe { slice(c.eh_frame_hdr, c.eh_frame_hdr_len, "eh_frame_hdr") }?.into(),
        });
    }
    if let Some(size) = size {
        info.validate(size)
            .map_err(|e| Failure::new(jitmap_status::JITMAP_STATUS_BAD_CODE_INFO, e.to_string()))?;
    }
    Ok(info)
}

/// The reservation a handle holds.
fn pending(object: &mut ReservationObject) -> Result<&mut Reservation<'static>, Failure> {
    object
        .reservation
        .as_mut()
        .ok_or_else(|| jitmap_status::JITMAP_STATUS_DESTROYED.into())
}

/// Takes a reservation out of its handle for `finish`, under the handle's
/// exclusive use; the handle is destroyed when `finish` consumes it. Checked
/// by `check` first, and a refusal by either leaves the reservation pending
/// (`finish` gives it back with its error).
fn consume<T>(
    r: *mut jitmap_reservation,
    check: impl FnOnce(&Reservation<'static>) -> Result<T, Failure>,
    finish: impl FnOnce(Reservation<'static>, T) -> Result<(), (Reservation<'static>, Failure)>,
) -> Result<(), Failure> {
    let mut r = self::reservation(r)?;
    let checked = check(pending(r.get_mut())?)?;
    let object = r.get_mut();
    let Some(reservation) = object.reservation.take() else {
        return Err(jitmap_status::JITMAP_STATUS_DESTROYED.into());
    };
    // The heap the reservation borrows stays kept by the handle meanwhile.
    match finish(reservation, checked) {
        Ok(()) => {
            drop(r.remove());
            Ok(())
        }
        Err((back, failure)) => {
            r.get_mut().reservation = Some(back);
            Err(failure)
        }
    }
}

/// Publishes a reservation as a method: from now on every lookup finds it.
/// Destroys the reservation handle. Any refusal leaves the reservation
/// pending, its bytes as written: a refused info
/// (`JITMAP_STATUS_BAD_CODE_INFO`, `JITMAP_STATUS_BAD_ARGUMENT`, a NULL),
/// and one refused later, such as an `.eh_frame` the system unwinder
/// refuses; the host may publish it again or abort it.
///
/// Not async-signal-safe.
///
/// # Safety
/// `info` is NULL or points to a `jitmap_code_info` whose pointers follow
/// its contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_reservation_publish(
    reservation: *mut jitmap_reservation,
    info: *const jitmap_code_info,
    out: *mut jitmap_code,
) -> jitmap_status {
    call(|| {
        required(info)?;
        required(out)?;
        consume(
            reservation,
            // SAFETY: checked not NULL; the caller's contract.
            |r| unsafe { code_info(&*info, Some(r.len())) },
            |r, info| match r.try_publish(info) {
                Ok(code) => {
                    // SAFETY: checked not NULL.
                    unsafe { out.write(code.into()) };
                    Ok(())
                }
                Err(refused) => Err((refused.reservation, refused.error.into())),
            },
        )
    })
}

/// Publishes `size` bytes of finished code as a method in one call:
/// reserves them (aligned to `align`, 0: the heap's default), copies them
/// in and publishes, for a compiler that assembles into its own buffer. The
/// code must not depend on its address: a host that relocates to the final
/// address uses a reservation (`jitmap_heap_reserve`). A refused info
/// (`JITMAP_STATUS_BAD_CODE_INFO`, ...) changes nothing.
///
/// Not async-signal-safe.
///
/// # Safety
/// `code` is NULL (with `size` 0) or points to `size` bytes; `info` is NULL
/// or follows `jitmap_code_info`'s contract; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_heap_publish(
    heap: *mut jitmap_heap,
    code: *const u8,
    size: u64,
    align: u64,
    info: *const jitmap_code_info,
    out: *mut jitmap_code,
) -> jitmap_status {
    call(|| {
        let h = self::heap(heap)?;
        required(info)?;
        required(out)?;
        let bytes = usize::try_from(size).map_err(|_| HeapError::TooLarge {
            size,
            max: usize::MAX as u64,
        })?;
        // SAFETY: the caller's contract.
        let bytes = unsafe { slice(code, bytes, "code") }?;
        // SAFETY: checked not NULL; the caller's contract. Publish checks
        // the info, and a refusal gives the space back.
        let info = unsafe { code_info(&*info, None) }?;
        let code_heap = h.get().heap.heap();
        let mut reservation = reserve(code_heap, size, align)?;
        reservation.code_mut().copy_from_slice(bytes);
        let code = reservation.publish(info)?;
        // SAFETY: checked not NULL.
        unsafe { out.write(code.into()) };
        Ok(())
    })
}

/// Publishes a reservation as a stub of `kind` (1 to 15, the host's to
/// name: precode, jump stub...): lookups classify it as that stub. Destroys
/// the reservation handle; a bad kind leaves it pending.
///
/// Not async-signal-safe.
///
/// # Safety
/// `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_reservation_publish_stub(
    reservation: *mut jitmap_reservation,
    kind: u8,
    out: *mut jitmap_code,
) -> jitmap_status {
    call(|| {
        required(out)?;
        consume(
            reservation,
            |_| Ok(StubKind::try_from(kind)?),
            |r, kind| match r.try_publish_stub(kind) {
                Ok(code) => {
                    // SAFETY: checked not NULL.
                    unsafe { out.write(code.into()) };
                    Ok(())
                }
                Err(refused) => Err((refused.reservation, refused.error.into())),
            },
        )
    })
}

/// Gives a reservation's space back; no lookup ever saw it. Destroys the
/// reservation handle.
///
/// Not async-signal-safe.
#[unsafe(no_mangle)]
pub extern "C" fn jitmap_reservation_abort(reservation: *mut jitmap_reservation) -> jitmap_status {
    call(|| {
        consume(
            reservation,
            |_| Ok(()),
            |r, ()| {
                r.abort();
                Ok(())
            },
        )
    })
}

/// Runs `f` on a heap and a code handle.
fn with_code(
    heap: *mut jitmap_heap,
    code: jitmap_code,
    f: impl FnOnce(&CodeHeap, CodeRef) -> Result<(), HeapError>,
) -> jitmap_status {
    call(|| {
        let h = self::heap(heap)?;
        f(h.get().heap.heap(), code.into())?;
        Ok(())
    })
}

/// Frees a published block: lookups stop finding it at once; its bytes are
/// reused once every reader and online executor has passed a grace period.
///
/// Not async-signal-safe.
#[unsafe(no_mangle)]
pub extern "C" fn jitmap_heap_free(heap: *mut jitmap_heap, code: jitmap_code) -> jitmap_status {
    with_code(heap, code, |h, c| h.free(c))
}

/// Moves a published method to a new address (code and info copied, the old
/// block freed through the grace period) and writes its new handle.
///
/// Not async-signal-safe.
///
/// # Safety
/// `moved` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_heap_move(
    heap: *mut jitmap_heap,
    code: jitmap_code,
    moved: *mut jitmap_code,
) -> jitmap_status {
    if moved.is_null() {
        return call(|| Err(jitmap_status::JITMAP_STATUS_NULL_POINTER.into()));
    }
    with_code(heap, code, |h, c| {
        let to = h.move_block(c)?;
        // SAFETY: checked not NULL.
        unsafe { moved.write(to.into()) };
        Ok(())
    })
}

/// Writes `len` bytes at `offset` into published code, with the
/// instruction-cache maintenance and the cross-core sync (done even when
/// the bytes are those already there, or `len` is 0: it then makes bytes
/// written in place visible, as `jitmap_heap_make_visible` does for a
/// range). Each aligned word
/// holding a changed byte (8 bytes on x86-64, a 32-bit instruction on
/// aarch64) is written by one store, so a thread running the code sees it
/// old or new, never a mix: a `call rel32` within one aligned 8-byte word,
/// or a `b`/`bl`/`nop`, is switched whole. Refused in flip-mode heaps
/// (`JITMAP_STATUS_NOT_PATCHABLE`) and past the block's end
/// (`JITMAP_STATUS_BAD_ARGUMENT`).
///
/// Not async-signal-safe.
///
/// # Safety
/// `bytes` is NULL (with `len` 0) or points to `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_heap_patch(
    heap: *mut jitmap_heap,
    code: jitmap_code,
    offset: u64,
    bytes: *const u8,
    len: usize,
) -> jitmap_status {
    call(|| {
        let h = self::heap(heap)?;
        // SAFETY: the caller's contract.
        let bytes = unsafe { slice(bytes, len, "bytes") }?;
        let end = offset.checked_add(len as u64).filter(|&e| e <= code.size);
        let Some(end) = end else {
            return Err(bad(format!(
                "{len} bytes at offset {offset} reach past the block's {} bytes",
                code.size
            )));
        };
        h.get().heap.patch(code.into(), |live| {
            live[offset as usize..end as usize].copy_from_slice(bytes);
        })?;
        Ok(())
    })
}

/// Makes `len` bytes at `offset` of a published block, written in place
/// through its write address (`jitmap_heap_write_address`), visible to
/// every thread that runs them: the instruction-cache maintenance and the
/// cross-core sync that `jitmap_heap_patch` does. A JIT that rewrites a
/// constant or a jump target in finished code calls this after its writes.
/// What a running thread sees while the bytes are written is the host's to
/// make safe. Refused in flip-mode heaps (`JITMAP_STATUS_NOT_PATCHABLE`)
/// and past the block's end (`JITMAP_STATUS_BAD_ARGUMENT`).
///
/// Not async-signal-safe.
#[unsafe(no_mangle)]
pub extern "C" fn jitmap_heap_make_visible(
    heap: *mut jitmap_heap,
    code: jitmap_code,
    offset: u64,
    len: usize,
) -> jitmap_status {
    call(|| {
        let h = self::heap(heap)?;
        let end = offset.saturating_add(len as u64);
        h.get().heap.make_visible(code.into(), offset..end)?;
        Ok(())
    })
}

/// Writes the address through which a published block's code can be
/// written in place: the writable alias in W^X mode, the code itself in
/// RWX mode. It stays valid while the block is live: until it is freed or
/// moved (a moved block has a new one; ask again). A reservation's write
/// pointer is not promised past its publish: use this. After writing
/// through it, call `jitmap_heap_make_visible`. Refused in flip-mode heaps
/// (`JITMAP_STATUS_NOT_PATCHABLE`), which keep no writable alias: a store
/// to published code there faults.
///
/// Not async-signal-safe.
///
/// # Safety
/// `out` is writable (NULL is refused with `JITMAP_STATUS_NULL_POINTER`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_heap_write_address(
    heap: *mut jitmap_heap,
    code: jitmap_code,
    out: *mut *mut u8,
) -> jitmap_status {
    call(|| {
        required(out)?;
        let h = self::heap(heap)?;
        let address = h.get().heap.write_address(code.into())?;
        // SAFETY: checked not NULL; writable by the caller's contract.
        unsafe { out.write(address as *mut u8) };
        Ok(())
    })
}

/// Writes the handle of the live block whose code starts at `start`: for a
/// JIT that keeps the addresses it runs, not handles, to free, patch or
/// move a block by its address. `JITMAP_STATUS_UNKNOWN_REF` when no live
/// block of this heap starts there (an address inside a block, a freed
/// block's start, another heap's code); `*out` is then unchanged.
///
/// Not async-signal-safe.
///
/// # Safety
/// `out` is writable (NULL is refused with `JITMAP_STATUS_NULL_POINTER`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_heap_code_at(
    heap: *mut jitmap_heap,
    start: usize,
    out: *mut jitmap_code,
) -> jitmap_status {
    call(|| {
        required(out)?;
        let h = self::heap(heap)?;
        let code = h.get().heap.code_at(start)?;
        // SAFETY: checked not NULL; writable by the caller's contract.
        unsafe { out.write(code.into()) };
        Ok(())
    })
}

/// Reclaims what freed blocks' grace periods allow now, and writes the
/// bytes given back (`bytes` may be NULL).
///
/// Not async-signal-safe.
///
/// # Safety
/// `bytes` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_heap_try_reclaim(
    heap: *mut jitmap_heap,
    bytes: *mut u64,
) -> jitmap_status {
    call(|| {
        let h = self::heap(heap)?;
        let given = h.get().heap.try_reclaim();
        if !bytes.is_null() {
            // SAFETY: not NULL; writable by the caller's contract.
            unsafe { bytes.write(given) };
        }
        Ok(())
    })
}
