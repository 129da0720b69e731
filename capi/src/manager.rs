//! Managers, their readers and executors, perf output and block listings.

use std::sync::Mutex;

use jitmap::heap::StubKind;
use jitmap::perf::{PerfConfig, PerfMode, PerfOutput};
use jitmap::{ExecutionManager, Executor, Reader, StubKindName};

use crate::handles::{self, Kept, Kind, Use};
use crate::status::{Failure, call, jitmap_status};
use crate::types::{jitmap_code, jitmap_live_block, jitmap_perf_mode};
use crate::{ThreadBound, bits, jitmap_executor, jitmap_manager, jitmap_reader, required, utf8};

/// `jitmap_live_block.kind` of a stub.
pub const JITMAP_LIVE_BLOCK_STUB: u32 = 256;

/// A manager handle's object.
pub(crate) struct ManagerObject {
    pub(crate) manager: ExecutionManager,
    /// The perf writers this manager's host turned on; they write until the
    /// manager is destroyed.
    perf: Mutex<Vec<PerfOutput>>,
}

/// A reader handle's object.
pub(crate) struct ReaderObject {
    /// The manager's handle, cloned so that a pin reaches it in one load
    /// rather than through the table (`_manager` only holds the use).
    pub(crate) manager: ExecutionManager,
    pub(crate) reader: ThreadBound<Reader>,
    _manager: Kept,
}

struct ExecutorObject {
    executor: ThreadBound<Executor>,
    _manager: Kept,
}

/// Takes a use of the manager `m` names.
pub(crate) fn manager(m: *mut jitmap_manager) -> Result<Use<ManagerObject>, jitmap_status> {
    handles::take(bits(m), Kind::Manager)
}

/// Creates a manager with `reader_slots` slots for readers, executors and
/// the agent's threads (each takes one), 1 to 4,096.
///
/// Not async-signal-safe. Owner: the caller, who destroys it with
/// `jitmap_manager_destroy` after every heap, reader, executor and agent of
/// it.
///
/// ```
/// use jitmap_capi::*;
/// let mut m = std::ptr::null_mut();
/// // SAFETY: the output points to a local.
/// let refused = unsafe { jitmap_manager_create(0, &mut m) };
/// assert_eq!(refused, jitmap_status::JITMAP_STATUS_BAD_ARGUMENT);
/// // SAFETY: as above.
/// assert_eq!(unsafe { jitmap_manager_create(16, &mut m) }, jitmap_status::JITMAP_STATUS_OK);
/// jitmap_manager_destroy(m);
/// ```
///
/// # Safety
/// `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_manager_create(
    reader_slots: u32,
    out: *mut *mut jitmap_manager,
) -> jitmap_status {
    call(|| {
        required(out)?;
        if !(1..=4096).contains(&reader_slots) {
            return Err(Failure::new(
                jitmap_status::JITMAP_STATUS_BAD_ARGUMENT,
                format!("reader_slots must be 1 to 4096, not {reader_slots}"),
            ));
        }
        let object = ManagerObject {
            manager: ExecutionManager::new(reader_slots as usize),
            perf: Mutex::new(Vec::new()),
        };
        let handle = handles::insert(Kind::Manager, Box::new(object))?;
        // SAFETY: checked not NULL; the caller's contract makes it writable.
        unsafe { out.write(handle as *mut jitmap_manager) };
        Ok(())
    })
}

/// Destroys a manager. Refused with `JITMAP_STATUS_IN_USE` while any of its
/// heaps, readers, executors or its agent is alive, or a call on it is in
/// progress.
///
/// Not async-signal-safe.
#[unsafe(no_mangle)]
pub extern "C" fn jitmap_manager_destroy(manager: *mut jitmap_manager) -> jitmap_status {
    call(|| {
        drop(handles::remove::<ManagerObject>(
            bits(manager),
            Kind::Manager,
        )?);
        Ok(())
    })
}

/// Turns on perf output for every heap of the manager: `jit-<pid>.dump`
/// (for `perf inject --jit`), `perf-<pid>.map`, or both, in `dir`. Written
/// by a background thread, off every lock, until the manager is destroyed.
/// One directory per process: asking for another gives
/// `JITMAP_STATUS_PERF_ALREADY_OPEN`.
///
/// Not async-signal-safe.
///
/// # Safety
/// `dir` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_manager_perf(
    manager: *mut jitmap_manager,
    mode: u32,
    dir: *const std::ffi::c_char,
) -> jitmap_status {
    call(|| {
        let m = self::manager(manager)?;
        // SAFETY: the caller's contract.
        let dir = unsafe { utf8(dir, "dir") }?;
        let mode = match mode {
            x if x == jitmap_perf_mode::JITMAP_PERF_JITDUMP as u32 => PerfMode::JitDump,
            x if x == jitmap_perf_mode::JITMAP_PERF_MAP as u32 => PerfMode::Map,
            x if x == jitmap_perf_mode::JITMAP_PERF_BOTH as u32 => PerfMode::Both,
            other => {
                return Err(Failure::new(
                    jitmap_status::JITMAP_STATUS_BAD_ARGUMENT,
                    format!("{other} is not a jitmap_perf_mode"),
                ));
            }
        };
        let output = PerfConfig {
            mode,
            dir: dir.into(),
        }
        .install(m.get().manager.listeners())?;
        m.get()
            .perf
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(output);
        Ok(())
    })
}

/// Names the manager's stub kind `kind` (1 to 15): what its stubs are
/// (`name`, "precode", "jump stub") and who makes them (`owner`, the
/// runtime or its component), so that `jitmap inspect --list` shows `stub
/// kind 2: precode (myjit)` and profiles `[stub 2: precode (myjit)]`
/// instead of a number. At most 44 bytes together, neither empty, no NUL (`JITMAP_STATUS_BAD_ARGUMENT`
/// otherwise). Naming a kind again with the same name does nothing; with
/// another name it fails with `JITMAP_STATUS_STUB_KIND_NAMED` and the first
/// name stays.
///
/// Not async-signal-safe.
///
/// ```
/// use jitmap_capi::*;
/// let mut m = std::ptr::null_mut();
/// // SAFETY: the output points to a local; the strings are NUL-terminated.
/// unsafe {
///     assert_eq!(jitmap_manager_create(4, &mut m), jitmap_status::JITMAP_STATUS_OK);
///     let named = jitmap_manager_name_stub_kind(m, 2, c"myjit".as_ptr(), c"precode".as_ptr());
///     assert_eq!(named, jitmap_status::JITMAP_STATUS_OK);
///     let again = jitmap_manager_name_stub_kind(m, 2, c"myjit".as_ptr(), c"thunk".as_ptr());
///     assert_eq!(again, jitmap_status::JITMAP_STATUS_STUB_KIND_NAMED);
///     let bad = jitmap_manager_name_stub_kind(m, 16, c"myjit".as_ptr(), c"thunk".as_ptr());
///     assert_eq!(bad, jitmap_status::JITMAP_STATUS_BAD_STUB_KIND);
/// }
/// jitmap_manager_destroy(m);
/// ```
///
/// # Safety
/// `owner` and `name` are NULL or NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_manager_name_stub_kind(
    manager: *mut jitmap_manager,
    kind: u8,
    owner: *const std::ffi::c_char,
    name: *const std::ffi::c_char,
) -> jitmap_status {
    call(|| {
        let m = self::manager(manager)?;
        let kind = StubKind::try_from(kind)?;
        // SAFETY: the caller's contract.
        let (owner, name) = unsafe { (utf8(owner, "owner")?, utf8(name, "name")?) };
        let name = StubKindName::new(owner, name)?;
        m.get().manager.name_stub_kind(kind, name)?;
        Ok(())
    })
}

/// Declares that the manager's stubs of `kind` (1 to 15) push no frame: a
/// thread stopped in one has its caller's return address on top of its
/// stack (x86-64) or in its link register (aarch64), as in a trampoline
/// that jumps on (`jmp [cell]`). Stack walkers (the agent, `jitmap
/// profile`) then step such a stub, caught as the innermost frame, by that
/// rule instead of the frame pointer, which would skip its caller.
///
/// Not async-signal-safe.
///
/// ```
/// use jitmap_capi::*;
/// let mut m = std::ptr::null_mut();
/// // SAFETY: the output points to a local.
/// unsafe { assert_eq!(jitmap_manager_create(4, &mut m), jitmap_status::JITMAP_STATUS_OK) };
/// let trampoline = 3;
/// assert_eq!(
///     jitmap_manager_declare_frameless_stub(m, trampoline),
///     jitmap_status::JITMAP_STATUS_OK
/// );
/// assert_eq!(
///     jitmap_manager_declare_frameless_stub(m, 16),
///     jitmap_status::JITMAP_STATUS_BAD_STUB_KIND
/// );
/// jitmap_manager_destroy(m);
/// ```
#[unsafe(no_mangle)]
pub extern "C" fn jitmap_manager_declare_frameless_stub(
    manager: *mut jitmap_manager,
    kind: u8,
) -> jitmap_status {
    call(|| {
        let m = self::manager(manager)?;
        m.get()
            .manager
            .declare_frameless_stub(StubKind::try_from(kind)?);
        Ok(())
    })
}

/// Lists the live blocks of every heap of the manager into `out` (room for
/// `capacity`), and writes how many there are to `count`. If they do not
/// fit, nothing is written to `out`, `count` says how many there are, and
/// the status is `JITMAP_STATUS_BUFFER_TOO_SMALL`. For tools that attach
/// late and need what was published before.
///
/// Not async-signal-safe.
///
/// # Safety
/// `out` is NULL (with `capacity` 0) or has room for `capacity` items.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_manager_live_blocks(
    manager: *mut jitmap_manager,
    out: *mut jitmap_live_block,
    capacity: usize,
    count: *mut usize,
) -> jitmap_status {
    call(|| {
        let m = self::manager(manager)?;
        required(count)?;
        if capacity > 0 {
            required(out)?;
        }
        let blocks = m.get().manager.live_blocks();
        // SAFETY: checked not NULL; writable by the caller's contract.
        unsafe { count.write(blocks.len()) };
        if blocks.len() > capacity {
            return Err(Failure::new(
                jitmap_status::JITMAP_STATUS_BUFFER_TOO_SMALL,
                format!("{} live blocks, room for {capacity}", blocks.len()),
            ));
        }
        for (i, b) in blocks.iter().enumerate() {
            let (method_id, kind) = match &b.info {
                Some(info) => (info.method_id, crate::heap::kind_number(info.kind)),
                None => (0, JITMAP_LIVE_BLOCK_STUB),
            };
            let item = jitmap_live_block {
                code: jitmap_code::from(b.code),
                method_id,
                kind,
            };
            // SAFETY: i < blocks.len() <= capacity, room the caller gave.
            unsafe { out.add(i).write(item) };
        }
        Ok(())
    })
}

/// Registers a reader for the calling thread: it pins guards for lookups,
/// on this thread and in its signal handlers. Takes one reader slot.
///
/// Not async-signal-safe: register outside the handler, before the first
/// signal. Owner: the caller, who destroys it on the same thread with
/// `jitmap_reader_destroy`.
///
/// # Safety
/// `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_reader_register(
    manager: *mut jitmap_manager,
    out: *mut *mut jitmap_reader,
) -> jitmap_status {
    call(|| {
        let m = self::manager(manager)?;
        required(out)?;
        let reader = m.get().manager.register_reader()?;
        let object = ReaderObject {
            manager: m.get().manager.clone(),
            reader: ThreadBound::new(reader),
            _manager: m.keep(),
        };
        let handle = handles::insert(Kind::Reader, Box::new(object))?;
        // SAFETY: checked not NULL.
        unsafe { out.write(handle as *mut jitmap_reader) };
        Ok(())
    })
}

/// Destroys a reader, on the thread that registered it. Refused with
/// `JITMAP_STATUS_IN_USE` while a guard of it is pinned.
///
/// Not async-signal-safe.
#[unsafe(no_mangle)]
pub extern "C" fn jitmap_reader_destroy(reader: *mut jitmap_reader) -> jitmap_status {
    call(|| {
        handles::take::<ReaderObject>(bits(reader), Kind::Reader)?
            .get()
            .reader
            .get()?;
        drop(handles::remove::<ReaderObject>(bits(reader), Kind::Reader)?);
        Ok(())
    })
}

/// Registers the calling thread as an executor: a thread that runs JIT code
/// from the manager's heaps. While it is online, freed code is reused only
/// after it has passed a quiescent point. Takes one reader slot.
///
/// Not async-signal-safe. Owner: the caller, who destroys it on the same
/// thread with `jitmap_executor_destroy`.
///
/// # Safety
/// `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_executor_register(
    manager: *mut jitmap_manager,
    out: *mut *mut jitmap_executor,
) -> jitmap_status {
    call(|| {
        let m = self::manager(manager)?;
        required(out)?;
        let executor = m.get().manager.register_executor()?;
        let object = ExecutorObject {
            executor: ThreadBound::new(executor),
            _manager: m.keep(),
        };
        let handle = handles::insert(Kind::Executor, Box::new(object))?;
        // SAFETY: checked not NULL.
        unsafe { out.write(handle as *mut jitmap_executor) };
        Ok(())
    })
}

/// Destroys an executor, on the thread that registered it.
///
/// Not async-signal-safe.
#[unsafe(no_mangle)]
pub extern "C" fn jitmap_executor_destroy(executor: *mut jitmap_executor) -> jitmap_status {
    call(|| {
        handles::take::<ExecutorObject>(bits(executor), Kind::Executor)?
            .get()
            .executor
            .get()?;
        drop(handles::remove::<ExecutorObject>(
            bits(executor),
            Kind::Executor,
        )?);
        Ok(())
    })
}

/// Runs `f` on the executor, on its own thread.
fn with_executor(executor: *mut jitmap_executor, f: impl FnOnce(&Executor)) -> jitmap_status {
    let result = handles::take::<ExecutorObject>(bits(executor), Kind::Executor)
        .and_then(|e| e.get().executor.get().map(f));
    match result {
        Ok(()) => jitmap_status::JITMAP_STATUS_OK,
        Err(status) => status,
    }
}

/// Declares a quiescent point: the calling thread holds no frame of JIT
/// code freed before this call (between two top-level calls into JIT code,
/// say). Cheap when nothing was freed since the last one.
///
/// Async-signal-safe.
#[unsafe(no_mangle)]
pub extern "C" fn jitmap_executor_quiescent(executor: *mut jitmap_executor) -> jitmap_status {
    with_executor(executor, Executor::quiescent)
}

/// Takes the thread offline (parked, blocked in a system call): frees stop
/// waiting for it until it comes back online.
///
/// Async-signal-safe.
#[unsafe(no_mangle)]
pub extern "C" fn jitmap_executor_offline(executor: *mut jitmap_executor) -> jitmap_status {
    with_executor(executor, Executor::offline)
}

/// Brings the thread back online, at a quiescent point.
///
/// Async-signal-safe.
#[unsafe(no_mangle)]
pub extern "C" fn jitmap_executor_online(executor: *mut jitmap_executor) -> jitmap_status {
    with_executor(executor, Executor::online)
}
