//! The in-process agent: a sampling profiler whose signal handler is really
//! async-signal-safe, and probes that JIT code calls directly.
//!
//! # How a host uses it
//!
//! Start one [`Agent`] per process on the [`ExecutionManager`] whose heaps hold
//! the JIT code. Each thread that runs code worth profiling opts in with
//! [`Agent::attach_current_thread`]; a thread that never attached is never
//! signalled. [`Agent::stop`] returns the [`Profile`]: its report, folded
//! stacks and, with the `export` feature, a flamegraph and a pprof file.
//!
//! ```
//! use std::sync::Arc;
//! use jitmap::ExecutionManager;
//! use jitmap::agent::{Agent, AgentConfig, Clock};
//!
//! let manager = ExecutionManager::new(16);
//! let agent = Agent::start(&manager, AgentConfig { hz: 1000, clock: Clock::Cpu, ..AgentConfig::default() })?;
//! let attached = agent.attach_current_thread()?; // on every thread to sample
//! let mut x = 0u64;
//! for i in 0..20_000_000u64 { x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i)); }
//! drop(attached); // detach (on the same thread)
//! let profile = agent.stop();
//! assert_eq!(profile.threads, 1);
//! assert_eq!(profile.samples + profile.dropped, profile.taken);
//! println!("{}", profile.report(10));
//! # Ok::<(), jitmap::agent::AgentError>(())
//! ```
//!
//! # What the handler does, and what it does not
//!
//! Each attached thread gets a POSIX timer (`timer_create` with
//! `SIGEV_THREAD_ID`) on its own CPU clock ([`Clock::Cpu`]) or on the monotonic
//! clock ([`Clock::Wall`]). The timer's `sigev_value` is a salted token, not
//! a pointer: the handler looks it up in the agent's table of attached
//! threads before it reads anything, and so finds the thread's record,
//! allocated when it attached: a registered [`crate::Reader`], a sample
//! ring, a probe ring and the thread's stack bounds. The handler:
//!
//! - saves and restores `errno`;
//! - reads pc, frame pointer and stack pointer from the `ucontext`;
//! - walks the stack up to [`AgentConfig::max_depth`] frames, the way
//!   [`AgentConfig::unwind`] says:
//!   - [`Unwind::Mixed`] (the default) steps every frame with a rule: a JIT
//!     method's own CFI (its [`crate::info::CodeInfo::eh_frame`]), or the
//!     frame-pointer convention for JIT code without one; a native frame
//!     with its object's `.eh_frame`, which the collector evaluated into
//!     sorted rows when the agent started (and again after a `dlopen` or
//!     `dlclose`), published under the manager's grace periods. A native
//!     leaf built without frame pointers keeps its JIT caller, and JIT code
//!     that keeps none is walked by its CFI;
//!   - [`Unwind::FramePointer`] follows saved frame pointers only;
//!
//!   every read is checked first (on the thread's stack, aligned, the stack
//!   pointer strictly rising): a corrupt stack ends the walk, it never
//!   faults, and why each walk ended is counted ([`StackEnds`]). A JIT leaf
//!   caught in its prologue or at its `ret` is handled;
//! - classifies each address under a pinned guard: JIT method (its version and
//!   offset), stub, image method, or native. Return addresses are looked up at
//!   `ra - 1`;
//! - writes one fixed-size record into the thread's ring, or counts a drop.
//!
//! It allocates nothing, takes no lock, uses no thread-local storage and calls
//! nothing but `clock_gettime`. Names, symbols and aggregation happen later, in
//! the collector thread. It names a native frame in an object loaded after
//! the agent started as it drains the rings (so code in an object unloaded
//! later is still named), the others when a profile is named; each with the
//! helpers inlined at its address marked [`INLINED`].
//!
//! # Naming code that is freed and re-jitted
//!
//! The handler records a JIT frame by its start address and the sample's time,
//! never a pointer into its header. To step the frame it reads, under the
//! pinned guard that keeps both mapped, the method's unwind rows in its
//! header (the mixed walk) and, at the leaf, two code bytes (is the pc at
//! the method's first instruction or at a `ret`?). A heap sends a method's load (or move) event before the
//! method becomes visible, and the collector drains the rings before it waits
//! for the events sent so far; so by the time it names a frame, it has seen
//! the load of the version placed at that start last before the sample, which
//! is the version the handler found. It keeps every version it learns of (and
//! the code already live when it started), and forgets a freed version only
//! after the epoch says that no handler can still be recording it. So a method
//! freed after it was sampled is still named, and a re-jitted method's versions
//! stay apart, even at the same address.
//!
//! # Probes
//!
//! See [`probes`]: a call counter for tiered compilation, an entry probe and a
//! value probe, called by JIT code through an absolute address.

mod collector;
pub mod counters;
#[cfg(feature = "export")]
#[cfg_attr(docsrs, doc(cfg(feature = "export")))]
pub mod export;
mod handler;
mod loader;
pub mod probes;
mod profile;
mod record;
mod registry;
mod ring;
#[cfg(feature = "serve")]
#[cfg_attr(docsrs, doc(cfg(feature = "serve")))]
pub mod serve;
mod symbols;
mod timer;
pub(crate) mod unwind;

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::events::CodeListener;
use crate::{EpochError, ExecutionManager};

use collector::{Collector, EventListener, EventLog};
use record::{HandlerReader, RECORD_MAGIC, ThreadRecord};
use ring::Ring;
use timer::Timer;
use unwind::modules::ModuleSlot;

pub use registry::MAX_ATTACHED;
pub use symbols::INLINED;

pub use counters::{CallCounters, CounterCell, CounterError, jitmap_probe_count};
pub use probes::{ProbeContext, jitmap_probe_enter, jitmap_probe_value};
pub use profile::{
    MethodSummary, MethodVersion, ProbeCounts, ProbeEvent, Profile, Sample, SampleFrame, Stack,
    version_labels,
};

/// Highest sampling frequency accepted.
pub const MAX_HZ: u32 = 100_000;
/// Deepest stack walk accepted.
pub const MAX_DEPTH: usize = 256;
/// Start-map words the signal handler reads, at most, to find a frame's start
/// in a version-1 heap (256 words: 64 KiB of code back from the address); a
/// frame deeper in a larger v1 method is recorded as unattributed. v2 heaps
/// need at most two words whatever the method's size.
pub const HANDLER_V1_WORDS: usize = 256;
/// Largest ring accepted, in records.
pub const MAX_RING_CAPACITY: usize = 1 << 20;

/// Which clock drives a thread's sampling timer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Clock {
    /// The thread's own CPU time: samples where it computes.
    #[default]
    Cpu,
    /// Real time: samples where it computes or waits.
    Wall,
}

/// How the handler walks a stack.
///
/// What each costs per sample, measured side by side
/// (`cargo bench --bench agent -- agent/sample`), is in BENCHMARKS.md.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Unwind {
    /// Follow saved frame pointers only. Cheapest, and exact for code that
    /// keeps them; a native function without a frame pointer hides its
    /// caller, and JIT code without one ends or corrupts the stack.
    FramePointer,
    /// Step each frame with a rule: a JIT method's own CFI (its
    /// [`crate::info::CodeInfo::eh_frame`]) or, without one, the
    /// frame-pointer convention; a native frame with its object's
    /// `.eh_frame`, copied by the collector and published under the
    /// manager's grace periods (refreshed after `dlopen`/`dlclose`).
    /// Frames without frame pointers keep their callers.
    #[default]
    Mixed,
}

/// Why the handlers' stack walks ended, counted over a profile. Only
/// `root` is a complete stack; every other end is a stack cut short, and
/// the walk says so here rather than guessing a frame.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackEnds {
    /// The outermost frame was reached (`_start`, a thread's start routine,
    /// or a zero return address).
    pub root: u64,
    /// [`AgentConfig::max_depth`] frames were recorded.
    pub depth_limit: u64,
    /// A native address outside every loaded object's unwind tables (an
    /// object loaded since the collector's last pass, or code with no
    /// `.eh_frame`).
    pub no_unwind_info: u64,
    /// CFI the handler does not evaluate: a CFA computed by a DWARF
    /// expression (signal trampolines), or a frame that needs a frame
    /// pointer whose value an inner frame's CFI lost.
    pub unsupported: u64,
    /// A step would have read off the thread's stack or misaligned, or did
    /// not move towards the stack's base.
    pub bad_stack: u64,
    /// [`Unwind::FramePointer`]: the chain reached a frame pointer it could
    /// not follow (which is also how a complete chain ends).
    pub frame_pointer: u64,
}

impl std::ops::AddAssign for StackEnds {
    fn add_assign(&mut self, other: Self) {
        self.root += other.root;
        self.depth_limit += other.depth_limit;
        self.no_unwind_info += other.no_unwind_info;
        self.unsupported += other.unsupported;
        self.bad_stack += other.bad_stack;
        self.frame_pointer += other.frame_pointer;
    }
}

impl StackEnds {
    /// Walks counted.
    pub fn total(&self) -> u64 {
        self.root
            + self.depth_limit
            + self.no_unwind_info
            + self.unsupported
            + self.bad_stack
            + self.frame_pointer
    }
}

/// How the agent samples. Start from [`AgentConfig::default`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgentConfig {
    /// Samples per second per thread, 1 to [`MAX_HZ`]. Default 1000.
    pub hz: u32,
    /// The timers' clock. Default [`Clock::Cpu`]. The kernel checks CPU-time
    /// timers on its scheduler tick (`CONFIG_HZ`, often 250 or 1000 Hz), so a
    /// `Cpu` rate above the tick rate yields about one sample per tick; `Wall`
    /// timers are high-resolution.
    pub clock: Clock,
    /// Frames per sample, 1 to [`MAX_DEPTH`]. Default 64.
    pub max_depth: usize,
    /// Samples each thread's ring holds between collections, 1 to
    /// [`MAX_RING_CAPACITY`]. Default 256.
    pub ring_capacity: usize,
    /// Probe records each thread's ring holds, 1 to [`MAX_RING_CAPACITY`].
    /// Default 4096.
    pub probe_capacity: usize,
    /// The signal the timers send. Default `SIGPROF`.
    pub signal: i32,
    /// How often the collector drains the rings. Default 20 ms.
    pub collect_every: Duration,
    /// Keep every sample and probe record in the profile, not only the
    /// aggregates. Default false.
    pub keep_samples: bool,
    /// How the handler walks stacks. Default [`Unwind::Mixed`].
    pub unwind: Unwind,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            hz: 1000,
            clock: Clock::Cpu,
            max_depth: 64,
            ring_capacity: 256,
            probe_capacity: 4096,
            signal: libc::SIGPROF,
            collect_every: Duration::from_millis(20),
            keep_samples: false,
            unwind: Unwind::Mixed,
        }
    }
}

impl AgentConfig {
    /// Checks every field.
    pub fn validate(&self) -> Result<(), AgentError> {
        match self.hz {
            0 => return Err(AgentError::ZeroFrequency),
            hz if hz > MAX_HZ => return Err(AgentError::FrequencyTooHigh { hz }),
            _ => {}
        }
        match self.max_depth {
            0 => return Err(AgentError::ZeroDepth),
            depth if depth > MAX_DEPTH => return Err(AgentError::DepthTooLarge { depth }),
            _ => {}
        }
        for capacity in [self.ring_capacity, self.probe_capacity] {
            match capacity {
                0 => return Err(AgentError::ZeroCapacity),
                c if c > MAX_RING_CAPACITY => {
                    return Err(AgentError::CapacityTooLarge { capacity: c });
                }
                _ => {}
            }
        }
        let s = self.signal;
        let synchronous = [
            libc::SIGKILL,
            libc::SIGSTOP,
            libc::SIGSEGV,
            libc::SIGBUS,
            libc::SIGILL,
            libc::SIGFPE,
            libc::SIGTRAP,
        ];
        if s < 1 || s > libc::SIGRTMAX() || synchronous.contains(&s) {
            return Err(AgentError::BadSignal { signal: s });
        }
        if self.collect_every.is_zero() {
            return Err(AgentError::ZeroInterval);
        }
        Ok(())
    }

    /// The timers' period in nanoseconds, from `hz`: what a pprof profile
    /// of these samples gives as its period.
    ///
    /// ```
    /// use jitmap::agent::AgentConfig;
    /// let config = AgentConfig { hz: 250, ..AgentConfig::default() };
    /// assert_eq!(config.interval_ns(), 4_000_000);
    /// ```
    pub fn interval_ns(&self) -> u64 {
        (1_000_000_000 / u64::from(self.hz)).max(1)
    }
}

/// What went wrong in the agent. The agent and its threads are unchanged.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AgentError {
    /// `hz` was 0.
    ZeroFrequency,
    /// `hz` was over [`MAX_HZ`].
    FrequencyTooHigh {
        /// The frequency asked for.
        hz: u32,
    },
    /// `max_depth` was 0.
    ZeroDepth,
    /// `max_depth` was over [`MAX_DEPTH`].
    DepthTooLarge {
        /// The depth asked for.
        depth: usize,
    },
    /// A ring capacity was 0.
    ZeroCapacity,
    /// A ring capacity was over [`MAX_RING_CAPACITY`].
    CapacityTooLarge {
        /// The capacity asked for.
        capacity: usize,
    },
    /// The signal cannot carry samples (out of range, or one the kernel sends
    /// for faults, or one that cannot be caught).
    BadSignal {
        /// The signal asked for.
        signal: i32,
    },
    /// `collect_every` was zero.
    ZeroInterval,
    /// An agent is already running in this process (the signal handler is
    /// process-wide).
    AlreadyRunning,
    /// The agent has stopped: no thread can attach.
    Stopped,
    /// [`MAX_ATTACHED`] threads are attached already, process-wide.
    TooManyThreads,
    /// A window is being profiled already ([`Agent::profile_window`]).
    WindowBusy,
    /// The pprof endpoint could not start (feature `serve`).
    Serve {
        /// Why.
        reason: String,
    },
    /// The pprof endpoint was asked to bind an address that is not
    /// loopback through `Agent::serve`; `Agent::serve_exposed` does that.
    NotLoopback {
        /// The address asked for.
        address: std::net::SocketAddr,
    },
    /// This thread is already attached.
    AlreadyAttached {
        /// Its kernel thread id.
        tid: u32,
    },
    /// A call-counter table was misused.
    Counters(CounterError),
    /// No reader slot for the thread.
    Epoch(EpochError),
    /// A system call failed.
    Os {
        /// Which call.
        call: &'static str,
        /// Its errno.
        errno: i32,
    },
}

impl AgentError {
    fn os(call: &'static str) -> Self {
        Self::Os {
            call,
            errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
        }
    }
}

impl fmt::Display for AgentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ZeroFrequency => write!(f, "the sampling frequency must be at least 1 Hz"),
            Self::FrequencyTooHigh { hz } => {
                write!(f, "{hz} Hz is over the agent's limit of {MAX_HZ} Hz")
            }
            Self::ZeroDepth => write!(f, "the stack depth must be at least 1"),
            Self::DepthTooLarge { depth } => {
                write!(f, "depth {depth} is over the agent's limit of {MAX_DEPTH}")
            }
            Self::ZeroCapacity => write!(f, "a ring must hold at least one record"),
            Self::CapacityTooLarge { capacity } => write!(
                f,
                "a ring of {capacity} records is over the limit of {MAX_RING_CAPACITY}"
            ),
            Self::BadSignal { signal } => write!(f, "signal {signal} cannot carry samples"),
            Self::ZeroInterval => write!(f, "the collection interval must not be zero"),
            Self::AlreadyRunning => write!(f, "an agent is already running in this process"),
            Self::Stopped => write!(f, "the agent has stopped"),
            Self::WindowBusy => write!(f, "a profile window is being taken already"),
            Self::Serve { reason } => write!(f, "the pprof endpoint: {reason}"),
            Self::NotLoopback { address } => write!(
                f,
                "{address} is not a loopback address; exposing profiles to the network must be asked for explicitly"
            ),
            Self::TooManyThreads => {
                write!(f, "{MAX_ATTACHED} threads are attached already")
            }
            Self::AlreadyAttached { tid } => write!(f, "thread {tid} is already attached"),
            Self::Counters(e) => write!(f, "{e}"),
            Self::Epoch(e) => write!(f, "registering the thread's reader: {e}"),
            Self::Os { call, errno } => write!(
                f,
                "{call} failed: {}",
                std::io::Error::from_raw_os_error(*errno)
            ),
        }
    }
}

/// Each wrapper shows its inner error's message, so its source is the inner
/// error's own source: a chain printed whole names each cause once.
impl std::error::Error for AgentError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Counters(e) => e.source(),
            Self::Epoch(e) => e.source(),
            _ => None,
        }
    }
}

impl From<CounterError> for AgentError {
    fn from(e: CounterError) -> Self {
        Self::Counters(e)
    }
}

impl From<EpochError> for AgentError {
    fn from(e: EpochError) -> Self {
        Self::Epoch(e)
    }
}

/// Whether an agent is running in this process.
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// An attached thread's record and its timer.
struct Attachment {
    record: ThreadRecord,
    /// Taken (and so deleted) by whichever of detach and stop comes first.
    timer: Mutex<Option<Timer>>,
    /// Set by the thread's detach, after its last sample and probe record.
    detached: AtomicBool,
    /// The record's entry in the handler's table; taken by detach.
    registration: Mutex<Option<registry::Registration>>,
}

/// Counters of threads that detached and were collected for the last time.
#[derive(Default)]
struct Totals {
    threads: usize,
    taken: u64,
    dropped: u64,
    probe_dropped: u64,
    lookups: u64,
    ends: StackEnds,
}

struct Shared {
    manager: ExecutionManager,
    config: AgentConfig,
    /// Attached threads; also the lock that orders attach against stop.
    threads: Mutex<Threads>,
    collector: Mutex<Option<Collector>>,
    log: Arc<EventLog>,
    /// Set to stop the collector thread.
    stopping: Mutex<bool>,
    wake: Condvar,
    /// Whether a window is being profiled ([`Agent::profile_window`]).
    window_busy: AtomicBool,
    /// The native unwind tables ([`Unwind::Mixed`] only).
    modules: Option<Arc<ModuleSlot>>,
}

struct Threads {
    running: bool,
    list: Vec<Arc<Attachment>>,
    totals: Totals,
}

impl Shared {
    /// The profile of the next `duration` (see [`Agent::profile_window`]);
    /// it ends early, with what it took, when `cancel` says so or the agent
    /// stops.
    fn window(&self, duration: Duration, cancel: &dyn Fn() -> bool) -> Result<Profile, AgentError> {
        // Acquire: the previous window's teardown happens before this one.
        if self
            .window_busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return Err(AgentError::WindowBusy);
        }
        let result = self.window_inner(duration, cancel);
        // Release: pairs with the Acquire above.
        self.window_busy.store(false, Ordering::Release);
        result
    }

    fn window_inner(
        &self,
        duration: Duration,
        cancel: &dyn Fn() -> bool,
    ) -> Result<Profile, AgentError> {
        let begin = crate::events::monotonic_ns();
        let started = Instant::now();
        {
            // Samples already drained ended before `begin`: collect first,
            // so that the window sees only samples that end from now on.
            self.collect();
            let mut collector = self.collector.lock();
            collector
                .as_mut()
                .ok_or(AgentError::Stopped)?
                .open_window(begin);
        }
        let deadline = started + duration;
        loop {
            let now = Instant::now();
            if now >= deadline || cancel() || *self.stopping.lock() {
                break;
            }
            std::thread::sleep((deadline - now).min(Duration::from_millis(20)));
        }
        let end = crate::events::monotonic_ns();
        if let Some(c) = self.collector.lock().as_mut() {
            c.end_window(end);
        }
        // Samples taken before `end` are drained by this pass.
        self.collect();
        let mut collector = self.collector.lock();
        collector
            .as_mut()
            .and_then(|c| c.take_window(started.elapsed()))
            .ok_or(AgentError::Stopped)
    }

    /// One collection pass; drops the records of threads that have detached.
    fn collect(&self) {
        let mut collector = self.collector.lock();
        let Some(collector) = collector.as_mut() else {
            return;
        };
        let list: Vec<Arc<Attachment>> = self.threads.lock().list.clone();
        // Acquire: pairs with detach's Release, so a thread seen detached here
        // has no record left to push after the drain below.
        let gone: Vec<bool> = list
            .iter()
            .map(|a| a.detached.load(Ordering::Acquire))
            .collect();
        // One look at the loader per pass, for the unwind tables and the
        // native names.
        let loader = loader::counts();
        // Under the collector's lock: the module slot has one writer.
        if let Some(modules) = &self.modules {
            modules.refresh(&self.manager, loader);
        }
        let records: Vec<&ThreadRecord> = list.iter().map(|a| &a.record).collect();
        collector.collect(&self.manager, &self.log, &records, loader);
        let mut threads = self.threads.lock();
        for (a, gone) in list.iter().zip(gone) {
            if gone {
                threads.totals.threads += 1;
                threads.totals.taken += a.record.taken();
                threads.totals.dropped += a.record.samples.dropped();
                threads.totals.probe_dropped += a.record.probes.dropped();
                threads.totals.lookups += a.record.lookups();
                threads.totals.ends += a.record.ends();
                threads.list.retain(|x| !Arc::ptr_eq(x, a));
            }
        }
    }
}

/// The running agent. One per process at a time.
pub struct Agent {
    shared: Arc<Shared>,
    listener: Arc<dyn CodeListener>,
    collector_thread: Option<JoinHandle<()>>,
    previous: libc::sigaction,
    started: Instant,
    ring_bytes: usize,
    /// The pprof endpoint, if one was started.
    #[cfg(feature = "serve")]
    server: Mutex<Option<serve::Server>>,
}

impl fmt::Debug for Agent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Agent")
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl Agent {
    /// Installs the signal handler, starts the collector and listens to the
    /// manager's code events. Threads are sampled once they attach.
    pub fn start(manager: &ExecutionManager, config: AgentConfig) -> Result<Self, AgentError> {
        config.validate()?;
        // Acquire: a previous agent's teardown happens before this one starts.
        if ACTIVE
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return Err(AgentError::AlreadyRunning);
        }
        match Self::start_active(manager, config) {
            Ok(agent) => Ok(agent),
            Err(e) => {
                // Release: this failed start's changes are undone before the next.
                ACTIVE.store(false, Ordering::Release);
                Err(e)
            }
        }
    }

    fn start_active(manager: &ExecutionManager, config: AgentConfig) -> Result<Self, AgentError> {
        let log = Arc::new(EventLog::default());
        let listener: Arc<dyn CodeListener> = Arc::new(EventListener {
            log: Arc::clone(&log),
            manager: manager.clone(),
        });
        manager
            .listeners()
            .add(Arc::clone(&listener))
            .map_err(|e| AgentError::Os {
                call: "spawning the event dispatcher",
                errno: e.raw_os_error().unwrap_or(0),
            })?;
        // Code published before the listener was added: known from the start.
        let live = manager
            .live_blocks()
            .into_iter()
            .filter_map(|b| b.info.map(|info| (info, b.code.start(), b.code.size())));
        let collector = Collector::new(config.keep_samples, live);
        let shared = Arc::new(Shared {
            manager: manager.clone(),
            config,
            threads: Mutex::new(Threads {
                running: true,
                list: Vec::new(),
                totals: Totals::default(),
            }),
            collector: Mutex::new(Some(collector)),
            log,
            stopping: Mutex::new(false),
            wake: Condvar::new(),
            window_busy: AtomicBool::new(false),
            modules: (config.unwind == Unwind::Mixed).then(|| Arc::new(ModuleSlot::loaded())),
        });
        let previous = match install_handler(config.signal) {
            Ok(previous) => previous,
            Err(e) => {
                manager.listeners().remove(&listener);
                return Err(e);
            }
        };
        let thread_shared = Arc::clone(&shared);
        let collector_thread = std::thread::Builder::new()
            .name("jitmap-collector".into())
            .spawn(move || collector_loop(&thread_shared));
        let collector_thread = match collector_thread {
            Ok(handle) => handle,
            Err(e) => {
                restore_handler(config.signal, &previous);
                manager.listeners().remove(&listener);
                return Err(AgentError::Os {
                    call: "spawning the collector",
                    errno: e.raw_os_error().unwrap_or(0),
                });
            }
        };
        let ring_bytes = config.ring_capacity
            * (size_of::<record::SampleHeader>()
                + config.max_depth * size_of::<record::RawFrame>())
            + config.probe_capacity * size_of::<record::ProbeRecord>();
        Ok(Self {
            shared,
            listener,
            collector_thread: Some(collector_thread),
            previous,
            started: Instant::now(),
            ring_bytes,
            #[cfg(feature = "serve")]
            server: Mutex::new(None),
        })
    }

    /// The profile of the next `duration` alone, while the agent keeps
    /// running: the samples that end in the window, named as the whole run's
    /// are. One window at a time ([`AgentError::WindowBusy`] otherwise); it
    /// ends early, with what it took, if the agent stops. This is what the
    /// pprof endpoint serves (feature `serve`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use jitmap::ExecutionManager;
    /// use jitmap::agent::{Agent, AgentConfig, Clock};
    ///
    /// let manager = ExecutionManager::new(4);
    /// let agent = Agent::start(&manager, AgentConfig { clock: Clock::Wall, ..AgentConfig::default() })?;
    /// let attached = agent.attach_current_thread()?;
    /// let window = std::thread::scope(|s| {
    ///     let w = s.spawn(|| agent.profile_window(Duration::from_millis(100)));
    ///     let mut x = 0u64;
    ///     while !w.is_finished() {
    ///         x = std::hint::black_box(x.wrapping_add(1));
    ///     }
    ///     w.join().unwrap()
    /// })?;
    /// drop(attached);
    /// assert!(window.samples > 0 && window.duration >= Duration::from_millis(100));
    /// assert!(agent.stop().samples >= window.samples);
    /// # Ok::<(), jitmap::agent::AgentError>(())
    /// ```
    pub fn profile_window(&self, duration: Duration) -> Result<Profile, AgentError> {
        self.shared.window(duration, &|| false)
    }

    /// Starts the pprof endpoint on `address`, which must be a loopback
    /// address (port 0 picks a free one); returns the address it listens on.
    /// See [`serve`] for what it serves. One endpoint per agent; stopping
    /// the agent stops it.
    ///
    /// ```no_run
    /// use jitmap::ExecutionManager;
    /// use jitmap::agent::{Agent, AgentConfig};
    ///
    /// let manager = ExecutionManager::new(4);
    /// let agent = Agent::start(&manager, AgentConfig::default())?;
    /// let address = agent.serve("127.0.0.1:6060".parse().unwrap())?;
    /// println!("go tool pprof http://{address}/debug/pprof/profile?seconds=30");
    /// # Ok::<(), jitmap::agent::AgentError>(())
    /// ```
    #[cfg(feature = "serve")]
    #[cfg_attr(docsrs, doc(cfg(feature = "serve")))]
    pub fn serve(&self, address: std::net::SocketAddr) -> Result<std::net::SocketAddr, AgentError> {
        if !address.ip().is_loopback() {
            return Err(AgentError::NotLoopback { address });
        }
        self.serve_exposed(address)
    }

    /// [`Agent::serve`] on any address. Whoever reaches it can take CPU
    /// profiles of this process, which name its functions and its JIT
    /// methods, and can keep one profile running at a time.
    #[cfg(feature = "serve")]
    #[cfg_attr(docsrs, doc(cfg(feature = "serve")))]
    pub fn serve_exposed(
        &self,
        address: std::net::SocketAddr,
    ) -> Result<std::net::SocketAddr, AgentError> {
        let mut server = self.server.lock();
        if server.is_some() {
            return Err(AgentError::Serve {
                reason: "already serving".into(),
            });
        }
        let started = serve::Server::start(
            Arc::clone(&self.shared),
            address,
            self.shared.config.interval_ns(),
        )?;
        let bound = started.address();
        *server = Some(started);
        Ok(bound)
    }

    /// The configuration the agent runs with.
    pub fn config(&self) -> &AgentConfig {
        &self.shared.config
    }

    /// Ring memory each attached thread holds, in bytes.
    pub fn ring_bytes_per_thread(&self) -> usize {
        self.ring_bytes
    }

    /// Starts sampling the calling thread: allocates its record, registers its
    /// reader and arms its timer. Call it outside signal handlers; drop the
    /// handle on the same thread to detach.
    pub fn attach_current_thread(&self) -> Result<AttachedThread, AgentError> {
        let config = &self.shared.config;
        let tid = crate::events::current_tid();
        let mut threads = self.shared.threads.lock();
        if !threads.running {
            return Err(AgentError::Stopped);
        }
        if threads
            .list
            .iter()
            // Acquire: as in `Shared::collect`.
            .any(|a| a.record.tid == tid && !a.detached.load(Ordering::Acquire))
        {
            return Err(AgentError::AlreadyAttached { tid });
        }
        let (stack_lo, stack_hi) = record::current_stack().map_err(|e| AgentError::Os {
            call: "pthread_getattr_np",
            errno: e.raw_os_error().unwrap_or(0),
        })?;
        let reader = self.shared.manager.register_reader()?;
        let attachment = Arc::new(Attachment {
            record: ThreadRecord {
                magic: RECORD_MAGIC,
                tid,
                manager: self.shared.manager.clone(),
                reader: HandlerReader(reader),
                stack_lo,
                stack_hi,
                samples: Ring::new(config.ring_capacity, config.max_depth),
                probes: Ring::new(config.probe_capacity, 0),
                taken: Default::default(),
                lookups: Default::default(),
                busy: Default::default(),
                modules: self.shared.modules.clone(),
                ends: Default::default(),
            },
            timer: Mutex::new(None),
            detached: AtomicBool::new(false),
            registration: Mutex::new(None),
        });
        let registration =
            registry::register(&attachment.record).ok_or(AgentError::TooManyThreads)?;
        // The timer carries the record's token, never its address: the handler
        // checks a signal's value against the table before it reads anything.
        let value = std::ptr::without_provenance::<libc::c_void>(registration.token() as usize);
        *attachment.registration.lock() = Some(registration);
        let armed = Timer::create(config.clock, config.signal, value, tid)
            .and_then(|timer| timer.set(config.interval_ns()).map(|()| timer));
        let timer = match armed {
            Ok(timer) => timer,
            Err(e) => {
                if let Some(registration) = attachment.registration.lock().take() {
                    registry::unregister(registration);
                }
                return Err(e);
            }
        };
        *attachment.timer.lock() = Some(timer);
        threads.list.push(Arc::clone(&attachment));
        Ok(AttachedThread {
            attachment,
            signal: config.signal,
            _not_send: PhantomData,
        })
    }

    /// Stops sampling and returns the profile: disarms every timer, waits for
    /// handlers in flight, restores the signal's previous disposition, drains
    /// the rings a last time and names everything.
    pub fn stop(mut self) -> Profile {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Profile {
        let Some(collector_thread) = self.collector_thread.take() else {
            return Profile::default();
        };
        let signal = self.shared.config.signal;
        #[cfg(feature = "serve")]
        if let Some(mut server) = self.server.lock().take() {
            server.stop();
        }
        {
            let mut threads = self.shared.threads.lock();
            threads.running = false;
            for a in &threads.list {
                drop(a.timer.lock().take());
            }
        }
        // No timer is left to send the signal. Setting it to be ignored drops
        // any instance still pending for any thread, so none reaches the
        // previous disposition.
        handler::wait_for_handlers();
        let ignore = libc::sigaction {
            sa_sigaction: libc::SIG_IGN,
            // SAFETY: an all-zero sigaction is valid; the fields used are set.
            ..unsafe { std::mem::zeroed() }
        };
        // SAFETY: `ignore` is a valid disposition for a catchable signal.
        unsafe { libc::sigaction(signal, &ignore, std::ptr::null_mut()) };
        handler::wait_for_handlers();
        restore_handler(signal, &self.previous);
        *self.shared.stopping.lock() = true;
        self.shared.wake.notify_all();
        // The collector loop cannot panic short of a bug; its state is below.
        let _ = collector_thread.join();
        self.shared.collect();
        self.shared.manager.listeners().remove(&self.listener);
        let collector = self.shared.collector.lock().take();
        let threads = self.shared.threads.lock();
        let mut base = Profile {
            duration: self.started.elapsed(),
            threads: threads.totals.threads + threads.list.len(),
            ring_bytes_per_thread: self.ring_bytes,
            taken: threads.totals.taken,
            dropped: threads.totals.dropped,
            lookups: threads.totals.lookups,
            stack_ends: threads.totals.ends,
            probes: ProbeCounts {
                dropped: threads.totals.probe_dropped,
                ..ProbeCounts::default()
            },
            ..Profile::default()
        };
        for a in &threads.list {
            base.taken += a.record.taken();
            base.dropped += a.record.samples.dropped();
            base.probes.dropped += a.record.probes.dropped();
            base.lookups += a.record.lookups();
            base.stack_ends += a.record.ends();
        }
        drop(threads);
        // Release: this agent's teardown happens before the next start.
        ACTIVE.store(false, Ordering::Release);
        collector.map_or(base.clone(), |c| c.finish(base))
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn collector_loop(shared: &Shared) {
    loop {
        {
            let mut stopping = shared.stopping.lock();
            if !*stopping {
                shared
                    .wake
                    .wait_for(&mut stopping, shared.config.collect_every);
            }
            if *stopping {
                return;
            }
        }
        shared.collect();
    }
}

fn install_handler(signal: i32) -> Result<libc::sigaction, AgentError> {
    // SAFETY: an all-zero sigaction is valid; the fields used are set below.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = handler::on_signal as *const () as libc::sighandler_t;
    action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
    // SAFETY: `sa_mask` is valid storage.
    unsafe { libc::sigemptyset(&mut action.sa_mask) };
    // SAFETY: as above.
    let mut previous: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: `action` is a valid disposition whose handler is async-signal-safe;
    // `previous` is writable.
    if unsafe { libc::sigaction(signal, std::ptr::null(), &mut previous) } != 0 {
        return Err(AgentError::os("sigaction"));
    }
    handler::set_previous(&previous);
    // SAFETY: as above.
    if unsafe { libc::sigaction(signal, &action, std::ptr::null_mut()) } != 0 {
        return Err(AgentError::os("sigaction"));
    }
    Ok(previous)
}

fn restore_handler(signal: i32, previous: &libc::sigaction) {
    // SAFETY: `previous` is the disposition `sigaction` returned for this signal.
    unsafe { libc::sigaction(signal, previous, std::ptr::null_mut()) };
}

/// A thread's attachment to the agent; dropping it (on the same thread)
/// detaches the thread. Not `Send`.
pub struct AttachedThread {
    attachment: Arc<Attachment>,
    signal: i32,
    _not_send: PhantomData<*const ()>,
}

impl fmt::Debug for AttachedThread {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttachedThread")
            .field("tid", &self.attachment.record.tid)
            .finish_non_exhaustive()
    }
}

impl AttachedThread {
    /// The context this thread's JIT code passes to [`jitmap_probe_enter`] and
    /// [`jitmap_probe_value`]; valid until this handle drops.
    pub fn probe_context(&self) -> *const ProbeContext {
        (&self.attachment.record as *const ThreadRecord).cast()
    }

    /// The thread's kernel id.
    pub fn tid(&self) -> u32 {
        self.attachment.record.tid
    }

    /// Samples and probe records in this thread's rings that the collector
    /// has not taken yet: a backlog near the ring capacities means drops.
    pub fn backlog(&self) -> (usize, usize) {
        let record = &self.attachment.record;
        (record.samples.len(), record.probes.len())
    }

    /// Records a sample of this thread's stack now, through the same code as
    /// the signal handler (so it is as cheap, and as safe, in any context,
    /// a signal handler included): for a host that samples on its own
    /// events, such as allocations or lock waits. A `sample_now` that
    /// interrupts another sample of this thread (the agent's handler, or a
    /// `sample_now` in a handler of another signal) is counted as dropped,
    /// never written into the slot the interrupted one is filling. Frame 0 is inside this function; with the mixed unwinder every
    /// caller follows by its CFI, while the frame-pointer walk continues from
    /// the frame pointer it was called with, so a caller that keeps no frame
    /// pointer of its own is skipped there.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use jitmap::{ExecutionManager, agent::{Agent, AgentConfig}};
    /// # let manager = ExecutionManager::new(4);
    /// let agent = Agent::start(&manager, AgentConfig { hz: 1, ..AgentConfig::default() })?;
    /// let attached = agent.attach_current_thread()?;
    /// attached.sample_now();
    /// drop(attached);
    /// let profile = agent.stop();
    /// assert!(profile.samples >= 1);
    /// # Ok::<(), jitmap::agent::AgentError>(())
    /// ```
    pub fn sample_now(&self) {
        handler::sample_synchronously(&self.attachment.record);
    }
}

impl Drop for AttachedThread {
    fn drop(&mut self) {
        // Block the signal, delete the timer, then take any instance it already
        // queued for this thread: after that, nothing can deliver a signal that
        // points at this record. Instances that are not the timer's go back to
        // the thread.
        // SAFETY: sigset_t is plain storage, initialized by sigemptyset.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` and `old` are valid sigsets; the signal was validated.
        unsafe {
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, self.signal);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        }
        drop(self.attachment.timer.lock().take());
        let token = self
            .attachment
            .registration
            .lock()
            .as_ref()
            .map(registry::Registration::token);
        let none = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // The host's own instances of the signal (its timers, `kill`) are
        // taken too: they go back to it below, not into the void.
        let mut host = Vec::new();
        loop {
            // SAFETY: siginfo_t is plain storage, filled by sigtimedwait.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: valid set, info and timeout.
            if unsafe { libc::sigtimedwait(&set, &mut info, &none) } != self.signal {
                break;
            }
            // SAFETY: the union's value is what the sender put there (any
            // bit pattern is a valid pointer-sized integer).
            let value = unsafe { info.si_value().sival_ptr } as u64;
            if !(info.si_code == libc::SI_TIMER && Some(value) == token) {
                host.push(info);
            }
        }
        // No signal of this thread's timer is left: take the record out of the
        // handler's table (which waits out any handler that found it).
        if let Some(registration) = self.attachment.registration.lock().take() {
            registry::unregister(registration);
        }
        for info in &host {
            // Queued again to this thread with its own siginfo (a process may
            // queue any siginfo to itself), while the signal is still blocked:
            // it is delivered when the mask is restored, to the handler that
            // is installed then, which passes it to the host's.
            // SAFETY: `info` is a complete siginfo_t; the call reads it.
            unsafe {
                libc::syscall(
                    libc::SYS_rt_tgsigqueueinfo,
                    libc::getpid(),
                    self.attachment.record.tid as libc::pid_t,
                    self.signal,
                    std::ptr::from_ref(info),
                )
            };
        }
        // SAFETY: restores the mask saved above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
        // Release: the thread's last samples and probe records happen before a
        // collector that sees the flag drains its rings for the last time.
        self.attachment.detached.store(true, Ordering::Release);
    }
}
