//! Code events: what a heap tells its listeners when code is published, moved or
//! freed. Writers emit them under the heap lock, so a listener sees one heap's
//! events in the order they happened; lookups never touch listeners.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::RwLock;

use crate::heap::{CodeInfo, JitKind};

/// A method became visible.
#[derive(Clone, Copy, Debug)]
pub struct CodeLoad<'a> {
    /// CLOCK_MONOTONIC nanoseconds, taken before the code became visible.
    pub timestamp: u64,
    /// Address of the first code byte.
    pub start: usize,
    /// The code bytes as published.
    pub code: &'a [u8],
    /// The method's info (name, debug rows, unwind data, `.eh_frame`).
    pub info: &'a CodeInfo,
}

/// A method was copied to a new address (and the old copy freed).
#[derive(Clone, Copy, Debug)]
pub struct CodeMove<'a> {
    /// CLOCK_MONOTONIC nanoseconds, taken before the new copy became visible.
    pub timestamp: u64,
    /// Old address of the first code byte.
    pub old_start: usize,
    /// New address of the first code byte.
    pub new_start: usize,
    /// Code size in bytes.
    pub size: u64,
    /// The method's info.
    pub info: &'a CodeInfo,
}

/// A method was unpublished.
#[derive(Clone, Copy, Debug)]
pub struct CodeFree {
    /// CLOCK_MONOTONIC nanoseconds.
    pub timestamp: u64,
    /// Address of the first code byte.
    pub start: usize,
    /// Code size in bytes.
    pub size: u64,
    /// The runtime's method id.
    pub method_id: u64,
    /// Tier of the freed code.
    pub kind: JitKind,
}

/// One code event.
#[derive(Clone, Copy, Debug)]
pub enum CodeEvent<'a> {
    /// Publish.
    Load(CodeLoad<'a>),
    /// Move.
    Move(CodeMove<'a>),
    /// Free.
    Free(CodeFree),
}

/// Receives code events. Called by writers with the heap lock held: it must not
/// call back into the heap's writer operations, and should be quick.
pub trait CodeListener: Send + Sync {
    /// Handles one event.
    fn on_event(&self, event: &CodeEvent<'_>);
}

/// A shared, growable set of listeners (one per heap, or one per manager shared
/// by all its heaps).
#[derive(Default)]
pub struct Listeners {
    list: RwLock<Vec<Arc<dyn CodeListener>>>,
    /// `list.len()`, readable without the lock by writers that have nothing to emit.
    count: AtomicUsize,
}

impl std::fmt::Debug for Listeners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listeners")
            .field("len", &self.list.read().len())
            .finish()
    }
}

impl Listeners {
    /// Adds a listener; it sees every event emitted after this call.
    pub fn add(&self, listener: Arc<dyn CodeListener>) {
        let mut list = self.list.write();
        list.push(listener);
        // Relaxed: a publish racing with this call may miss the new listener;
        // every later event is ordered by the list's lock.
        self.count.store(list.len(), Ordering::Relaxed);
    }

    /// Removes every listener that is `listener` (by pointer).
    pub fn remove(&self, listener: &Arc<dyn CodeListener>) {
        let mut list = self.list.write();
        list.retain(|l| !Arc::ptr_eq(l, listener));
        // Relaxed: as in `add`.
        self.count.store(list.len(), Ordering::Relaxed);
    }

    /// Whether no listener is registered.
    pub fn is_empty(&self) -> bool {
        // Relaxed: as in `add`.
        self.count.load(Ordering::Relaxed) == 0
    }

    /// Delivers `event` to every listener.
    pub(crate) fn emit(&self, event: &CodeEvent<'_>) {
        if self.is_empty() {
            return;
        }
        for l in self.list.read().iter() {
            l.on_event(event);
        }
    }
}

/// CLOCK_MONOTONIC in nanoseconds: the clock `perf record -k 1` uses.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
