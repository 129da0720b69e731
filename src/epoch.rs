//! Grace periods for signal-safe readers: an epoch scheme over a fixed array of
//! reader slots.
//!
//! A reader's slot holds one word, `epoch << 16 | depth`, written only by the
//! owning thread and its signal handlers. Keeping epoch and depth in one word means
//! a handler that interrupts a pin at any instruction either sees the outer pin
//! complete (and nests under its epoch) or not started (and restores the slot to
//! empty before returning), so a nested unpin can never end the outer protection.
//!
//! Writers unpublish, then call [`Domain::retire_tag`] (a SeqCst fence, then the
//! epoch advances) and keep the retired object until [`Domain::safe_before`]
//! exceeds its tag. Nothing here allocates, locks or makes a system call on the
//! reader side, so pinning is async-signal-safe.

use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use crossbeam_utils::CachePadded;

use crate::sync::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};

const DEPTH_BITS: u32 = 16;
const DEPTH_MASK: u64 = (1 << DEPTH_BITS) - 1;

/// Errors of the reader registry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EpochError {
    /// Every reader slot is registered.
    NoSlots {
        /// Number of slots in the domain.
        slots: usize,
    },
    /// Pins nested more than 65,535 deep on one reader.
    TooDeep,
    /// The calling thread already has a bound reader.
    AlreadyBound,
    /// The reader is registered with another manager (another domain), so a
    /// guard of it would protect nothing there.
    ForeignReader,
}

impl fmt::Display for EpochError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoSlots { slots } => write!(f, "all {slots} reader slots are registered"),
            Self::TooDeep => f.write_str("pins nested too deep"),
            Self::AlreadyBound => f.write_str("this thread already has a bound reader"),
            Self::ForeignReader => f.write_str("the reader is registered with another manager"),
        }
    }
}

impl std::error::Error for EpochError {}

/// A lookup was given a guard pinned in another [`Domain`] than the structure's.
/// Such a guard protects nothing there, so the lookup refuses rather than answer
/// "no code here" (a profiler wired to the wrong domain would otherwise quietly
/// report no JIT frames).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForeignGuard;

impl fmt::Display for ForeignGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the guard is pinned in another reader domain")
    }
}

impl std::error::Error for ForeignGuard {}

struct Slot {
    /// Whether a [`Reader`] owns this slot.
    owned: AtomicBool,
    /// `epoch << 16 | depth`; 0 when not pinned.
    state: AtomicU64,
}

/// A set of reader slots and the global epoch. Every structure whose memory
/// readers may touch retires through the same domain as its readers pin in.
pub struct Domain {
    epoch: CachePadded<AtomicU64>,
    slots: Box<[CachePadded<Slot>]>,
    /// Registered [`Executor`]s, online or offline.
    executors: AtomicUsize,
    /// [`Executor`]s ever registered.
    executors_ever: AtomicU64,
}

impl fmt::Debug for Domain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Domain")
            .field("slots", &self.slots.len())
            .finish_non_exhaustive()
    }
}

impl Domain {
    /// A domain with `slots` slots, shared by [`Reader`]s and [`Executor`]s. The
    /// number is fixed: size it for every thread that will look up or run code
    /// at once (a `slots` of 0 is taken as 1). Each slot is one cache line, and a
    /// reclaiming writer scans them all.
    pub fn new(slots: usize) -> Arc<Self> {
        Arc::new(Self {
            epoch: CachePadded::new(AtomicU64::new(1)),
            slots: (0..slots.max(1))
                .map(|_| {
                    CachePadded::new(Slot {
                        owned: AtomicBool::new(false),
                        state: AtomicU64::new(0),
                    })
                })
                .collect(),
            executors: AtomicUsize::new(0),
            executors_ever: AtomicU64::new(0),
        })
    }

    /// Number of reader slots.
    pub fn slot_count(&self) -> usize {
        self.slots.len()
    }

    /// Registers a reader. Call it outside signal handlers, once per thread.
    /// Slots are fixed when the domain is created and shared by readers and
    /// executors; when all are taken this is [`EpochError::NoSlots`], and a slot
    /// is free again once its `Reader` or `Executor` drops.
    pub fn register(self: &Arc<Self>) -> Result<Reader, EpochError> {
        Ok(Reader {
            domain: Arc::clone(self),
            index: self.claim_slot()?,
            _not_sync: PhantomData,
        })
    }

    /// Registers the calling thread as an executor of code whose memory this
    /// domain reclaims: from now until the executor drops or goes
    /// [`Executor::offline`], nothing freed is reused before this thread has
    /// passed a quiescent point ([`Executor::quiescent`]) after the free. The
    /// executor starts online.
    ///
    /// ```
    /// let domain = jitmap::Domain::new(4);
    /// let executor = domain.register_executor()?;
    /// // ... run JIT code ...
    /// executor.quiescent(); // between top-level calls: no frame of JIT code is live
    /// executor.offline(); // parked: frees need not wait for this thread
    /// executor.online(); // before running JIT code again
    /// # Ok::<(), jitmap::EpochError>(())
    /// ```
    pub fn register_executor(self: &Arc<Self>) -> Result<Executor, EpochError> {
        let executor = Executor {
            domain: Arc::clone(self),
            index: self.claim_slot()?,
            _not_sync: PhantomData,
        };
        // Relaxed: a count that callers consult to refuse a free no thread
        // could be protected from; it orders nothing (the slot does).
        self.executors.fetch_add(1, Ordering::Relaxed);
        // Relaxed: as above, advisory.
        self.executors_ever.fetch_add(1, Ordering::Relaxed);
        executor.online();
        Ok(executor)
    }

    /// How many [`Executor`]s are registered now (online or offline). With
    /// none, nothing holds a freed block's bytes back once readers are done,
    /// so a host that frees code some thread may still run has forgotten to
    /// register that thread; `jitmap-cranelift` refuses to redefine or free
    /// a function then.
    ///
    /// ```
    /// let domain = jitmap::Domain::new(2);
    /// assert_eq!(domain.executors(), 0);
    /// let executor = domain.register_executor()?;
    /// assert_eq!(domain.executors(), 1);
    /// drop(executor);
    /// assert_eq!(domain.executors(), 0);
    /// # Ok::<(), jitmap::EpochError>(())
    /// ```
    pub fn executors(&self) -> usize {
        // Relaxed: advisory, as in `register_executor`.
        self.executors.load(Ordering::Relaxed)
    }

    /// How many [`Executor`]s were ever registered, the dropped included. A
    /// host whose executor threads have all finished has registered some
    /// and has none now: no registered thread can run its code any more. A
    /// host that never registered one may still be running code on threads
    /// it never declared; `jitmap-cranelift` refuses to free code for that
    /// host only.
    ///
    /// ```
    /// let domain = jitmap::Domain::new(2);
    /// assert_eq!(domain.executors_ever(), 0);
    /// drop(domain.register_executor()?);
    /// assert_eq!((domain.executors(), domain.executors_ever()), (0, 1));
    /// # Ok::<(), jitmap::EpochError>(())
    /// ```
    pub fn executors_ever(&self) -> u64 {
        // Relaxed: advisory, as in `register_executor`.
        self.executors_ever.load(Ordering::Relaxed)
    }

    fn claim_slot(&self) -> Result<usize, EpochError> {
        for (index, slot) in self.slots.iter().enumerate() {
            // Acquire: the previous owner's last slot store (clearing it) happens
            // before we use the slot. Relaxed on failure: we just try the next slot.
            if slot
                .owned
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return Ok(index);
            }
        }
        Err(EpochError::NoSlots {
            slots: self.slots.len(),
        })
    }

    /// Tags an object that was just unpublished: a SeqCst fence, then the epoch
    /// advances. Returns the tag to pass to [`Domain::is_safe`].
    ///
    /// The fence pairs with the one in [`Reader::pin`]: either this writer's later
    /// slot scan sees the reader's slot, or the reader's lookups see the unpublish.
    pub fn retire_tag(&self) -> u64 {
        fence(Ordering::SeqCst);
        // Relaxed: the fence above orders the unpublish before this increment; a
        // reader that loads the new value is then ordered after the unpublish by the
        // fence in its own pin.
        self.epoch.fetch_add(1, Ordering::Relaxed)
    }

    /// The oldest epoch any pinned reader may hold: an object whose tag is below
    /// it can no longer be reached by any reader.
    pub fn safe_before(&self) -> u64 {
        if crate::sync::defect!(SkipGracePeriod) {
            return u64::MAX;
        }
        fence(Ordering::SeqCst);
        // Relaxed: the fence above is the writer half of the pin/retire handshake.
        let mut oldest = self.epoch.load(Ordering::Relaxed);
        for slot in self.slots.iter() {
            // Acquire: every slot store is Release (pin, unpin, reader drop), so
            // whichever value we read, the lookups the reader made before storing it
            // happen before anything reclaimed on the strength of that value.
            let state = slot.state.load(Ordering::Acquire);
            if state != 0 {
                oldest = oldest.min(state >> DEPTH_BITS);
            }
        }
        oldest
    }

    /// Whether an object retired with `tag` may be reclaimed now.
    pub fn is_safe(&self, tag: u64) -> bool {
        tag < self.safe_before()
    }
}

/// A registered reader: one slot, used by one thread and its signal handlers.
pub struct Reader {
    domain: Arc<Domain>,
    index: usize,
    _not_sync: PhantomData<Cell<()>>,
}

impl Reader {
    /// Protects everything reachable through lookups until the guard drops.
    /// Async-signal-safe: atomics and a fence only. Nesting is allowed, including
    /// from a signal handler that interrupts another pin or lookup.
    pub fn pin(&self) -> Result<Guard<'_>, EpochError> {
        let slot = &self.domain.slots[self.index].state;
        // Relaxed: only this thread and its signal handlers write the slot, and a
        // handler always restores the value it found before it returns.
        let state = slot.load(Ordering::Relaxed);
        let depth = state & DEPTH_MASK;
        if depth == DEPTH_MASK {
            return Err(EpochError::TooDeep);
        }
        let next = if depth == 0 {
            // Relaxed: a stale (older) epoch only delays reclamation.
            (self.domain.epoch.load(Ordering::Relaxed) << DEPTH_BITS) | 1
        } else {
            state + 1
        };
        // Release: a writer whose Acquire slot scan reads this value must also see
        // every lookup this thread made under earlier guards. A later Relaxed store
        // would not continue the release sequence of `unpin`'s Release store, so a
        // writer reading it (and trusting its newer epoch) would not synchronize
        // with those lookups. (The fence below publishes the store itself.)
        let order = if crate::sync::defect!(RelaxedRepin) {
            Ordering::Relaxed
        } else {
            Ordering::Release
        };
        slot.store(next, order);
        // SeqCst: orders the slot store before this guard's lookups, against the
        // fence a writer issues between unpublishing and scanning the slots.
        fence(Ordering::SeqCst);
        Ok(Guard {
            reader: self,
            domain: Arc::as_ptr(&self.domain),
            last_section: Cell::new(LastSection::NONE),
        })
    }

    /// The domain this reader is registered in.
    pub fn domain(&self) -> &Arc<Domain> {
        &self.domain
    }

    /// The index of this reader's slot in its domain.
    pub fn slot(&self) -> usize {
        self.index
    }

    fn unpin(&self) {
        let slot = &self.domain.slots[self.index].state;
        // Relaxed: as in `pin`, only this thread and its handlers touch the slot.
        let state = slot.load(Ordering::Relaxed);
        let outermost = state & DEPTH_MASK == 1 || crate::sync::defect!(NestedUnpinClears);
        let next = if outermost { 0 } else { state - 1 };
        // Release: the lookups made under the guard happen before a writer that
        // reads the cleared slot reclaims what they touched.
        slot.store(next, Ordering::Release);
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        let slot = &self.domain.slots[self.index];
        // Release: as in `pin`, a writer that reads this 0 and reclaims must see the
        // lookups of this reader's past guards; a Relaxed store would not continue
        // the release sequence of the last `unpin`.
        let order = if crate::sync::defect!(RelaxedRepin) {
            Ordering::Relaxed
        } else {
            Ordering::Release
        };
        slot.state.store(0, order);
        // Release: hands the slot to the next registrant, whose CAS is Acquire.
        slot.owned.store(false, Ordering::Release);
    }
}

/// A thread that runs code from heaps of this domain. While it is online, a
/// freed block's bytes (and a dropped heap's mapping) are reused only after it
/// has passed a quiescent point following the free: a point where it holds no
/// frame of JIT code, such as between two top-level calls into JIT code. That
/// is how code that may still be running, or be returned into, stays intact,
/// the way runtimes use safepoints. A [`Guard`] protects lookups only.
///
/// Used by one thread (it is `Send`, not `Sync`). Its calls are a few atomics and
/// at most one fence, and async-signal-safe.
pub struct Executor {
    domain: Arc<Domain>,
    index: usize,
    _not_sync: PhantomData<Cell<()>>,
}

impl Executor {
    /// Declares a quiescent point: this thread holds no frame of JIT code freed
    /// before this call. Cheap when nothing was freed since the last one (two
    /// loads); otherwise one store and a fence.
    #[inline]
    pub fn quiescent(&self) {
        let slot = &self.domain.slots[self.index].state;
        // Relaxed: a stale (older) epoch only delays reclamation.
        let now = self.domain.epoch.load(Ordering::Relaxed) << DEPTH_BITS | 1;
        // Relaxed: only this thread writes its executor slot.
        if slot.load(Ordering::Relaxed) != now {
            self.announce(now);
        }
    }

    /// Goes online (after [`Executor::offline`]): from here on, frees wait for
    /// this thread's quiescent points. Call it before running JIT code again.
    pub fn online(&self) {
        // Relaxed: as in `quiescent`.
        self.announce(self.domain.epoch.load(Ordering::Relaxed) << DEPTH_BITS | 1);
    }

    /// Goes offline: the thread will run no JIT code (it parks, blocks in the
    /// host, or leaves for good) until [`Executor::online`], so frees need not
    /// wait for it.
    pub fn offline(&self) {
        // Release: everything this thread executed before is ordered before a
        // writer's reclamation that reads this 0 with its Acquire scan.
        self.domain.slots[self.index]
            .state
            .store(0, Ordering::Release);
    }

    /// The domain this executor is registered in.
    pub fn domain(&self) -> &Arc<Domain> {
        &self.domain
    }

    fn announce(&self, state: u64) {
        let slot = &self.domain.slots[self.index].state;
        // Release: the code this thread ran before the quiescent point happens
        // before a reclamation that reads the newer epoch.
        slot.store(state, Ordering::Release);
        // SeqCst: as in `Reader::pin`, orders the store before this thread's next
        // loads of code pointers (indirection cells), against the fence a writer
        // issues between unlinking and scanning: either the writer sees this
        // epoch, or this thread sees the unlinked cell.
        fence(Ordering::SeqCst);
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        self.offline();
        // Relaxed: as in `Domain::register_executor`.
        self.domain.executors.fetch_sub(1, Ordering::Relaxed);
        // Release: hands the slot to the next registrant, whose CAS is Acquire.
        self.domain.slots[self.index]
            .owned
            .store(false, Ordering::Release);
    }
}

std::thread_local! {
    /// The reader bound to this thread, or null. A `const` initializer and a type
    /// without a destructor: accessing it never initializes anything lazily or
    /// registers a destructor, so a signal handler may read it.
    static CURRENT: Cell<*const Reader> = const { Cell::new(std::ptr::null()) };
}

/// A reader bound to the thread that made it, so that code with no other way to
/// reach it (a signal handler) finds it with [`with_current_reader`]. Unbound
/// when dropped; it cannot leave its thread.
///
/// The binding lives in a `const`-initialized thread-local with no destructor,
/// which is a plain thread-pointer-relative load in an executable and in
/// libraries linked at startup. In a library loaded later with `dlopen`, the
/// first access on a thread may go through `__tls_get_addr`, which can allocate:
/// such a host should call [`with_current_reader`] once on each thread outside
/// any handler (binding does), or pass the reader to its handler itself (as a
/// timer's `sigev_value` can).
pub struct BoundReader {
    reader: Box<Reader>,
    _not_send: PhantomData<*const ()>,
}

impl BoundReader {
    /// The bound reader.
    pub fn reader(&self) -> &Reader {
        &self.reader
    }
}

impl Drop for BoundReader {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(std::ptr::null()));
    }
}

impl Domain {
    /// Registers a reader and binds it to the calling thread (outside any signal
    /// handler). A thread holds one binding at a time:
    /// [`EpochError::AlreadyBound`] otherwise.
    pub fn bind_current_thread(self: &Arc<Self>) -> Result<BoundReader, EpochError> {
        if CURRENT.with(|c| !c.get().is_null()) {
            return Err(EpochError::AlreadyBound);
        }
        let reader = Box::new(self.register()?);
        CURRENT.with(|c| c.set(&*reader));
        Ok(BoundReader {
            reader,
            _not_send: PhantomData,
        })
    }
}

/// Runs `f` with the calling thread's bound reader ([`Domain::bind_current_thread`]),
/// or returns `None` if the thread has none. Async-signal-safe: one thread-local
/// load, no allocation, no lock, no system call.
///
/// ```
/// use jitmap::ExecutionManager;
/// use jitmap::epoch::with_current_reader;
///
/// let manager = ExecutionManager::new(4);
/// let _bound = manager.domain().bind_current_thread()?; // on each sampled thread
/// // In the SIGPROF handler, with the interrupted pc:
/// let pc = 0x1234;
/// let method = with_current_reader(|reader| {
///     let guard = manager.pin(reader).ok()?;
///     let block = guard.find(pc)?;
///     Some(block.method_id())
/// });
/// assert_eq!(method, Some(None)); // bound, and nothing at that pc
/// # Ok::<(), jitmap::EpochError>(())
/// ```
pub fn with_current_reader<R>(f: impl FnOnce(&Reader) -> R) -> Option<R> {
    let reader = CURRENT.with(Cell::get);
    // SAFETY: a non-null binding points into the `BoundReader` of this thread,
    // which clears it before the reader is dropped; the box never moves.
    (!reader.is_null()).then(|| f(unsafe { &*reader }))
}

/// Proof that the holder's reader is pinned. Lookups take `&Guard`.
///
/// A guard also remembers the last section a range map found under it, so
/// that a stack walk, whose frames mostly sit in one heap, routes each frame
/// without walking the map's levels again (see
/// [`RangeSectionMap::find`](crate::range::RangeSectionMap::find)).
pub struct Guard<'r> {
    reader: &'r Reader,
    /// The reader's domain, so that a lookup's check is one load and a compare.
    domain: *const Domain,
    last_section: Cell<LastSection>,
}

/// The last section a range map found under one guard. The pointer is only
/// ever followed while the same guard is pinned, and only if the map's write
/// sequence still reads `seq`: the section is then still linked, and alive.
#[derive(Clone, Copy)]
pub(crate) struct LastSection {
    /// The id of the map that found it (0: nothing yet); ids are never reused.
    pub(crate) map: u64,
    /// The map's write sequence (even) read before the walk that found it.
    pub(crate) seq: u64,
    /// The section's bounds, copied so a miss costs no load of the section.
    pub(crate) begin: usize,
    pub(crate) end: usize,
    /// The section (a fragment of that map).
    pub(crate) section: *const (),
}

impl LastSection {
    const NONE: Self = Self {
        map: 0,
        seq: 0,
        begin: 0,
        end: 0,
        section: std::ptr::null(),
    };
}

impl Guard<'_> {
    /// The domain whose grace period this guard holds open.
    pub fn domain(&self) -> &Arc<Domain> {
        &self.reader.domain
    }

    /// What a range map found last under this guard.
    #[inline]
    pub(crate) fn last_section(&self) -> &Cell<LastSection> {
        &self.last_section
    }

    /// `Ok` if this guard is pinned in `domain`.
    #[inline]
    pub fn check(&self, domain: &Arc<Domain>) -> Result<(), ForeignGuard> {
        if std::ptr::eq(self.domain, Arc::as_ptr(domain)) {
            Ok(())
        } else {
            Err(ForeignGuard)
        }
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        self.reader.unpin();
    }
}
