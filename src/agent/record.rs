//! The per-thread record: everything the signal handler and the probes of one
//! thread touch, allocated when the thread attaches.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::ExecutionManager;
use crate::epoch::Reader;

use super::StackEnds;
use super::native::ModuleSlot;
use super::ring::Ring;
use crate::unwind::StackEnd;

/// How many [`StackEnd`] reasons there are (the last is `FramePointer`).
pub(crate) const STACK_ENDS: usize = StackEnd::FramePointer as usize + 1;

/// Marks a live record, so that a stray pointer is caught before it is used.
pub(crate) const RECORD_MAGIC: u64 = 0x6a69_746d_6170_7468; // "jitmapth"

/// What a frame's address turned out to be.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u8)]
pub(crate) enum FrameKind {
    /// Outside every section: native code, symbolized later.
    #[default]
    Native,
    /// A JIT method; `key` is its start address.
    Jit,
    /// An image method; `key` is its method id.
    Image,
    /// A stub block; `key` is its kind.
    Stub,
    /// Inside a heap or image, but in no method or stub (free space, padding,
    /// thunks).
    Unattributed,
}

/// One frame as the handler records it. Fixed size, no pointers to follow.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub(crate) struct RawFrame {
    /// The pc (frame 0) or return address (later frames).
    pub(crate) addr: usize,
    /// See [`FrameKind`].
    pub(crate) key: u64,
    /// Offset of the looked-up address in its method.
    pub(crate) offset: u32,
    pub(crate) kind: FrameKind,
}

/// One sample's fixed part; its frames follow in the ring.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SampleHeader {
    /// CLOCK_MONOTONIC ns before the walk and after the last lookup.
    pub(crate) begin_ns: u64,
    pub(crate) end_ns: u64,
    /// Frames recorded.
    pub(crate) depth: u32,
    /// The timer expirations this sample stands for: 1 plus the signal's
    /// overrun (expirations the kernel coalesced into it).
    pub(crate) weight: u32,
    /// Why the walk ended ([`StackEnd`] as `u8`).
    pub(crate) end: u8,
    /// The first frame whose caller was found by a native object's rows
    /// (`u32::MAX`: none), and the loader's counts those rows were made at.
    /// The collector keeps the frames after it only if the loader had not
    /// changed by the sample's time (see `Collector::collect`).
    pub(crate) native_from: u32,
    pub(crate) rows_loader: (u64, u64),
}

/// What a probe record says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum ProbeKind {
    #[default]
    Enter,
    Value,
}

/// One probe call's record.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ProbeRecord {
    pub(crate) kind: ProbeKind,
    pub(crate) method_id: u64,
    pub(crate) value: u64,
    /// The CPU's cycle counter (see `probes::ticks`).
    pub(crate) ticks: u64,
}

/// The reader the handler pins, shared with the collector only to be kept alive.
pub(crate) struct HandlerReader(pub(crate) Reader);

// SAFETY: only the attached thread and its signal handler pin this reader (the
// same discipline as a plain `Reader`); other threads only hold the record,
// never touch the reader, and may drop it after the thread detached.
unsafe impl Sync for HandlerReader {}

/// Everything one attached thread's handler and probes use. Never moves: the
/// registry's table (which the timer's token names) and the probe context
/// point at it.
pub(crate) struct ThreadRecord {
    pub(crate) magic: u64,
    pub(crate) tid: u32,
    pub(crate) manager: ExecutionManager,
    pub(crate) reader: HandlerReader,
    /// The thread's stack: frame pointers outside [lo, hi) end a walk.
    pub(crate) stack_lo: usize,
    pub(crate) stack_hi: usize,
    pub(crate) samples: Ring<SampleHeader, RawFrame>,
    pub(crate) probes: Ring<ProbeRecord, ()>,
    /// Signals handled (each one a sample, kept or dropped).
    pub(crate) taken: AtomicU64,
    /// Lookups the handler made.
    pub(crate) lookups: AtomicU64,
    /// The timer expirations the dropped samples stood for: each one's
    /// weight (the sample ring counts the samples themselves).
    pub(crate) dropped_periods: AtomicU64,
    /// How many samples on this thread are between entering and leaving the
    /// ring's producer role (the handler's, `sample_now`'s, nested in any
    /// order): only the outermost pushes, any other is dropped.
    pub(crate) busy: AtomicU32,
    /// The native unwind tables, in [`super::Unwind::Mixed`]; `None` walks
    /// frame pointers.
    pub(crate) modules: Option<Arc<ModuleSlot>>,
    /// Walks ended, by [`StackEnd`] (in its declaration order).
    pub(crate) ends: [AtomicU64; STACK_ENDS],
    /// The thread's CPU clock, and its reading when the thread attached.
    pub(crate) cpu_clock: libc::clockid_t,
    pub(crate) cpu_at_attach_ns: u64,
    /// CLOCK_MONOTONIC ns when the thread attached: its timer's wall time
    /// runs from here.
    pub(crate) attached_at_ns: u64,
    /// The thread's timer as its handler sees it: the period in force, and
    /// the back-off when the handler cannot keep up.
    pub(crate) pace: super::pace::Pace,
    /// The collector's doorbell, rung when a ring fills to its bell.
    pub(crate) doorbell: Arc<super::doorbell::Doorbell>,
    /// The native rules this thread's handler looked up last.
    pub(crate) rules: super::rule_cache::RuleCache,
}

impl ThreadRecord {
    /// Whether `regs` were interrupted on this thread's own stack: only then
    /// does the handler run on the thread that owns the record's rings.
    pub(crate) fn owns_stack_of(&self, regs: super::handler::Registers) -> bool {
        (self.stack_lo..=self.stack_hi).contains(&regs.sp)
    }

    /// CPU time the thread has used since it attached, read from its CPU
    /// clock (any thread may read it while the thread lives); 0 if the
    /// clock cannot be read.
    pub(crate) fn cpu_since_attach(&self) -> std::time::Duration {
        let now = cpu_clock_ns(self.cpu_clock).unwrap_or(self.cpu_at_attach_ns);
        std::time::Duration::from_nanos(now.saturating_sub(self.cpu_at_attach_ns))
    }

    /// Signals this thread's handler has run for.
    pub(crate) fn taken(&self) -> u64 {
        // Relaxed: a statistic, exact once the handler has stopped running.
        self.taken.load(Ordering::Relaxed)
    }

    /// Lookups this thread's handler has made.
    pub(crate) fn lookups(&self) -> u64 {
        // Relaxed: as `taken`.
        self.lookups.load(Ordering::Relaxed)
    }

    /// The timer expirations this thread's dropped samples stood for.
    pub(crate) fn dropped_periods(&self) -> u64 {
        // Relaxed: as `taken`.
        self.dropped_periods.load(Ordering::Relaxed)
    }

    /// Counts a sample, standing for `weight` periods, dropped before it
    /// reached the ring. Async-signal-safe.
    #[inline]
    pub(crate) fn drop_sample(&self, weight: u32) {
        self.samples.count_drop();
        self.count_dropped_periods(weight);
    }

    /// Counts the `weight` periods a dropped sample stood for (the ring
    /// counted the sample when it refused it). Async-signal-safe.
    #[inline]
    pub(crate) fn count_dropped_periods(&self, weight: u32) {
        // Relaxed: a statistic; `fetch_add` as for `taken`.
        self.dropped_periods
            .fetch_add(u64::from(weight), Ordering::Relaxed);
    }

    /// Counts one walk's end, for the `weight` periods its sample stands
    /// for (as the stacks count them).
    #[inline]
    pub(crate) fn count_end(&self, end: StackEnd, weight: u32) {
        // Relaxed: a statistic; `fetch_add` as for `taken`.
        self.ends[end as usize].fetch_add(u64::from(weight), Ordering::Relaxed);
    }

    /// Moves one walk's end, counted as `from` (a [`StackEnd`] as `u8`) for
    /// `weight` periods, to `to`: the collector cut the sample short.
    pub(crate) fn recount_end(&self, from: u8, to: StackEnd, weight: u32) {
        if let Some(counter) = self.ends.get(usize::from(from)) {
            // Relaxed: statistics; read-modify-writes, so the handler's own
            // increments are kept.
            counter.fetch_sub(u64::from(weight), Ordering::Relaxed);
            self.ends[to as usize].fetch_add(u64::from(weight), Ordering::Relaxed);
        }
    }

    /// Walks ended so far, by reason.
    pub(crate) fn ends(&self) -> StackEnds {
        // Relaxed: as `taken`.
        let n = |end: StackEnd| self.ends[end as usize].load(Ordering::Relaxed);
        StackEnds {
            root: n(StackEnd::Root),
            depth_limit: n(StackEnd::DepthLimit),
            no_unwind_info: n(StackEnd::NoUnwindInfo),
            unsupported: n(StackEnd::Unsupported),
            bad_stack: n(StackEnd::BadStack),
            frame_pointer: n(StackEnd::FramePointer),
        }
    }
}

/// The calling thread's CPU clock.
pub(crate) fn current_cpu_clock() -> std::io::Result<libc::clockid_t> {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: `clock` is writable; pthread_self is this thread.
    let rc = unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut clock) };
    if rc == 0 {
        Ok(clock)
    } else {
        Err(std::io::Error::from_raw_os_error(rc))
    }
}

/// A CPU clock's reading in nanoseconds.
pub(crate) fn cpu_clock_ns(clock: libc::clockid_t) -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is writable; an invalid clock is an error, not UB.
    (unsafe { libc::clock_gettime(clock, &mut ts) } == 0)
        .then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// The calling thread's stack bounds, from the C library.
pub(crate) fn current_stack() -> std::io::Result<(usize, usize)> {
    // SAFETY: an all-zero pthread_attr_t is valid storage for
    // `pthread_getattr_np` to initialize.
    let mut attr: libc::pthread_attr_t = unsafe { std::mem::zeroed() };
    // SAFETY: `attr` is writable storage; pthread_self is this thread.
    let rc = unsafe { libc::pthread_getattr_np(libc::pthread_self(), &mut attr) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    let mut addr = std::ptr::null_mut();
    let mut size = 0usize;
    // SAFETY: `attr` was initialized above; the out pointers are valid.
    let rc = unsafe { libc::pthread_attr_getstack(&attr, &mut addr, &mut size) };
    // SAFETY: `attr` was initialized above and is destroyed once.
    unsafe { libc::pthread_attr_destroy(&mut attr) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    Ok((addr as usize, addr as usize + size))
}
