//! Lookups: pin a guard, find addresses under it, unpin. Every call here is
//! async-signal-safe: a compare-and-swap on the handle table, the reader's
//! atomics and one fence, reads of the maps. No lock, no allocation, no
//! system call, no thread-local.

use jitmap::{CodeBlock, ManagerGuard};

use crate::handles::{self, Kind};
use crate::heap::kind_number;
use crate::jitmap_reader;
use crate::manager::ReaderObject;
use crate::status::jitmap_status;
use crate::types::{jitmap_block, jitmap_method_info};

/// Words of a `jitmap_guard`'s state: room for the Rust guard.
pub const JITMAP_GUARD_WORDS: usize = 8;
const PINNED: u64 = u64::from_le_bytes(*b"jmGUARD+");
const UNPINNED: u64 = u64::from_le_bytes(*b"jmGUARD-");

/// A pinned guard, in the caller's memory (on its stack, say): while it is
/// pinned, nothing a lookup under it can reach is reclaimed, so what
/// `jitmap_guard_find` answers stays valid. Pinned by `jitmap_pin`,
/// unpinned by `jitmap_unpin`, on the reader's thread.
///
/// Do not copy a pinned guard, or unpin a copy: jitmap marks a guard
/// unpinned in place, so a second unpin of the same guard is refused
/// (`JITMAP_STATUS_DESTROYED`), but it cannot tell a copy from the
/// original.
#[repr(C)]
pub struct jitmap_guard {
    /// Pinned or unpinned, for the checks.
    magic: u64,
    /// The reader's kept use.
    reader_slot: u64,
    /// The Rust guard.
    state: [u64; JITMAP_GUARD_WORDS],
}

const _: () = {
    assert!(size_of::<ManagerGuard<'static>>() <= JITMAP_GUARD_WORDS * 8);
    assert!(align_of::<ManagerGuard<'static>>() <= 8);
};

impl jitmap_guard {
    /// The Rust guard, if this one is pinned. (The calling thread is not
    /// checked here: the header says a guard stays on its reader's thread.)
    fn get(&self) -> Result<&ManagerGuard<'static>, jitmap_status> {
        match self.magic {
            PINNED => {
                // SAFETY: PINNED is written only by `jitmap_pin`, after it
                // wrote a guard into `state`, and cleared before it is read
                // out.
                Ok(unsafe { &*self.state.as_ptr().cast::<ManagerGuard<'static>>() })
            }
            UNPINNED => Err(jitmap_status::JITMAP_STATUS_DESTROYED),
            _ => Err(jitmap_status::JITMAP_STATUS_BAD_HANDLE),
        }
    }
}

/// Pins a guard of `reader` into `guard`, on the reader's thread. Nests:
/// a signal handler may pin while the interrupted code holds a guard.
/// Every pin is unpinned with `jitmap_unpin`; until then the reader cannot
/// be destroyed.
///
/// Async-signal-safe.
///
/// # Safety
/// `guard` is NULL or writable, and not a pinned guard (whose pin would
/// never be given back).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_pin(
    reader: *mut jitmap_reader,
    guard: *mut jitmap_guard,
) -> jitmap_status {
    if guard.is_null() {
        return jitmap_status::JITMAP_STATUS_NULL_POINTER;
    }
    let r = match handles::take::<ReaderObject>(crate::bits(reader), Kind::Reader) {
        Ok(r) => r,
        Err(status) => return status,
    };
    // SAFETY: the use, kept below until `jitmap_unpin` gives it back, keeps
    // the reader object alive for as long as the guard borrows it.
    let object: &'static ReaderObject = unsafe { &*std::ptr::from_ref(r.get()) };
    let pinned = match object.reader.get() {
        Ok(reader) => object.manager.pin(reader),
        Err(status) => return status,
    };
    let pinned = match pinned {
        Ok(p) => p,
        Err(e) => return e.into(),
    };
    let slot = r.leak() as u64;
    let mut state = [0u64; JITMAP_GUARD_WORDS];
    // SAFETY: `state` has room and alignment for a guard (asserted above).
    unsafe {
        state
            .as_mut_ptr()
            .cast::<ManagerGuard<'static>>()
            .write(pinned)
    };
    // SAFETY: checked not NULL; writable by the caller's contract.
    unsafe {
        guard.write(jitmap_guard {
            magic: PINNED,
            reader_slot: slot,
            state,
        })
    };
    jitmap_status::JITMAP_STATUS_OK
}

/// Unpins a guard; what its lookups answered may be reclaimed from now on.
///
/// Async-signal-safe.
///
/// # Safety
/// `guard` is NULL or points to a guard `jitmap_pin` wrote, on this
/// thread, and not a copy of one.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_unpin(guard: *mut jitmap_guard) -> jitmap_status {
    // SAFETY: the caller's contract.
    let Some(g) = (unsafe { guard.as_mut() }) else {
        return jitmap_status::JITMAP_STATUS_NULL_POINTER;
    };
    if let Err(status) = g.get() {
        return status;
    }
    g.magic = UNPINNED;
    // SAFETY: the guard was pinned (checked), so `state` holds one, read out
    // once: the magic no longer says pinned.
    drop(unsafe { g.state.as_ptr().cast::<ManagerGuard<'static>>().read() });
    // SAFETY: the use `jitmap_pin` kept, given back once (as above).
    unsafe { handles::release(g.reader_slot as usize) };
    jitmap_status::JITMAP_STATUS_OK
}

fn block(b: &CodeBlock<'_>) -> jitmap_block {
    let name = b.name().unwrap_or("");
    jitmap_block {
        method_id: b.method_id(),
        start: b.start(),
        offset: b.offset(),
        kind: kind_number(b.jit_kind()),
        name: name.as_ptr(),
        name_len: name.len(),
    }
}

fn info(b: &CodeBlock<'_>) -> jitmap_method_info {
    let region = b.region();
    let unwind = b.unwind_info();
    let row = b.debug_at();
    let gc = b.gc_info();
    jitmap_method_info {
        block: block(b),
        is_funclet: u32::from(b.is_funclet()),
        funclet_start: b.funclet_start(),
        hot_size: region.hot_size,
        cold_start: region.cold_start.unwrap_or(0),
        cold_size: region.cold_size,
        unwind: unwind.map_or(std::ptr::null(), <[u8]>::as_ptr),
        unwind_len: unwind.map_or(0, <[u8]>::len),
        unwind_base: b.unwind_base(),
        line: row.map_or(0, |r| r.line),
        column: row.map_or(0, |r| r.column),
        file: row.map_or(std::ptr::null(), |r| r.file.as_ptr()),
        file_len: row.map_or(0, |r| r.file.len()),
        gc_info: gc.map_or(std::ptr::null(), |g| g.bytes.as_ptr()),
        gc_info_len: gc.map_or(0, |g| g.bytes.len()),
        gc_version: gc.map_or(0, |g| g.version),
    }
}

/// Looks up with `find` under `guard` and writes `answer` of what it found
/// to `out`.
fn find_with<T>(
    guard: *const jitmap_guard,
    out: *mut T,
    find: impl for<'a> FnOnce(&'a ManagerGuard<'static>) -> Option<CodeBlock<'a>>,
    answer: impl FnOnce(&CodeBlock<'_>) -> T,
) -> jitmap_status {
    if out.is_null() {
        return jitmap_status::JITMAP_STATUS_NULL_POINTER;
    }
    // SAFETY: NULL or a guard, by the callers' contract.
    let Some(g) = (unsafe { guard.as_ref() }) else {
        return jitmap_status::JITMAP_STATUS_NULL_POINTER;
    };
    match g.get() {
        Ok(pinned) => match find(pinned) {
            Some(b) => {
                // SAFETY: checked not NULL; writable by the callers' contract.
                unsafe { out.write(answer(&b)) };
                jitmap_status::JITMAP_STATUS_OK
            }
            None => jitmap_status::JITMAP_STATUS_NOT_FOUND,
        },
        Err(status) => status,
    }
}

/// Finds the method holding `ip` and writes it, the offset and its name to
/// `out`; `JITMAP_STATUS_NOT_FOUND` if no method holds it (a stub, free
/// space, not a heap). Exact: a method's last byte is found, the byte past
/// it is not. In v2 heaps, at most two map reads. What else the host
/// published with the method: `jitmap_guard_find_info`.
///
/// Async-signal-safe.
///
/// # Safety
/// `guard` is NULL or a guard `jitmap_pin` wrote; `out` is NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_guard_find(
    guard: *const jitmap_guard,
    ip: usize,
    out: *mut jitmap_block,
) -> jitmap_status {
    find_with(guard, out, |g| g.find(ip), block)
}

/// As `jitmap_guard_find`, and everything the host published with the
/// method at `ip`: funclet, hot and cold parts, unwind bytes, the source
/// row, GC info. Costs more than `jitmap_guard_find` (the unwind entry and
/// the debug row are searched).
///
/// Async-signal-safe.
///
/// # Safety
/// As `jitmap_guard_find`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_guard_find_info(
    guard: *const jitmap_guard,
    ip: usize,
    out: *mut jitmap_method_info,
) -> jitmap_status {
    find_with(guard, out, |g| g.find(ip), info)
}

/// As `jitmap_guard_find`, for a return address taken from a stack: looks
/// up `return_address - 1`, the call instruction, so that a call that ends
/// its method names that method, not the next one.
///
/// Async-signal-safe.
///
/// # Safety
/// As `jitmap_guard_find`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_guard_find_return_address(
    guard: *const jitmap_guard,
    return_address: usize,
    out: *mut jitmap_block,
) -> jitmap_status {
    find_with(guard, out, |g| g.find_return_address(return_address), block)
}
