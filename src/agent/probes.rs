//! Probes that JIT code calls directly, through an absolute address.
//!
//! JIT code calls them like any C function (`extern "C"`, the System V ABI on
//! x86-64), usually from a tier-0 method's prologue. They follow the rules for
//! native code called from JIT code: no allocation, no lock, no system call, no
//! call back into the runtime or the heap's writer side, and a short, bounded
//! path. Each uses only its arguments and memory allocated before the JIT code
//! ran: a [`CounterCell`] of a [`CallCounters`] table, or the calling thread's
//! [`ProbeContext`] (its attached record, see
//! [`super::AttachedThread::probe_context`]).
//!
//! What they are for: the call counter drives tiered compilation (tier-0 code
//! counts its calls; the compiler thread polls [`CallCounters::take_crossed`]
//! and recompiles what crossed); the entry probe traces which methods run and
//! when, for a call log or a coverage map; the value probe inspects values at
//! chosen points (argument types for speculation, loop trip counts, branch
//! outcomes). Each record lands in the calling thread's ring, and
//! [`super::Agent::stop`] returns their counts (and, with
//! [`super::AgentConfig::keep_samples`], every record).
//!
//! | probe | arguments | does |
//! |---|---|---|
//! | [`jitmap_probe_count`] | cell | counts a call; returns 1 exactly once, when the threshold is crossed, and marks the cell for the compiler |
//! | [`jitmap_probe_enter`] | context, method id | records (method id, time) in the thread's probe ring |
//! | [`jitmap_probe_value`] | context, method id, value | records a 64-bit value with its method id |

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use parking_lot::Mutex;

use super::record::{ProbeKind, ProbeRecord, RECORD_MAGIC, ThreadRecord};

/// A thread's probe context: JIT code receives it from its host (in a register
/// or a frame slot, as runtimes pass their thread object) and hands it to
/// [`jitmap_probe_enter`] and [`jitmap_probe_value`]. Opaque; valid while the
/// thread's [`super::AttachedThread`] lives.
#[repr(C)]
pub struct ProbeContext {
    _opaque: [u8; 0],
}

/// The CPU's cycle counter: one instruction, no system call.
#[inline]
pub(crate) fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `rdtsc` is available on every x86-64 CPU and has no side effects.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(target_arch = "aarch64")]
    {
        let value: u64;
        // SAFETY: reading the virtual counter is allowed at EL0 on Linux.
        unsafe { core::arch::asm!("mrs {}, cntvct_el0", out(reg) value, options(nomem, nostack)) };
        value
    }
}

/// The record behind a context, if it is one.
///
/// # Safety
/// `context` is null or came from a live `AttachedThread` of the calling thread.
#[inline]
unsafe fn record<'a>(context: *const ProbeContext) -> Option<&'a ThreadRecord> {
    // SAFETY: the caller's contract: null or a live record.
    let record = unsafe { context.cast::<ThreadRecord>().as_ref()? };
    (record.magic == RECORD_MAGIC).then_some(record)
}

/// Records that `method_id` was entered, with the time, in the calling
/// thread's probe ring. A full ring drops the record and counts it; a null
/// context does nothing.
///
/// # Safety
/// `context` is null, or the calling thread's own
/// [`super::AttachedThread::probe_context`], still attached.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_probe_enter(context: *const ProbeContext, method_id: u64) {
    // SAFETY: the caller's contract.
    if let Some(record) = unsafe { record(context) } {
        // SAFETY: only the owning thread calls probes with its context, and a
        // signal handler never writes the probe ring: one producer.
        unsafe {
            record.probes.push(|r, _| {
                *r = ProbeRecord {
                    kind: ProbeKind::Enter,
                    method_id,
                    value: 0,
                    ticks: ticks(),
                }
            })
        };
    }
}

/// Records `value` for `method_id` (an argument, a field, a branch outcome) in
/// the calling thread's probe ring, with the time.
///
/// # Safety
/// As [`jitmap_probe_enter`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_probe_value(
    context: *const ProbeContext,
    method_id: u64,
    value: u64,
) {
    // SAFETY: the caller's contract.
    if let Some(record) = unsafe { record(context) } {
        // SAFETY: as in `jitmap_probe_enter`.
        unsafe {
            record.probes.push(|r, _| {
                *r = ProbeRecord {
                    kind: ProbeKind::Value,
                    method_id,
                    value,
                    ticks: ticks(),
                }
            })
        };
    }
}

/// Counts one call of the method whose cell this is. Returns 1 for exactly one
/// call, the one that crosses the threshold, and marks the cell for
/// [`CallCounters::take_crossed`]; 0 otherwise (a null cell too).
///
/// Counting is deliberately racy, like the .NET runtime's call counting: two
/// threads may read the same count and lose one call, which only delays the
/// crossing. The crossing itself is reported once, by an atomic flag.
///
/// # Safety
/// `cell` is null or a cell of a live [`CallCounters`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_probe_count(cell: *const CounterCell) -> u32 {
    // SAFETY: the caller's contract.
    let Some(cell) = (unsafe { cell.as_ref() }) else {
        return 0;
    };
    // Relaxed: a racy count (see above); nothing else is published through it.
    let remaining = cell.remaining.load(Ordering::Relaxed);
    if remaining > 1 {
        // Relaxed: as above; a lost update only means one more call to count.
        cell.remaining.store(remaining - 1, Ordering::Relaxed);
        return 0;
    }
    cell.remaining.store(0, Ordering::Relaxed);
    // Relaxed: a fast check; the exchange below decides.
    if cell.state.load(Ordering::Relaxed) != COUNTING {
        return 0;
    }
    // Relaxed: the flag only elects one caller; `pending` publishes the crossing.
    if cell
        .state
        .compare_exchange(COUNTING, QUEUED, Ordering::Relaxed, Ordering::Relaxed)
        .is_err()
    {
        return 0;
    }
    // SAFETY: `pending` points into the table that owns this cell and outlives it.
    let pending = unsafe { &*cell.pending };
    // Release: a consumer that reads the new count (Acquire) also sees QUEUED.
    pending.fetch_add(1, Ordering::Release);
    1
}

const COUNTING: u32 = 0;
const QUEUED: u32 = 1;
const TAKEN: u32 = 2;

/// One method's call counter. JIT code passes its address to
/// [`jitmap_probe_count`]. Cells never move: the table allocates them once.
#[repr(C)]
pub struct CounterCell {
    remaining: AtomicU32,
    state: AtomicU32,
    pending: *const AtomicUsize,
}

/// Call counters for tiered compilation: one [`CounterCell`] per method, a
/// threshold, and the methods that crossed it.
///
/// ```
/// use jitmap::agent::{CallCounters, jitmap_probe_count};
///
/// let counters = CallCounters::new(4, 3)?; // 4 methods, tier up after 3 calls
/// let cell = counters.cell(2).unwrap();    // the address tier-0 code embeds
/// // SAFETY: `cell` belongs to `counters`, which is alive.
/// let crossed: Vec<u32> = (0..5).map(|_| unsafe { jitmap_probe_count(cell) }).collect();
/// assert_eq!(crossed, [0, 0, 1, 0, 0]);
/// assert_eq!(counters.take_crossed(), [2]); // the compiler thread's work list
/// counters.rearm(2, 3)?;                     // count again (for example, to tier 2)
/// # Ok::<(), jitmap::agent::AgentError>(())
/// ```
pub struct CallCounters {
    cells: Box<[CounterCell]>,
    /// Crossings not yet taken (boxed: the cells point at it).
    pending: Box<AtomicUsize>,
    /// Serializes consumers.
    taking: Mutex<()>,
}

// SAFETY: the cells' raw pointer points at `pending`, owned by the same table
// and never moved (boxed); every shared access goes through atomics.
unsafe impl Send for CallCounters {}
// SAFETY: as above.
unsafe impl Sync for CallCounters {}

impl CallCounters {
    /// A table of `methods` cells that cross after `threshold` calls.
    pub fn new(methods: u32, threshold: u32) -> Result<Self, super::AgentError> {
        if methods == 0 || threshold == 0 {
            return Err(super::AgentError::BadCounters { methods, threshold });
        }
        let pending = Box::new(AtomicUsize::new(0));
        let cells = (0..methods)
            .map(|_| CounterCell {
                remaining: AtomicU32::new(threshold),
                state: AtomicU32::new(COUNTING),
                pending: &*pending,
            })
            .collect();
        Ok(Self {
            cells,
            pending,
            taking: Mutex::new(()),
        })
    }

    /// The cell of method `index`, for JIT code to pass to
    /// [`jitmap_probe_count`]; `None` out of range.
    pub fn cell(&self, index: u32) -> Option<*const CounterCell> {
        self.cells
            .get(index as usize)
            .map(|c| c as *const CounterCell)
    }

    /// Calls still to count before method `index` crosses (0 once it has).
    pub fn remaining(&self, index: u32) -> Option<u32> {
        // Relaxed: a snapshot of a racy count.
        self.cells
            .get(index as usize)
            .map(|c| c.remaining.load(Ordering::Relaxed))
    }

    /// The methods that crossed since the last call, by index. For the host's
    /// compiler thread (it may allocate; it is not a probe). Cheap when nothing
    /// crossed: one load.
    pub fn take_crossed(&self) -> Vec<u32> {
        let _one_consumer = self.taking.lock();
        // Acquire: pairs with the probes' Release increments, so every cell they
        // counted is seen QUEUED by the scan.
        let pending = self.pending.load(Ordering::Acquire);
        if pending == 0 {
            return Vec::new();
        }
        let mut crossed = Vec::new();
        for (index, cell) in self.cells.iter().enumerate() {
            // Relaxed: `pending` ordered the QUEUED stores this scan must see; a
            // cell queued later is taken now or by the next call.
            if cell
                .state
                .compare_exchange(QUEUED, TAKEN, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                crossed.push(index as u32);
            }
        }
        // Relaxed: only a count. A probe between its exchange and its increment
        // can make it wrap below zero for a moment, which costs one extra scan.
        self.pending.fetch_sub(crossed.len(), Ordering::Relaxed);
        crossed
    }

    /// Counts method `index` again, crossing after `threshold` more calls. Only
    /// a cell whose crossing was taken can be re-armed.
    pub fn rearm(&self, index: u32, threshold: u32) -> Result<(), super::AgentError> {
        let cell = self
            .cells
            .get(index as usize)
            .ok_or(super::AgentError::NoSuchCounter { index })?;
        if threshold == 0 {
            return Err(super::AgentError::BadCounters {
                methods: self.cells.len() as u32,
                threshold,
            });
        }
        // Relaxed: the state alone decides; the count is racy by design.
        if cell.state.load(Ordering::Relaxed) != TAKEN {
            return Err(super::AgentError::NotCrossed { index });
        }
        // Relaxed: a probe that reads a stale count may cross a few calls early.
        cell.remaining.store(threshold, Ordering::Relaxed);
        // Relaxed: as above; only the state's own value matters.
        cell.state.store(COUNTING, Ordering::Relaxed);
        Ok(())
    }
}
