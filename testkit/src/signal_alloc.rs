//! A counting allocator for the signal-safety tests: it counts each thread's
//! heap calls, and the calls made while SIGPROF is blocked in the calling
//! thread, which in those tests means inside a SIGPROF handler (the kernel
//! blocks a signal while its handler runs, and nothing else there blocks
//! SIGPROF while allocating: the agent's calls that block it on an attached
//! thread, `take_kept` and `profile_window`, are not made while checking). A test installs it with
//! `#[global_allocator] static GLOBAL: SignalCounting = SignalCounting;`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The allocator: the system's, with the counting.
pub struct SignalCounting;

/// Whether heap calls check the signal mask.
static CHECK_MASK: AtomicBool = AtomicBool::new(false);
/// Heap calls made with SIGPROF blocked.
static WHILE_BLOCKED: AtomicU64 = AtomicU64::new(0);

std::thread_local! {
    /// This thread's heap calls. `const`, no destructor: never lazily set up.
    static CALLS: Cell<u64> = const { Cell::new(0) };
}

/// Turns the signal-mask check on or off (set it before the threads that
/// are checked start, and off after they are joined).
pub fn check_mask(on: bool) {
    // Relaxed: a switch set before the checked threads start and read by them.
    CHECK_MASK.store(on, Ordering::Relaxed);
}

/// Heap calls made with SIGPROF blocked since the last call; resets the count.
pub fn take_while_blocked() -> u64 {
    // Relaxed: read after the checked threads are joined.
    WHILE_BLOCKED.swap(0, Ordering::Relaxed)
}

/// The calling thread's heap calls so far.
pub fn thread_heap_calls() -> u64 {
    CALLS.with(Cell::get)
}

/// Runs `f` with SIGPROF blocked on this thread: how the tests prove the
/// detector itself sees an allocation.
pub fn with_sigprof_blocked(f: impl FnOnce()) {
    // SAFETY: sigsets are plain storage, initialized by sigemptyset.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPROF);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        f();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
}

fn note_heap_call() {
    CALLS.with(|c| c.set(c.get() + 1));
    // Relaxed: see `check_mask`.
    if CHECK_MASK.load(Ordering::Relaxed) {
        // SAFETY: sigset_t is plain storage; the query writes it.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: a query of this thread's mask (null new set).
        let blocked = unsafe {
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut set) == 0
                && libc::sigismember(&set, libc::SIGPROF) == 1
        };
        if blocked {
            // Relaxed: a counter read after the threads are joined.
            WHILE_BLOCKED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

// SAFETY: forwards to the system allocator; the counting has no effect on it.
unsafe impl GlobalAlloc for SignalCounting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_heap_call();
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note_heap_call();
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_heap_call();
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
