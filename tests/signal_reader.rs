//! The per-thread reader helper from a real SIGPROF handler: the handler finds
//! its thread's reader with no other help, looks up a method exactly, and
//! allocates nothing (a counting global allocator watches it).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use jitmap::epoch::with_current_reader;
mod signals;

use jitmap::{CodeInfo, EpochError, ExecutionManager, HeapConfig, JitKind, OwnedHeap};

/// Counts allocations made while a handler runs.
struct Counting;

thread_local! {
    /// Whether this thread is inside the handler. Per thread, so that other
    /// threads' allocations (the test harness's, the event dispatcher's) are
    /// not counted; const-initialized and without a destructor, so reading it
    /// from a signal handler or an allocator initializes nothing.
    static IN_HANDLER: Cell<bool> = const { Cell::new(false) };
}
static HANDLER_ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator; the counters are atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if IN_HANDLER.with(Cell::get) {
            // Relaxed: a counter read by the same thread.
            HANDLER_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's layout contract is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if IN_HANDLER.with(Cell::get) {
            // Relaxed: as in `alloc`.
            HANDLER_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

static MANAGER: OnceLock<ExecutionManager> = OnceLock::new();
static IP: AtomicUsize = AtomicUsize::new(0);
static FOUND: AtomicU64 = AtomicU64::new(0);
static UNBOUND: AtomicU64 = AtomicU64::new(0);
static WRONG: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_sigprof(_: libc::c_int) {
    IN_HANDLER.with(|h| h.set(true));
    let Some(manager) = MANAGER.get() else {
        IN_HANDLER.with(|h| h.set(false));
        return;
    };
    // Relaxed: set by the interrupted thread before it raised the signal.
    let ip = IP.load(Ordering::Relaxed);
    let id = with_current_reader(|reader| {
        let guard = manager.pin(reader).ok()?;
        let block = guard.find(ip)?;
        Some(block.method_id())
    });
    match id {
        // Relaxed: counters read by the same thread after the handler returns.
        None => UNBOUND.fetch_add(1, Ordering::Relaxed),
        Some(Some(42)) => FOUND.fetch_add(1, Ordering::Relaxed),
        Some(_) => WRONG.fetch_add(1, Ordering::Relaxed),
    };
    IN_HANDLER.with(|h| h.set(false));
}

fn heap(m: &ExecutionManager) -> OwnedHeap {
    m.create_heap(HeapConfig {
        span: 1 << 20,
        ..HeapConfig::default()
    })
    .unwrap()
}

#[test]
fn a_handler_finds_its_threads_reader_without_allocating() {
    let manager = MANAGER.get_or_init(|| ExecutionManager::new(4));
    let heap = heap(manager);
    let mut r = heap.reserve(64).unwrap();
    r.code_mut().fill(0xC3);
    let code = r
        .publish(CodeInfo::new(42, "sampled", JitKind::Optimized))
        .unwrap();
    // Relaxed: read by this thread's own signal handler.
    IP.store(code.start() + 10, Ordering::Relaxed);
    // SAFETY: installs a handler that only touches atomics, a const thread-local
    // and lock-free lookups.
    unsafe { signals::install_sigprof(on_sigprof) };
    let raise = || {
        // SAFETY: raising a signal whose handler is installed above.
        assert_eq!(unsafe { libc::raise(libc::SIGPROF) }, 0);
    };
    raise();
    // Relaxed: written by this thread's handler, which has returned.
    assert_eq!(UNBOUND.load(Ordering::Relaxed), 1, "not bound yet");

    let bound = manager.domain().bind_current_thread().unwrap();
    assert_eq!(
        manager.domain().bind_current_thread().err(),
        Some(EpochError::AlreadyBound)
    );
    for i in 0..5_000 {
        if i % 2 == 0 {
            // The handler nests under a pin of the same reader.
            let guard = manager.pin(bound.reader()).unwrap();
            raise();
            let b = guard.find(code.start()).unwrap();
            assert_eq!(b.method_id(), 42);
        } else {
            raise();
        }
    }
    drop(bound);
    raise();
    // Relaxed: as above.
    assert_eq!(FOUND.load(Ordering::Relaxed), 5_000);
    // Relaxed: as above.
    assert_eq!(WRONG.load(Ordering::Relaxed), 0);
    assert_eq!(
        // Relaxed: as above.
        UNBOUND.load(Ordering::Relaxed),
        2,
        "unbound again after drop"
    );
    // Relaxed: as above.
    assert_eq!(HANDLER_ALLOCATIONS.load(Ordering::Relaxed), 0);
    // Rebinding after the drop works, and the slot was given back.
    let again = manager.domain().bind_current_thread().unwrap();
    drop(again);
}
