//! The C ABI driven from Rust through its `extern "C"` functions, as a C host
//! calls them: sequences of calls on managers, heaps, reservations, readers,
//! guards and executors, with handle values that are real, destroyed, of
//! another kind or forged, `jitmap_code` structs that are real, stale or
//! made up, and arbitrary configuration and code-info fields (every pointer
//! NULL or valid, as the header requires).
//!
//! Every call returns a status, never `JITMAP_STATUS_INTERNAL` (a caught
//! panic); a refused call leaves every manager's live blocks as they were;
//! every lookup that answers names a live block that contains the address.
#![no_main]

use std::ffi::{CString, c_char};
use std::ptr::{null, null_mut};

use arbitrary::Arbitrary;
use jitmap_capi::*;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Handle {
    /// The `n`th handle this input was given, whatever became of it.
    Given(u8),
    Forged(u64),
    Null,
}

#[derive(Arbitrary, Debug)]
enum Code {
    /// The `n`th block this input published, whatever became of it.
    Given(u8),
    /// A given block with one field altered.
    Altered { n: u8, field: u8, delta: u64 },
    Forged {
        start: u64,
        size: u64,
        heap_id: u64,
        generation: u64,
    },
}

#[derive(Arbitrary, Debug)]
struct Info {
    method_id: u64,
    name: Option<String>,
    kind: u8,
    cold_offset: u32,
    unwind: Vec<(u32, u32, Vec<u8>)>,
    debug: Vec<(u32, u32, u32, Option<String>)>,
    gc_info: Vec<u8>,
    gc_version: u32,
    eh_frame: Vec<u8>,
}

#[derive(Arbitrary, Debug)]
enum Op {
    ManagerCreate(u16),
    ManagerDestroy(Handle),
    HeapCreate {
        manager: Handle,
        span: u8,
        map_version: u8,
        mode: u8,
        align: u8,
        huge_pages: u8,
        register_unwind: u8,
        unwind_room: u16,
    },
    HeapDestroy(Handle),
    Reserve {
        heap: Handle,
        size: u16,
        align: u8,
    },
    Publish {
        reservation: Handle,
        info: Info,
    },
    PublishStub {
        reservation: Handle,
        kind: u8,
    },
    Abort(Handle),
    HeapPublish {
        heap: Handle,
        bytes: Vec<u8>,
        align: u8,
        info: Info,
    },
    Free {
        heap: Handle,
        code: Code,
    },
    Move {
        heap: Handle,
        code: Code,
    },
    Patch {
        heap: Handle,
        code: Code,
        offset: u16,
        bytes: Vec<u8>,
    },
    ReaderRegister(Handle),
    ReaderDestroy(Handle),
    Pin(Handle),
    Unpin(u8),
    Find {
        guard: u8,
        code: Code,
        offset: u16,
    },
    ExecutorRegister(Handle),
    ExecutorDestroy(Handle),
    Quiescent(Handle),
}

/// What a handle was given as, for the clean-up.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Manager,
    Heap,
    Reservation,
    Reader,
    Executor,
}

#[derive(Default)]
struct State {
    handles: Vec<(usize, Kind)>,
    codes: Vec<jitmap_code>,
    /// Boxed: a pinned guard must not move (the header forbids copies).
    #[allow(clippy::vec_box)]
    guards: Vec<Box<jitmap_guard>>,
}

impl State {
    fn handle<T>(&self, h: &Handle) -> *mut T {
        match *h {
            Handle::Given(n) if !self.handles.is_empty() => {
                self.handles[usize::from(n) % self.handles.len()].0 as *mut T
            }
            Handle::Given(n) => usize::from(n) as *mut T,
            Handle::Forged(bits) => bits as usize as *mut T,
            Handle::Null => null_mut(),
        }
    }

    fn code(&self, c: &Code) -> jitmap_code {
        let given = |n: u8| {
            self.codes
                .get(usize::from(n) % self.codes.len().max(1))
                .copied()
        };
        match *c {
            Code::Given(n) => given(n).unwrap_or(FORGED),
            Code::Altered { n, field, delta } => {
                let mut code = given(n).unwrap_or(FORGED);
                match field % 4 {
                    0 => code.start = code.start.wrapping_add(delta as usize),
                    1 => code.size = code.size.wrapping_add(delta),
                    2 => code.heap_id = code.heap_id.wrapping_add(delta),
                    _ => code.generation = code.generation.wrapping_add(delta),
                }
                code
            }
            Code::Forged {
                start,
                size,
                heap_id,
                generation,
            } => jitmap_code {
                start: start as usize,
                size,
                heap_id,
                generation,
            },
        }
    }

    /// Every live manager's live blocks, in order.
    fn snapshot(&self) -> Vec<Vec<(usize, u64, u64, u32)>> {
        self.handles
            .iter()
            .filter(|(_, kind)| *kind == Kind::Manager)
            .map(|&(h, _)| live_blocks(h as *mut jitmap_manager))
            .collect()
    }
}

const FORGED: jitmap_code = jitmap_code {
    start: 0x1000,
    size: 16,
    heap_id: 1,
    generation: 1,
};

fn live_blocks(manager: *mut jitmap_manager) -> Vec<(usize, u64, u64, u32)> {
    let mut count = 0usize;
    // SAFETY: a NULL buffer of capacity 0 asks for the count; `count` is
    // writable.
    let status = unsafe { jitmap_manager_live_blocks(manager, null_mut(), 0, &mut count) };
    if !matches!(
        status,
        jitmap_status::JITMAP_STATUS_OK | jitmap_status::JITMAP_STATUS_BUFFER_TOO_SMALL
    ) {
        return Vec::new();
    }
    let mut blocks = Vec::with_capacity(count);
    // SAFETY: `blocks` has room for `count` entries.
    let status =
        unsafe { jitmap_manager_live_blocks(manager, blocks.as_mut_ptr(), count, &mut count) };
    assert_eq!(status, jitmap_status::JITMAP_STATUS_OK);
    // SAFETY: the call wrote `count` entries.
    unsafe { blocks.set_len(count) };
    blocks
        .iter()
        .map(|b: &jitmap_live_block| (b.code.start, b.code.size, b.method_id, b.kind))
        .collect()
}

/// The C strings and arrays an info points into, kept alive beside it.
struct Built {
    info: jitmap_code_info,
    _name: Option<CString>,
    _unwind: Vec<jitmap_unwind_entry>,
    _debug: Vec<jitmap_debug_row>,
    _files: Vec<CString>,
}

fn build(info: &Info) -> Built {
    let cstring = |s: &str| CString::new(s.replace('\0', "")).expect("no NUL left");
    let name = info.name.as_deref().map(cstring);
    let unwind: Vec<jitmap_unwind_entry> = info
        .unwind
        .iter()
        .take(4)
        .map(|(begin, end, data)| jitmap_unwind_entry {
            begin: *begin,
            end: *end,
            data: if data.is_empty() {
                null()
            } else {
                data.as_ptr()
            },
            len: data.len(),
        })
        .collect();
    let files: Vec<CString> = info
        .debug
        .iter()
        .take(8)
        .map(|(.., f)| cstring(f.as_deref().unwrap_or("")))
        .collect();
    let debug: Vec<jitmap_debug_row> = info
        .debug
        .iter()
        .take(8)
        .zip(&files)
        .map(|(&(offset, line, column, ref file), f)| jitmap_debug_row {
            offset,
            line,
            column,
            file: if file.is_some() { f.as_ptr() } else { null() },
        })
        .collect();
    let array = |len: usize, ptr: *const u8| if len == 0 { null() } else { ptr };
    Built {
        info: jitmap_code_info {
            method_id: info.method_id,
            name: name
                .as_ref()
                .map_or(null(), |n| n.as_ptr() as *const c_char),
            kind: u32::from(info.kind % 6),
            cold_offset: info.cold_offset % 512,
            unwind: if unwind.is_empty() {
                null()
            } else {
                unwind.as_ptr()
            },
            unwind_count: unwind.len(),
            debug: if debug.is_empty() {
                null()
            } else {
                debug.as_ptr()
            },
            debug_count: debug.len(),
            gc_info: array(info.gc_info.len(), info.gc_info.as_ptr()),
            gc_info_len: info.gc_info.len(),
            gc_version: info.gc_version,
            eh_frame: array(info.eh_frame.len(), info.eh_frame.as_ptr()),
            eh_frame_len: info.eh_frame.len(),
            eh_frame_hdr: null(),
            eh_frame_hdr_len: 0,
        },
        _name: name,
        _unwind: unwind,
        _debug: debug,
        _files: files,
    }
}

/// Runs one op; returns its status.
fn run(state: &mut State, op: &Op) -> jitmap_status {
    // SAFETY (every call below): each pointer argument is NULL or points to
    // memory of the right type that lives for the call; handles and code
    // structs may be anything, which is what the ABI promises to refuse.
    unsafe {
        match op {
            Op::ManagerCreate(slots) => {
                let mut out = null_mut();
                let status = jitmap_manager_create(u32::from(*slots % 40), &mut out);
                if status == jitmap_status::JITMAP_STATUS_OK {
                    state.handles.push((out as usize, Kind::Manager));
                }
                status
            }
            Op::ManagerDestroy(h) => jitmap_manager_destroy(state.handle(h)),
            Op::HeapCreate {
                manager,
                span,
                map_version,
                mode,
                align,
                huge_pages,
                register_unwind,
                unwind_room,
            } => {
                let mut config = std::mem::zeroed::<jitmap_heap_config>();
                jitmap_heap_config_default(&mut config);
                config.span = [0, 1, 4096, 1 << 16, 1 << 20, 3 << 19, 1 << 40, u64::MAX]
                    [usize::from(*span % 8)];
                config.map_version = u32::from(*map_version % 4);
                config.mode = u32::from(*mode % 3);
                config.align =
                    1u64.checked_shl(u32::from(*align % 14)).unwrap_or(0) + u64::from(*align / 128);
                config.huge_pages = *huge_pages % 3;
                config.register_unwind = *register_unwind % 3;
                config.gdb_jit = 0;
                config.unwind_room = u32::from(*unwind_room);
                let mut out = null_mut();
                let status = jitmap_heap_create(state.handle(manager), &config, &mut out);
                if status == jitmap_status::JITMAP_STATUS_OK {
                    state.handles.push((out as usize, Kind::Heap));
                }
                status
            }
            Op::HeapDestroy(h) => jitmap_heap_destroy(state.handle(h)),
            Op::Reserve { heap, size, align } => {
                let (mut out, mut write) = (null_mut(), null_mut());
                let status = jitmap_heap_reserve(
                    state.handle(heap),
                    u64::from(*size % 2048),
                    u64::from(*align % 130),
                    &mut out,
                    &mut write,
                );
                if status == jitmap_status::JITMAP_STATUS_OK {
                    state.handles.push((out as usize, Kind::Reservation));
                    let (mut at, mut len) = (0usize, 0u64);
                    let mut bytes = null_mut();
                    assert_eq!(
                        jitmap_reservation_code(out, &mut bytes, &mut at, &mut len),
                        jitmap_status::JITMAP_STATUS_OK
                    );
                    assert_eq!((bytes, len), (write, u64::from(*size % 2048)));
                    // A `ret` at every byte, as a host writes code.
                    std::ptr::write_bytes(bytes, 0xC3, len as usize);
                }
                status
            }
            Op::Publish { reservation, info } => {
                let built = build(info);
                let mut out = FORGED;
                let status =
                    jitmap_reservation_publish(state.handle(reservation), &built.info, &mut out);
                if status == jitmap_status::JITMAP_STATUS_OK {
                    state.codes.push(out);
                }
                status
            }
            Op::PublishStub { reservation, kind } => {
                let mut out = FORGED;
                let status =
                    jitmap_reservation_publish_stub(state.handle(reservation), *kind, &mut out);
                if status == jitmap_status::JITMAP_STATUS_OK {
                    state.codes.push(out);
                }
                status
            }
            Op::Abort(h) => jitmap_reservation_abort(state.handle(h)),
            Op::HeapPublish {
                heap,
                bytes,
                align,
                info,
            } => {
                let built = build(info);
                let mut out = FORGED;
                let status = jitmap_heap_publish(
                    state.handle(heap),
                    if bytes.is_empty() {
                        null()
                    } else {
                        bytes.as_ptr()
                    },
                    bytes.len() as u64,
                    u64::from(*align % 130),
                    &built.info,
                    &mut out,
                );
                if status == jitmap_status::JITMAP_STATUS_OK {
                    state.codes.push(out);
                }
                status
            }
            Op::Free { heap, code } => jitmap_heap_free(state.handle(heap), state.code(code)),
            Op::Move { heap, code } => {
                let mut out = FORGED;
                let status = jitmap_heap_move(state.handle(heap), state.code(code), &mut out);
                if status == jitmap_status::JITMAP_STATUS_OK {
                    state.codes.push(out);
                }
                status
            }
            Op::Patch {
                heap,
                code,
                offset,
                bytes,
            } => jitmap_heap_patch(
                state.handle(heap),
                state.code(code),
                u64::from(*offset),
                if bytes.is_empty() {
                    null()
                } else {
                    bytes.as_ptr()
                },
                bytes.len(),
            ),
            Op::ReaderRegister(m) => {
                let mut out = null_mut();
                let status = jitmap_reader_register(state.handle(m), &mut out);
                if status == jitmap_status::JITMAP_STATUS_OK {
                    state.handles.push((out as usize, Kind::Reader));
                }
                status
            }
            Op::ReaderDestroy(h) => jitmap_reader_destroy(state.handle(h)),
            Op::Pin(reader) => {
                let mut guard = Box::new(std::mem::zeroed::<jitmap_guard>());
                let status = jitmap_pin(state.handle(reader), &mut *guard);
                if status == jitmap_status::JITMAP_STATUS_OK {
                    state.guards.push(guard);
                }
                status
            }
            Op::Unpin(n) => match state.guards.len() {
                0 => jitmap_unpin(null_mut()),
                len => jitmap_unpin(&mut *state.guards[usize::from(*n) % len]),
            },
            Op::Find {
                guard,
                code,
                offset,
            } => {
                let ip = state.code(code).start.wrapping_add(usize::from(*offset));
                let mut out = std::mem::zeroed::<jitmap_block>();
                let guard: *const jitmap_guard = match state.guards.len() {
                    0 => null(),
                    len => &*state.guards[usize::from(*guard) % len],
                };
                let status = jitmap_guard_find(guard, ip, &mut out);
                if status == jitmap_status::JITMAP_STATUS_OK {
                    assert!(
                        out.start <= ip && out.offset == (ip - out.start) as u64,
                        "{out:?} for {ip:#x}"
                    );
                    let live =
                        state
                            .snapshot()
                            .into_iter()
                            .flatten()
                            .any(|(start, size, id, kind)| {
                                start == out.start
                                    && (ip - start) < size as usize
                                    && id == out.method_id
                                    && kind == out.kind
                            });
                    assert!(live, "{out:?} for {ip:#x} is no live block");
                }
                status
            }
            Op::ExecutorRegister(m) => {
                let mut out = null_mut();
                let status = jitmap_executor_register(state.handle(m), &mut out);
                if status == jitmap_status::JITMAP_STATUS_OK {
                    state.handles.push((out as usize, Kind::Executor));
                }
                status
            }
            Op::ExecutorDestroy(h) => jitmap_executor_destroy(state.handle(h)),
            Op::Quiescent(h) => jitmap_executor_quiescent(state.handle(h)),
        }
    }
}

/// Unpins every guard and destroys every handle, newest first (children
/// before their parents), so that no input leaves anything behind.
fn clean_up(state: &mut State) {
    for guard in &mut state.guards {
        // SAFETY: a guard this input pinned; a second unpin is refused.
        unsafe { jitmap_unpin(&mut **guard) };
    }
    for &(h, kind) in state.handles.iter().rev() {
        let _ = match kind {
            Kind::Reservation => jitmap_reservation_abort(h as *mut _),
            Kind::Reader => jitmap_reader_destroy(h as *mut _),
            Kind::Executor => jitmap_executor_destroy(h as *mut _),
            Kind::Heap => jitmap_heap_destroy(h as *mut _),
            Kind::Manager => jitmap_manager_destroy(h as *mut _),
        };
    }
    for &(h, kind) in &state.handles {
        if kind == Kind::Manager {
            // Destroyed: refused as such, never taken for another object.
            assert_eq!(
                jitmap_manager_destroy(h as *mut _),
                jitmap_status::JITMAP_STATUS_DESTROYED
            );
        }
    }
}

/// A manager with a default heap, a reader pinned in guard 0 and an
/// executor: handles 0 to 3, so that inputs reach published code quickly.
fn prelude(state: &mut State) {
    let mut manager = null_mut();
    let mut heap = null_mut();
    let mut reader = null_mut();
    let mut executor = null_mut();
    // SAFETY: every out pointer is writable; the config is the default.
    unsafe {
        assert_eq!(
            jitmap_manager_create(4, &mut manager),
            jitmap_status::JITMAP_STATUS_OK
        );
        let mut config = std::mem::zeroed::<jitmap_heap_config>();
        jitmap_heap_config_default(&mut config);
        config.span = 1 << 20;
        assert_eq!(
            jitmap_heap_create(manager, &config, &mut heap),
            jitmap_status::JITMAP_STATUS_OK
        );
        assert_eq!(
            jitmap_reader_register(manager, &mut reader),
            jitmap_status::JITMAP_STATUS_OK
        );
        assert_eq!(
            jitmap_executor_register(manager, &mut executor),
            jitmap_status::JITMAP_STATUS_OK
        );
    }
    state.handles.extend([
        (manager as usize, Kind::Manager),
        (heap as usize, Kind::Heap),
        (reader as usize, Kind::Reader),
        (executor as usize, Kind::Executor),
    ]);
    assert_eq!(
        run(state, &Op::Pin(Handle::Given(2))),
        jitmap_status::JITMAP_STATUS_OK
    );
}

fuzz_target!(|ops: Vec<Op>| {
    let mut state = State::default();
    prelude(&mut state);
    for op in ops.iter().take(64) {
        let before = state.snapshot();
        let status = run(&mut state, op);
        assert_ne!(status, jitmap_status::JITMAP_STATUS_INTERNAL, "{op:?}");
        if status != jitmap_status::JITMAP_STATUS_OK {
            assert_eq!(
                state.snapshot(),
                before,
                "refused with {status:?} but changed: {op:?}"
            );
        }
    }
    clean_up(&mut state);
});
