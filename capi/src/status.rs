//! Status codes, one per kind of failure across jitmap's layers, and the
//! thread's last error message.

use std::cell::RefCell;
use std::ffi::{CString, c_char};

use jitmap::agent::{AgentError, CounterError};
use jitmap::manager::ManagerError;
use jitmap::perf::PerfError;
use jitmap::{EpochError, HeapError};

/// What a call did. `JITMAP_STATUS_OK` is 0; every failure leaves the state
/// as it was before the call. For the calls that are not async-signal-safe,
/// `jitmap_last_error_message` then says more.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum jitmap_status {
    /// Done.
    JITMAP_STATUS_OK = 0,
    /// A lookup found no method at the address: not an error (free space,
    /// a stub, an address outside every heap).
    JITMAP_STATUS_NOT_FOUND,
    /// A required pointer (a handle, an input or an output) was NULL.
    JITMAP_STATUS_NULL_POINTER,
    /// A handle this library never handed out.
    JITMAP_STATUS_BAD_HANDLE,
    /// A handle of another kind (a heap where a manager was expected).
    JITMAP_STATUS_WRONG_HANDLE_KIND,
    /// A handle that was destroyed (used after destroy, or destroyed twice),
    /// or a reservation already published or aborted, or a guard already
    /// unpinned.
    JITMAP_STATUS_DESTROYED,
    /// The handle cannot be destroyed yet: a call on it is in progress, a
    /// guard is pinned on it, or a child handle (a heap of a manager, a
    /// reservation of a heap) is alive.
    JITMAP_STATUS_IN_USE,
    /// An argument out of its range: an enum value, a name that is not
    /// UTF-8, a length that does not match.
    JITMAP_STATUS_BAD_ARGUMENT,
    /// Every slot of the handle table (65,536) is taken.
    JITMAP_STATUS_TOO_MANY_HANDLES,
    /// A reader, executor or attached thread used from a thread other than
    /// the one that created it.
    JITMAP_STATUS_WRONG_THREAD,
    /// A caller's buffer too small for the answer; the count needed was
    /// written.
    JITMAP_STATUS_BUFFER_TOO_SMALL,
    /// A reservation of 0 bytes.
    JITMAP_STATUS_ZERO_SIZE,
    /// A reservation larger than the heap could ever hold.
    JITMAP_STATUS_TOO_LARGE,
    /// An alignment that is not a power of two from 8 to the page size.
    JITMAP_STATUS_BAD_ALIGNMENT,
    /// No free range fits the reservation, even after reclaiming.
    JITMAP_STATUS_HEAP_FULL,
    /// A heap span of 0, or of 4 GiB or more.
    JITMAP_STATUS_BAD_SPAN,
    /// The block was freed already.
    JITMAP_STATUS_DOUBLE_FREE,
    /// The block was moved; its new code handle is the one to use.
    JITMAP_STATUS_MOVED,
    /// The code handle belongs to another heap.
    JITMAP_STATUS_FOREIGN_REF,
    /// The code handle was never handed out by this heap.
    JITMAP_STATUS_UNKNOWN_REF,
    /// The block is a stub, and the call needs a method.
    JITMAP_STATUS_NOT_A_METHOD,
    /// A stub kind outside 1 to 15.
    JITMAP_STATUS_BAD_STUB_KIND,
    /// The heap asked for the GDB JIT interface, which this build lacks
    /// (the `gdb-jit` feature).
    JITMAP_STATUS_GDB_JIT_UNAVAILABLE,
    /// The method's `.eh_frame` cannot follow it (registered with the system
    /// unwinder, or not absolute): it cannot move.
    JITMAP_STATUS_POSITION_DEPENDENT,
    /// The heap keeps no writable alias of published code (flip mode).
    JITMAP_STATUS_NOT_PATCHABLE,
    /// The method's info does not fit its code (unwind entries or debug
    /// rows out of order or past the end, a bad cold offset, a bad
    /// `.eh_frame`).
    JITMAP_STATUS_BAD_CODE_INFO,
    /// Every reader slot of the manager is registered.
    JITMAP_STATUS_NO_READER_SLOTS,
    /// Pins nested more than 65,535 deep on one reader.
    JITMAP_STATUS_PINS_TOO_DEEP,
    /// An agent configuration field out of its range.
    JITMAP_STATUS_BAD_AGENT_CONFIG,
    /// An agent is running in this process already (its signal handler is
    /// process-wide).
    JITMAP_STATUS_AGENT_RUNNING,
    /// The calling thread is attached to the agent already.
    JITMAP_STATUS_ALREADY_ATTACHED,
    /// 1,024 threads are attached already, process-wide.
    JITMAP_STATUS_TOO_MANY_THREADS,
    /// A call-counter table misused: no such counter, a counter rearmed
    /// before it crossed, or a table of no methods or a 0 threshold.
    JITMAP_STATUS_BAD_COUNTER,
    /// This process writes its perf files in another directory already.
    JITMAP_STATUS_PERF_ALREADY_OPEN,
    /// The system refused: mapping memory, a timer, a file (the message
    /// names the call or path and the errno).
    JITMAP_STATUS_SYSTEM,
    /// A bug in jitmap, never a misuse: an internal invariant failed or a
    /// panic was caught. Please report it with the message.
    JITMAP_STATUS_INTERNAL,
    /// The stub kind has another name already
    /// (`jitmap_manager_name_stub_kind`); the first name stays. (After
    /// `JITMAP_STATUS_INTERNAL`, so that no earlier status changed value.)
    JITMAP_STATUS_STUB_KIND_NAMED,
}

impl jitmap_status {
    /// The status's name, as in the header.
    pub fn name(self) -> &'static str {
        NAMES[self as usize].trim_end_matches('\0')
    }
}

macro_rules! names {
    ($($s:ident),*) => {
        [$(concat!(stringify!($s), "\0")),*]
    };
}

/// Each status's name, NUL-terminated, in the enum's order, then one for a
/// value that is none.
const NAMES: [&str; 38] = names!(
    JITMAP_STATUS_OK,
    JITMAP_STATUS_NOT_FOUND,
    JITMAP_STATUS_NULL_POINTER,
    JITMAP_STATUS_BAD_HANDLE,
    JITMAP_STATUS_WRONG_HANDLE_KIND,
    JITMAP_STATUS_DESTROYED,
    JITMAP_STATUS_IN_USE,
    JITMAP_STATUS_BAD_ARGUMENT,
    JITMAP_STATUS_TOO_MANY_HANDLES,
    JITMAP_STATUS_WRONG_THREAD,
    JITMAP_STATUS_BUFFER_TOO_SMALL,
    JITMAP_STATUS_ZERO_SIZE,
    JITMAP_STATUS_TOO_LARGE,
    JITMAP_STATUS_BAD_ALIGNMENT,
    JITMAP_STATUS_HEAP_FULL,
    JITMAP_STATUS_BAD_SPAN,
    JITMAP_STATUS_DOUBLE_FREE,
    JITMAP_STATUS_MOVED,
    JITMAP_STATUS_FOREIGN_REF,
    JITMAP_STATUS_UNKNOWN_REF,
    JITMAP_STATUS_NOT_A_METHOD,
    JITMAP_STATUS_BAD_STUB_KIND,
    JITMAP_STATUS_GDB_JIT_UNAVAILABLE,
    JITMAP_STATUS_POSITION_DEPENDENT,
    JITMAP_STATUS_NOT_PATCHABLE,
    JITMAP_STATUS_BAD_CODE_INFO,
    JITMAP_STATUS_NO_READER_SLOTS,
    JITMAP_STATUS_PINS_TOO_DEEP,
    JITMAP_STATUS_BAD_AGENT_CONFIG,
    JITMAP_STATUS_AGENT_RUNNING,
    JITMAP_STATUS_ALREADY_ATTACHED,
    JITMAP_STATUS_TOO_MANY_THREADS,
    JITMAP_STATUS_BAD_COUNTER,
    JITMAP_STATUS_PERF_ALREADY_OPEN,
    JITMAP_STATUS_SYSTEM,
    JITMAP_STATUS_INTERNAL,
    JITMAP_STATUS_STUB_KIND_NAMED,
    JITMAP_STATUS_UNKNOWN
);

impl From<HeapError> for jitmap_status {
    fn from(e: HeapError) -> Self {
        use jitmap_status::*;
        match e {
            HeapError::ZeroSize => JITMAP_STATUS_ZERO_SIZE,
            HeapError::TooLarge { .. } => JITMAP_STATUS_TOO_LARGE,
            HeapError::BadAlignment { .. } => JITMAP_STATUS_BAD_ALIGNMENT,
            HeapError::HeapFull { .. } => JITMAP_STATUS_HEAP_FULL,
            HeapError::BadSpan { .. } => JITMAP_STATUS_BAD_SPAN,
            HeapError::BadUnwindRoom { .. } => JITMAP_STATUS_BAD_ARGUMENT,
            HeapError::DoubleFree { .. } => JITMAP_STATUS_DOUBLE_FREE,
            HeapError::Moved { .. } => JITMAP_STATUS_MOVED,
            HeapError::ForeignRef => JITMAP_STATUS_FOREIGN_REF,
            HeapError::GdbJitUnavailable => JITMAP_STATUS_GDB_JIT_UNAVAILABLE,
            HeapError::UnknownRef { .. } => JITMAP_STATUS_UNKNOWN_REF,
            HeapError::NotAMethod { .. } => JITMAP_STATUS_NOT_A_METHOD,
            HeapError::BadStubKind { .. } => JITMAP_STATUS_BAD_STUB_KIND,
            HeapError::Info(_) => JITMAP_STATUS_BAD_CODE_INFO,
            HeapError::Epoch(e) => e.into(),
            HeapError::Memory { .. } => JITMAP_STATUS_SYSTEM,
            HeapError::PositionDependent { .. } => JITMAP_STATUS_POSITION_DEPENDENT,
            HeapError::NotPatchable { .. } => JITMAP_STATUS_NOT_PATCHABLE,
            HeapError::OutsideBlock { .. } => JITMAP_STATUS_BAD_ARGUMENT,
            HeapError::BeyondReservation { .. } => JITMAP_STATUS_BAD_ARGUMENT,
            // A map refusal or a foreign guard is an invariant of the heap
            // the C API cannot break.
            _ => JITMAP_STATUS_INTERNAL,
        }
    }
}

impl From<EpochError> for jitmap_status {
    fn from(e: EpochError) -> Self {
        match e {
            EpochError::NoSlots { .. } => jitmap_status::JITMAP_STATUS_NO_READER_SLOTS,
            EpochError::TooDeep => jitmap_status::JITMAP_STATUS_PINS_TOO_DEEP,
            // Binding and foreign readers are not reachable through the C
            // API: each reader is pinned in its own manager.
            _ => jitmap_status::JITMAP_STATUS_INTERNAL,
        }
    }
}

impl From<ManagerError> for jitmap_status {
    fn from(e: ManagerError) -> Self {
        match e {
            ManagerError::Heap(e) => e.into(),
            ManagerError::Epoch(e) => e.into(),
            ManagerError::BadStubName { .. } => jitmap_status::JITMAP_STATUS_BAD_ARGUMENT,
            ManagerError::StubKindNamed { .. } => jitmap_status::JITMAP_STATUS_STUB_KIND_NAMED,
            // Ranges are the manager's own to place; images are not part of
            // the C API.
            _ => jitmap_status::JITMAP_STATUS_INTERNAL,
        }
    }
}

impl From<CounterError> for jitmap_status {
    fn from(_: CounterError) -> Self {
        jitmap_status::JITMAP_STATUS_BAD_COUNTER
    }
}

impl From<AgentError> for jitmap_status {
    fn from(e: AgentError) -> Self {
        use jitmap_status::*;
        match e {
            AgentError::ZeroFrequency
            | AgentError::FrequencyTooHigh { .. }
            | AgentError::ZeroDepth
            | AgentError::DepthTooLarge { .. }
            | AgentError::ZeroCapacity
            | AgentError::CapacityTooLarge { .. }
            | AgentError::BadSignal { .. }
            | AgentError::ZeroInterval => JITMAP_STATUS_BAD_AGENT_CONFIG,
            AgentError::AlreadyRunning => JITMAP_STATUS_AGENT_RUNNING,
            AgentError::TooManyThreads => JITMAP_STATUS_TOO_MANY_THREADS,
            AgentError::AlreadyAttached { .. } => JITMAP_STATUS_ALREADY_ATTACHED,
            AgentError::Counters(e) => e.into(),
            AgentError::Epoch(e) => e.into(),
            AgentError::Os { .. } => JITMAP_STATUS_SYSTEM,
            // Stopped, windows and the endpoint are not reachable through
            // the C API: a stopped agent's handle is destroyed.
            _ => JITMAP_STATUS_INTERNAL,
        }
    }
}

impl From<PerfError> for jitmap_status {
    fn from(e: PerfError) -> Self {
        match e {
            PerfError::AlreadyOpen { .. } => jitmap_status::JITMAP_STATUS_PERF_ALREADY_OPEN,
            PerfError::Io { .. } => jitmap_status::JITMAP_STATUS_SYSTEM,
            // The mode comes from the C enum, checked before.
            _ => jitmap_status::JITMAP_STATUS_INTERNAL,
        }
    }
}

/// A failure: its status and what to say about it.
pub struct Failure {
    pub status: jitmap_status,
    pub message: String,
}

impl Failure {
    pub fn new(status: jitmap_status, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }
}

impl From<jitmap_status> for Failure {
    fn from(status: jitmap_status) -> Self {
        let what = match status {
            jitmap_status::JITMAP_STATUS_NULL_POINTER => "a required pointer was NULL",
            jitmap_status::JITMAP_STATUS_BAD_HANDLE => "not a handle jitmap handed out",
            jitmap_status::JITMAP_STATUS_WRONG_HANDLE_KIND => "a handle of another kind",
            jitmap_status::JITMAP_STATUS_DESTROYED => "the handle was destroyed",
            jitmap_status::JITMAP_STATUS_IN_USE => {
                "the handle is in use: a call in progress, a pinned guard or a live child handle"
            }
            jitmap_status::JITMAP_STATUS_TOO_MANY_HANDLES => "the handle table is full",
            jitmap_status::JITMAP_STATUS_WRONG_THREAD => "the handle belongs to another thread",
            other => other.name(),
        };
        Self::new(status, what)
    }
}

macro_rules! failure_from {
    ($($error:ty),*) => {$(
        impl From<$error> for Failure {
            fn from(e: $error) -> Self {
                let message = e.to_string();
                Self::new(e.into(), message)
            }
        }
    )*};
}
failure_from!(
    HeapError,
    EpochError,
    ManagerError,
    CounterError,
    AgentError,
    PerfError
);

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Self {
        Self::new(jitmap_status::JITMAP_STATUS_SYSTEM, e.to_string())
    }
}

thread_local! {
    /// The message of the thread's last failed call. Touched only by calls
    /// that are not async-signal-safe.
    static LAST: RefCell<Option<CString>> = const { RefCell::new(None) };
}

/// Runs a call that is not async-signal-safe: records its failure's message
/// for `jitmap_last_error_message`, and turns a panic into
/// `JITMAP_STATUS_INTERNAL` instead of unwinding into C.
pub fn call(body: impl FnOnce() -> Result<(), Failure>) -> jitmap_status {
    let outcome =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).unwrap_or_else(|panic| {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(Failure::new(
                jitmap_status::JITMAP_STATUS_INTERNAL,
                format!("jitmap panicked (a bug; please report it): {what}"),
            ))
        });
    match outcome {
        Ok(()) => jitmap_status::JITMAP_STATUS_OK,
        Err(f) => {
            let message = CString::new(f.message.replace('\0', " ")).unwrap_or_default();
            // A thread being torn down has no message slot; the status stands.
            let _ = LAST.try_with(|last| *last.borrow_mut() = Some(message));
            f.status
        }
    }
}

/// The message of the calling thread's last failed call, or NULL if none
/// failed. Valid until the thread's next failed call. Never set by the
/// async-signal-safe calls, which return their status alone.
///
/// Not async-signal-safe.
#[unsafe(no_mangle)]
pub extern "C" fn jitmap_last_error_message() -> *const c_char {
    LAST.try_with(|last| {
        last.borrow()
            .as_ref()
            .map_or(std::ptr::null(), |m| m.as_ptr())
    })
    .unwrap_or(std::ptr::null())
}

/// The name of a status, such as `"JITMAP_STATUS_HEAP_FULL"`; a static
/// string. `"JITMAP_STATUS_UNKNOWN"` for a value that is not a status.
///
/// Async-signal-safe.
#[unsafe(no_mangle)]
pub extern "C" fn jitmap_status_name(status: u32) -> *const c_char {
    let i = (status as usize).min(NAMES.len() - 1);
    NAMES[i].as_ptr().cast()
}

#[cfg(test)]
mod tests {
    use super::{NAMES, jitmap_status};

    #[test]
    fn each_status_is_named_as_in_the_enum() {
        for i in 0..NAMES.len() as u32 - 1 {
            // SAFETY: the enum is repr(C) with values 0 up to the last
            // status, one per name but the last.
            let status: jitmap_status = unsafe { std::mem::transmute(i) };
            assert_eq!(status.name(), format!("{status:?}"));
        }
        assert_eq!(
            jitmap_status::JITMAP_STATUS_STUB_KIND_NAMED as usize,
            NAMES.len() - 2
        );
    }
}
