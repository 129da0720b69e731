//! Call counters for tiered compilation: the cells tier-0 code counts its calls
//! in, the probe that counts ([`jitmap_probe_count`]), and the compiler's side
//! ([`CallCounters::take_crossed`], [`CallCounters::rearm`]).
//!
//! Its atomics come from the crate's atomics facade (`sync`), so the loom models in `loom-tests/`
//! check this code itself (it is built under `--cfg loom` on its own, without
//! the rest of the agent).

use std::fmt;

use parking_lot::Mutex;

use crate::sync::{AtomicU32, AtomicUsize, Ordering};

/// A misuse of a [`CallCounters`] table. Converts into
/// [`crate::agent::AgentError`] with `?`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CounterError {
    /// A table needs at least one method and a threshold of 1 or more.
    BadCounters {
        /// Methods asked for.
        methods: u32,
        /// Threshold asked for.
        threshold: u32,
    },
    /// No counter with this index.
    NoSuchCounter {
        /// The index.
        index: u32,
    },
    /// The counter has not crossed, or its crossing was not taken yet.
    NotCrossed {
        /// The index.
        index: u32,
    },
}

impl fmt::Display for CounterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadCounters { methods, threshold } => write!(
                f,
                "a counter table needs methods > 0 and threshold > 0 (got {methods}, {threshold})"
            ),
            Self::NoSuchCounter { index } => write!(f, "no counter {index}"),
            Self::NotCrossed { index } => {
                write!(f, "counter {index} has not crossed, or was not taken yet")
            }
        }
    }
}

impl std::error::Error for CounterError {}

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
    let elected = if crate::sync::defect!(CheckThenSetCrossing) {
        // Relaxed: the seeded defect's racy election (two callers can both win).
        let was = cell.state.load(Ordering::Relaxed);
        // Relaxed: as above.
        cell.state.store(QUEUED, Ordering::Relaxed);
        was == COUNTING
    } else {
        cell.state
            .compare_exchange(COUNTING, QUEUED, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    };
    if !elected {
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
/// # Ok::<(), jitmap::agent::CounterError>(())
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
    pub fn new(methods: u32, threshold: u32) -> Result<Self, CounterError> {
        if methods == 0 || threshold == 0 {
            return Err(CounterError::BadCounters { methods, threshold });
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
    pub fn rearm(&self, index: u32, threshold: u32) -> Result<(), CounterError> {
        let cell = self
            .cells
            .get(index as usize)
            .ok_or(CounterError::NoSuchCounter { index })?;
        if threshold == 0 {
            return Err(CounterError::BadCounters {
                methods: self.cells.len() as u32,
                threshold,
            });
        }
        // Relaxed: the state alone decides; the count is racy by design.
        if cell.state.load(Ordering::Relaxed) != TAKEN {
            return Err(CounterError::NotCrossed { index });
        }
        // Relaxed: a probe that reads a stale count may cross a few calls early.
        cell.remaining.store(threshold, Ordering::Relaxed);
        // Relaxed: as above; only the state's own value matters.
        cell.state.store(COUNTING, Ordering::Relaxed);
        Ok(())
    }
}
