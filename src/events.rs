//! Code events: what a heap tells its listeners when code is published, moved or
//! freed.
//!
//! Writers only *enqueue* an event, under the heap lock, so the events of one heap
//! are queued in the order they happened. A Load is queued, with its timestamp,
//! before its code becomes visible; a Move after its old copy is unpublished (the
//! new copy became visible just before, under the same lock; the timestamp was
//! taken before that), so that it can carry the old copy's retire tag, in the
//! heap's domain. A dispatcher thread, one per [`Listeners`], delivers them
//! in queue order, off every heap lock: a listener may do file I/O, take its time,
//! call [`crate::CodeHeap::stats`] or even publish code, and a listener that panics
//! is contained and counted. The queue is bounded: a writer whose event finds it
//! full waits, after releasing its heap lock, until the dispatcher catches up.
//! Lookups never touch listeners.
//!
//! ```
//! use std::sync::{Arc, OnceLock};
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use jitmap::events::{CodeEvent, CodeListener};
//! use jitmap::{CodeInfo, ExecutionManager, HeapConfig, JitKind};
//!
//! struct Count(AtomicUsize);
//! impl CodeListener for Count {
//!     fn on_event(&self, event: &CodeEvent) {
//!         if let CodeEvent::Load(load) = event {
//!             assert_eq!(load.info.name, "f");
//!             // Relaxed: a counter, read after `flush` has ordered delivery.
//!             self.0.fetch_add(1, Ordering::Relaxed);
//!         }
//!     }
//! }
//!
//! let manager = ExecutionManager::new(4);
//! let count = Arc::new(Count(AtomicUsize::new(0)));
//! manager.listeners().add(count.clone())?;
//! let heap = manager.create_heap(HeapConfig { span: 1 << 20, ..HeapConfig::default() })?;
//! let mut r = heap.reserve(1)?;
//! r.code_mut()[0] = 0xC3;
//! r.publish(CodeInfo::new(1, "f", JitKind::Optimized))?;
//! manager.listeners().flush(); // wait until every event so far is delivered
//! assert_eq!(count.0.load(Ordering::Relaxed), 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::VecDeque;
use std::io;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::{JoinHandle, ThreadId};

use parking_lot::{Condvar, Mutex, RwLock};

use crate::image::ImageSection;
use crate::info::CodeInfo;

/// Events a queue holds before writers wait for the dispatcher.
pub const QUEUE_CAPACITY: usize = 1024;

/// Which published block an event is about: its heap and the generation of
/// the reference its publish handed out ([`crate::CodeRef`]). Unique in the
/// process for the block's life; a move publishes a new block, so
/// [`CodeMove`] names both. Listeners key what they keep of a method
/// version by it: the info's `Arc` is shared only while the heap keeps one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId {
    /// The heap's id ([`crate::CodeHeap::id`]).
    pub heap: u64,
    /// The generation of the block's reference.
    pub generation: u64,
}

/// A method became visible.
#[derive(Clone, Debug)]
pub struct CodeLoad {
    /// CLOCK_MONOTONIC nanoseconds, taken before the code became visible.
    pub timestamp: u64,
    /// Kernel thread id of the thread that published the code.
    pub tid: u32,
    /// The block published.
    pub block: BlockId,
    /// Address of the first code byte.
    pub start: usize,
    /// A copy of the code bytes as published (the block may be freed and its
    /// bytes reused before a listener sees the event).
    pub code: Box<[u8]>,
    /// The method's info (name, debug rows, unwind data, `.eh_frame`).
    pub info: Arc<CodeInfo>,
    /// Bytes after the code where no other method's code lies while this one
    /// is live: the heap's [`unwind_room`](crate::HeapConfig::unwind_room)
    /// plus the block's padding. The jitdump maps the method's unwinding
    /// tables there for perf only when they fit.
    pub room: u64,
}

/// A method was copied to a new address (and the old copy freed).
#[derive(Clone, Debug)]
pub struct CodeMove {
    /// CLOCK_MONOTONIC nanoseconds, taken before the new copy became visible.
    pub timestamp: u64,
    /// Kernel thread id of the thread that moved the code.
    pub tid: u32,
    /// The block moved from (freed by the move).
    pub old_block: BlockId,
    /// The block moved to.
    pub new_block: BlockId,
    /// Old address of the first code byte.
    pub old_start: usize,
    /// New address of the first code byte.
    pub new_start: usize,
    /// Code size in bytes.
    pub size: u64,
    /// The method's info.
    pub info: Arc<CodeInfo>,
    /// The grace-period tag the old copy was retired at in the heap's domain
    /// ([`crate::epoch::Domain::retire_tag`]), taken after it was
    /// unpublished: a reader pinned after it cannot find the old copy, and
    /// once [`crate::epoch::Domain::is_safe`] says so for it, no reader can
    /// still hold the old copy and no executor of the heap's domain can
    /// still be running it. A profiler forgets the old address then.
    pub retire_tag: u64,
    /// CLOCK_MONOTONIC nanoseconds, taken after the old copy was
    /// unpublished: a reader that began later cannot find it (though an
    /// executor may still run it until `retire_tag` is safe).
    pub unpublished: u64,
}

/// A method was unpublished.
#[derive(Clone, Debug)]
pub struct CodeFree {
    /// CLOCK_MONOTONIC nanoseconds.
    pub timestamp: u64,
    /// The block freed.
    pub block: BlockId,
    /// Address of the first code byte.
    pub start: usize,
    /// Code size in bytes.
    pub size: u64,
    /// The freed method's info.
    pub info: Arc<CodeInfo>,
}

/// A precompiled image was loaded ([`crate::ExecutionManager::load_image`]):
/// its methods can be found from now on.
#[derive(Clone, Debug)]
pub struct ImageLoad {
    /// CLOCK_MONOTONIC nanoseconds, taken after the image became visible.
    pub timestamp: u64,
    /// The image: its base, size, functions and named methods.
    pub image: Arc<ImageSection>,
}

/// A precompiled image was unloaded
/// ([`crate::ExecutionManager::unload_image`]): lookups no longer find it.
#[derive(Clone, Debug)]
pub struct ImageUnload {
    /// CLOCK_MONOTONIC nanoseconds, taken after it was unlinked.
    pub timestamp: u64,
    /// Its base.
    pub base: usize,
    /// The unloaded image's [`crate::image::ImageSection::id`]: which load
    /// this ends (another image may be loaded at the same base by then).
    pub image_id: u64,
}

/// One code event.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum CodeEvent {
    /// Publish.
    Load(CodeLoad),
    /// Move.
    Move(CodeMove),
    /// Free.
    Free(CodeFree),
    /// An image's load.
    ImageLoad(ImageLoad),
    /// An image's unload.
    ImageUnload(ImageUnload),
}

/// Receives code events, on the dispatcher thread of the [`Listeners`] it was
/// added to, one event at a time, in the order writers emitted them.
pub trait CodeListener: Send + Sync {
    /// Handles one event. A panic here is caught and counted
    /// ([`Listeners::panics`]); it never reaches the heap.
    fn on_event(&self, event: &CodeEvent);
}

type ListenerList = Arc<[Arc<dyn CodeListener>]>;

struct Queue {
    events: VecDeque<CodeEvent>,
    /// Events ever enqueued.
    enqueued: u64,
    /// Events ever delivered (to every listener).
    delivered: u64,
    /// Set when the owning `Listeners` drops: deliver what is left, then exit.
    closed: bool,
}

struct Shared {
    list: RwLock<ListenerList>,
    /// `list.len()`, readable without the lock by writers that have nothing to emit.
    count: AtomicUsize,
    queue: Mutex<Queue>,
    /// Signalled when an event is enqueued or the queue closes.
    ready: Condvar,
    /// Signalled when an event has been delivered.
    drained: Condvar,
    panics: AtomicU64,
}

/// A shared, growable set of listeners (one per heap, or one per manager shared
/// by all its heaps) and the queue and thread that deliver events to them.
pub struct Listeners {
    shared: Arc<Shared>,
    /// The dispatcher, started by the first [`Listeners::add`].
    dispatcher: Mutex<Option<JoinHandle<()>>>,
    /// Its thread id, readable without the lock (writers ask on every publish).
    dispatcher_id: OnceLock<ThreadId>,
}

impl Default for Listeners {
    fn default() -> Self {
        Self {
            shared: Arc::new(Shared {
                list: RwLock::new(Arc::new([])),
                count: AtomicUsize::new(0),
                queue: Mutex::new(Queue {
                    events: VecDeque::new(),
                    enqueued: 0,
                    delivered: 0,
                    closed: false,
                }),
                ready: Condvar::new(),
                drained: Condvar::new(),
                panics: AtomicU64::new(0),
            }),
            dispatcher: Mutex::new(None),
            dispatcher_id: OnceLock::new(),
        }
    }
}

impl std::fmt::Debug for Listeners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listeners")
            .field("len", &self.shared.list.read().len())
            .field("panics", &self.panics())
            .finish()
    }
}

impl Listeners {
    /// Adds a listener; it sees every event delivered after this call. The first
    /// call starts the dispatcher thread, and fails only if it cannot be spawned.
    pub fn add(&self, listener: Arc<dyn CodeListener>) -> io::Result<()> {
        self.start_dispatcher()?;
        let mut list = self.shared.list.write();
        let mut next: Vec<_> = list.iter().cloned().collect();
        next.push(listener);
        *list = next.into();
        // Relaxed: a publish racing with this call may miss the new listener;
        // every later event is ordered by the list's lock.
        self.shared.count.store(list.len(), Ordering::Relaxed);
        Ok(())
    }

    /// Removes every listener that is `listener` (by pointer). Events already
    /// queued may still reach it.
    pub fn remove(&self, listener: &Arc<dyn CodeListener>) {
        let mut list = self.shared.list.write();
        let next: Vec<_> = list
            .iter()
            .filter(|l| !Arc::ptr_eq(l, listener))
            .cloned()
            .collect();
        *list = next.into();
        // Relaxed: as in `add`.
        self.shared.count.store(list.len(), Ordering::Relaxed);
    }

    /// Whether no listener is registered.
    pub fn is_empty(&self) -> bool {
        // Relaxed: as in `add`.
        self.shared.count.load(Ordering::Relaxed) == 0
    }

    /// Panics raised by listeners so far (each was caught; delivery went on).
    pub fn panics(&self) -> u64 {
        // Relaxed: a statistic.
        self.shared.panics.load(Ordering::Relaxed)
    }

    /// Waits until every event enqueued before this call has been delivered.
    /// Returns at once on the dispatcher thread itself (a listener that flushes).
    pub fn flush(&self) {
        if self.on_dispatcher() {
            return;
        }
        let mut q = self.shared.queue.lock();
        let target = q.enqueued;
        while q.delivered < target && !q.closed {
            self.shared.drained.wait(&mut q);
        }
    }

    /// Queues `event`. Called by writers under their heap lock, so one heap's
    /// events are queued in order. Never blocks on a listener.
    pub(crate) fn emit(&self, event: CodeEvent) {
        let mut q = self.shared.queue.lock();
        q.events.push_back(event);
        q.enqueued += 1;
        self.shared.ready.notify_one();
    }

    /// Waits, outside any heap lock, while the queue is over capacity: the
    /// backpressure that keeps it bounded. Not on the dispatcher thread.
    pub(crate) fn throttle(&self) {
        if self.is_empty() || self.on_dispatcher() {
            return;
        }
        let mut q = self.shared.queue.lock();
        while q.events.len() > QUEUE_CAPACITY && !q.closed {
            self.shared.drained.wait(&mut q);
        }
    }

    fn on_dispatcher(&self) -> bool {
        self.dispatcher_id.get() == Some(&std::thread::current().id())
    }

    fn start_dispatcher(&self) -> io::Result<()> {
        let mut slot = self.dispatcher.lock();
        if slot.is_none() {
            let shared = Arc::clone(&self.shared);
            let handle = std::thread::Builder::new()
                .name("jitmap-events".into())
                .spawn(move || dispatch(&shared))?;
            // Set once: the slot is empty only before the first spawn.
            let _ = self.dispatcher_id.set(handle.thread().id());
            *slot = Some(handle);
        }
        Ok(())
    }
}

/// The dispatcher's loop: deliver events in queue order until the queue closes
/// and is empty.
fn dispatch(shared: &Shared) {
    let mut q = shared.queue.lock();
    loop {
        let Some(event) = q.events.pop_front() else {
            if q.closed {
                return;
            }
            shared.ready.wait(&mut q);
            continue;
        };
        drop(q);
        let list = Arc::clone(&shared.list.read());
        for listener in list.iter() {
            if catch_unwind(AssertUnwindSafe(|| listener.on_event(&event))).is_err() {
                // Relaxed: a statistic.
                shared.panics.fetch_add(1, Ordering::Relaxed);
            }
        }
        q = shared.queue.lock();
        q.delivered += 1;
        shared.drained.notify_all();
    }
}

impl Drop for Listeners {
    /// Delivers every queued event, then stops the dispatcher.
    fn drop(&mut self) {
        {
            let mut q = self.shared.queue.lock();
            q.closed = true;
            self.shared.ready.notify_all();
            self.shared.drained.notify_all();
        }
        if let Some(handle) = self.dispatcher.get_mut().take()
            && !self.on_dispatcher()
        {
            // A listener's panic was caught inside the loop, so the thread ends
            // normally; there is nothing to report if it did not.
            let _ = handle.join();
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

/// The calling thread's kernel thread id.
pub fn current_tid() -> u32 {
    // SAFETY: gettid has no preconditions and cannot fail.
    unsafe { libc::gettid() as u32 }
}
