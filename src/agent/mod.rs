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
//! ```rust,standalone_crate
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
//! nothing but `clock_gettime`, `timer_settime` when it backs its thread off,
//! and `write` to the collector's eventfd when its ring fills to its bell (all
//! async-signal-safe). Names, symbols and aggregation happen later, in
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
//! the method's first instruction or at a `ret`?). A heap sends a method's load
//! event before the method becomes visible, and the collector drains the rings
//! before it waits for the events sent so far; so by the time it names a frame,
//! it has seen the load of the version placed at that start last before the
//! sample, which is the version the handler found. A move's event follows its
//! new copy's visibility by a moment (it carries the old copy's retire tag): a
//! sample that found the new copy first waits for it, a pass or a second, and is
//! never named by a version freed at that start before the sample began. It keeps every version it learns of (and
//! the code already live when it started), and forgets a freed version only
//! after the epoch says that no handler can still be recording it. So a method
//! freed after it was sampled is still named, and a re-jitted method's versions
//! stay apart, even at the same address.
//!
//! # Probes
//!
//! See [`probes`]: a call counter for tiered compilation, an entry probe and a
//! value probe, called by JIT code through an absolute address.

mod attach;
mod collector;
mod config;
pub mod counters;
mod doorbell;
mod error;
#[cfg(feature = "export")]
#[cfg_attr(docsrs, doc(cfg(feature = "export")))]
pub mod export;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod handler;
mod loader;
mod mask;
mod native;
mod pace;
pub mod probes;
mod profile;
mod record;
mod registry;
mod ring;
mod row_index;
mod rule_cache;
#[cfg(feature = "serve")]
#[cfg_attr(docsrs, doc(cfg(feature = "serve")))]
pub mod serve;
mod stack_ends;
mod symbols;
mod timer;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::ExecutionManager;
use crate::events::CodeListener;

use attach::Attachment;
use collector::{Collector, EventListener, EventLog};
use doorbell::Doorbell;
use mask::Blocked;
use native::ModuleSlot;
use record::ThreadRecord;

pub use attach::AttachedThread;
pub use config::{
    AgentConfig, Clock, HANDLER_V1_WORDS, MAX_DEPTH, MAX_HZ, MAX_RING_CAPACITY, MIN_PERIOD, Unwind,
};
pub use error::AgentError;
pub use registry::MAX_ATTACHED;
pub use stack_ends::StackEnds;
pub use symbols::INLINED;

pub use counters::{CallCounters, CounterCell, CounterError, jitmap_probe_count};
pub use probes::{ProbeContext, jitmap_probe_enter, jitmap_probe_value};
pub use profile::{
    Kept, MethodSummary, MethodVersion, ProbeCounts, ProbeEvent, Profile, Sample, SampleFrame,
    Stack, version_labels,
};

/// Hooks for tests of the agent's behaviour under conditions a test cannot
/// make on demand. Not a stable API.
#[doc(hidden)]
pub mod testing {
    /// Makes each of the agent's signal handlers spin for `delay` before it
    /// returns, as a slow handler would (a debug build's, a deep stack's, a
    /// loaded machine's); zero turns it off. Process-wide.
    pub fn slow_handler(delay: std::time::Duration) {
        super::handler::set_delay_for_tests(u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Holds `agent`'s collector until the guard drops: no pass drains a
    /// ring meanwhile (the collector's thread waits at its next pass), so a
    /// test can fill a ring past its capacity. Drop it before stopping the
    /// agent, and call no agent method that collects while it is held.
    pub fn hold_collector(agent: &super::Agent) -> impl Drop + '_ {
        agent.shared.collector.lock()
    }
}

/// Whether an agent is running in this process.
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// Counters of threads that detached and were collected for the last time.
#[derive(Default)]
struct Totals {
    threads: usize,
    taken: u64,
    dropped: u64,
    dropped_periods: u64,
    probe_dropped: u64,
    lookups: u64,
    ends: StackEnds,
    cpu: Duration,
    /// Wall time attached.
    attached: Duration,
    /// The longest period a thread's timer reached, in nanoseconds.
    slowest_period_ns: u64,
    /// Threads whose handler had backed them off when they left.
    backed_off: usize,
}

impl Totals {
    /// Adds a thread's pace as it ends.
    fn add_pace(&mut self, pace: &pace::Pace) {
        self.slowest_period_ns = self.slowest_period_ns.max(pace.longest_ns());
        self.backed_off += usize::from(pace.backed_off());
    }
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
    /// Rung by a ring's producer at its bell, and by `stop`: ends the
    /// collector's wait.
    doorbell: Arc<Doorbell>,
    /// Collection passes made, on any thread.
    passes: AtomicU64,
    /// The CPU time of the passes made on other threads than the
    /// collector's, in ns.
    other_pass_cpu_ns: AtomicU64,
    /// The collector thread's CPU time when its last pass ended, in ns: with
    /// `other_pass_cpu_ns`, what a window's passes cost.
    collector_cpu_ns: AtomicU64,
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
        let started = Instant::now();
        let cpu_began = {
            // The agent's locks are taken with its signal blocked (`mask`).
            let _blocked = Blocked::new(self.config.signal);
            // Collect first: samples that ended before `begin` are drained
            // (or will be counted nowhere), so the window sees only samples
            // that end from now on.
            self.collect();
            let mut collector = self.collector.lock();
            let begin = crate::events::monotonic_ns();
            collector
                .as_mut()
                .ok_or(AgentError::Stopped)?
                .open_window(begin);
            // The passes from here to the window's end are its cost.
            self.passes_cpu_ns(&collector)
        };
        let deadline = started + duration;
        loop {
            let now = Instant::now();
            let stopping = {
                // The lock is taken with the agent's signal blocked (`mask`).
                let _blocked = Blocked::new(self.config.signal);
                *self.stopping.lock()
            };
            if now >= deadline || cancel() || stopping {
                break;
            }
            std::thread::sleep((deadline - now).min(Duration::from_millis(20)));
        }
        let end = crate::events::monotonic_ns();
        let _blocked = Blocked::new(self.config.signal);
        // The passes' cost ends here: the closing pass below is the
        // window's own, one the agent would not make without it.
        let cpu_ended = {
            let mut collector = self.collector.lock();
            if let Some(c) = collector.as_mut() {
                c.end_window(end);
            }
            self.passes_cpu_ns(&collector)
        };
        // Samples taken before `end` are drained by this pass.
        self.collect();
        let mut collector = self.collector.lock();
        collector
            .as_mut()
            .and_then(|c| c.take_window(started.elapsed()))
            .map(|window| Profile {
                clock: self.config.clock,
                collector_cpu: Duration::from_nanos(cpu_ended.saturating_sub(cpu_began)),
                ..window
            })
            .ok_or(AgentError::Stopped)
    }

    /// Stores the calling thread's CPU time as the collector thread's
    /// ([`Shared::passes_cpu_ns`]). Called on the collector's thread with the
    /// collector's lock held.
    fn publish_collector_cpu(&self) {
        if let Some(ns) = record::cpu_clock_ns(libc::CLOCK_THREAD_CPUTIME_ID) {
            // Relaxed: stored under the collector's lock, which a window
            // holds when it reads it: the lock orders the two.
            self.collector_cpu_ns.store(ns, Ordering::Relaxed);
        }
    }

    /// The CPU time of every pass so far, on any thread (the collector
    /// thread's as of its last pass), in ns. The caller holds the
    /// collector's lock (`_collector`), so that no pass is half counted.
    fn passes_cpu_ns(&self, _collector: &Option<Collector>) -> u64 {
        // Relaxed: the collector thread stores its figure under the lock
        // the caller holds; the other passes add theirs (`collect`) before
        // they return, and a window reads after its own pass returned.
        self.collector_cpu_ns
            .load(Ordering::Relaxed)
            .saturating_add(self.other_pass_cpu_ns.load(Ordering::Relaxed))
    }

    /// One collection pass made on a thread other than the collector's (a
    /// window, `take_kept`, `stop`): its CPU time is counted into
    /// [`Profile::collector_cpu`] beside the collector thread's own.
    fn collect(&self) {
        let before = record::cpu_clock_ns(libc::CLOCK_THREAD_CPUTIME_ID);
        self.pass();
        if let (Some(before), Some(after)) =
            (before, record::cpu_clock_ns(libc::CLOCK_THREAD_CPUTIME_ID))
        {
            // Relaxed: a statistic, read after the collector is joined.
            self.other_pass_cpu_ns
                .fetch_add(after.saturating_sub(before), Ordering::Relaxed);
        }
    }

    /// One collection pass; drops the records of threads that have detached.
    /// A caller that may be an attached thread blocks the agent's signal
    /// around it (`mask`); the collector's own thread is never attached.
    fn pass(&self) {
        self.pass_on(false);
    }

    /// [`Shared::pass`]; on the collector's thread (`collector_thread`), it
    /// also publishes the thread's CPU time, under the collector's lock.
    fn pass_on(&self, collector_thread: bool) {
        // Relaxed: a statistic, read after the collector is joined.
        self.passes.fetch_add(1, Ordering::Relaxed);
        let mut guard = self.collector.lock();
        let Some(collector) = guard.as_mut() else {
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
        if collector_thread {
            self.publish_collector_cpu();
        }
        drop(guard);
        let mut threads = self.threads.lock();
        for (a, gone) in list.iter().zip(gone) {
            if gone {
                threads.totals.threads += 1;
                threads.totals.taken += a.record.taken();
                threads.totals.dropped += a.record.samples.dropped();
                threads.totals.dropped_periods += a.record.dropped_periods();
                threads.totals.probe_dropped += a.record.probes.dropped();
                threads.totals.lookups += a.record.lookups();
                threads.totals.ends += a.record.ends();
                threads.totals.cpu += a.cpu.lock().unwrap_or_default();
                threads.totals.attached += a.wall.lock().unwrap_or_default();
                threads.totals.add_pace(&a.record.pace);
                threads.list.retain(|x| !Arc::ptr_eq(x, a));
            }
        }
    }
}

/// The running agent. One per process at a time.
pub struct Agent {
    shared: Arc<Shared>,
    listener: Arc<dyn CodeListener>,
    collector_thread: Option<JoinHandle<Duration>>,
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
        let doorbell = Arc::new(Doorbell::new()?);
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
        let live = manager.live_blocks().into_iter().filter_map(|b| {
            b.info
                .map(|info| (info, b.code.block_id(), b.code.start(), b.code.size()))
        });
        let collector = Collector::new(
            config.keep_samples,
            config.profile_versions,
            live,
            manager.images(),
        );
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
            doorbell,
            passes: AtomicU64::new(0),
            other_pass_cpu_ns: AtomicU64::new(0),
            collector_cpu_ns: AtomicU64::new(0),
            window_busy: AtomicBool::new(false),
            modules: (config.unwind == Unwind::Mixed)
                .then(|| Arc::new(ModuleSlot::loaded(Arc::clone(manager.domain())))),
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
    /// ```rust,standalone_crate
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

    /// Takes the samples and probe records kept so far
    /// ([`AgentConfig::keep_samples`]) after one more collection pass: the
    /// agent forgets them, and [`Agent::stop`]'s profile holds only what
    /// came after the last take. Empty unless samples are kept.
    ///
    /// ```rust,standalone_crate
    /// use jitmap::ExecutionManager;
    /// use jitmap::agent::{Agent, AgentConfig, Clock};
    ///
    /// let manager = ExecutionManager::new(4);
    /// let config = AgentConfig { clock: Clock::Wall, keep_samples: true, ..AgentConfig::default() };
    /// let agent = Agent::start(&manager, config)?;
    /// let attached = agent.attach_current_thread()?;
    /// let mut taken = 0;
    /// while taken < 3 {
    ///     std::hint::black_box((0..10_000u64).sum::<u64>());
    ///     taken += agent.take_kept()?.samples.len();
    /// }
    /// drop(attached);
    /// let profile = agent.stop();
    /// // Each sample is kept once: taken, or in the final profile.
    /// assert!(profile.kept_samples.len() as u64 + taken as u64 <= profile.samples);
    /// # Ok::<(), jitmap::agent::AgentError>(())
    /// ```
    pub fn take_kept(&self) -> Result<Kept, AgentError> {
        let _blocked = Blocked::new(self.shared.config.signal);
        self.shared.collect();
        let mut collector = self.shared.collector.lock();
        Ok(collector.as_mut().ok_or(AgentError::Stopped)?.take_kept())
    }

    /// Starts the pprof endpoint on `address`, which must be a loopback
    /// address (port 0 picks a free one); returns the address it listens on.
    /// See [`serve`] for what it serves. One endpoint per agent; stopping
    /// the agent stops it.
    ///
    /// ```no_run,standalone_crate
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
        let _blocked = Blocked::new(self.shared.config.signal);
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

    /// Connections the pprof endpoint answered 503 and closed unserved:
    /// pushed out of a full waiting list, or accepted only to be closed when
    /// the process had no file descriptor left. 0 when not serving.
    ///
    /// ```rust,standalone_crate
    /// use jitmap::ExecutionManager;
    /// use jitmap::agent::{Agent, AgentConfig};
    ///
    /// let manager = ExecutionManager::new(4);
    /// let agent = Agent::start(&manager, AgentConfig::default())?;
    /// agent.serve("127.0.0.1:0".parse().unwrap())?;
    /// assert_eq!(agent.connections_shed(), 0);
    /// # Ok::<(), jitmap::agent::AgentError>(())
    /// ```
    #[cfg(feature = "serve")]
    #[cfg_attr(docsrs, doc(cfg(feature = "serve")))]
    pub fn connections_shed(&self) -> u64 {
        let _blocked = Blocked::new(self.shared.config.signal);
        self.server.lock().as_ref().map_or(0, serve::Server::shed)
    }

    /// The configuration the agent runs with.
    pub fn config(&self) -> &AgentConfig {
        &self.shared.config
    }

    /// Ring memory each attached thread holds, in bytes.
    pub fn ring_bytes_per_thread(&self) -> usize {
        self.ring_bytes
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
        // The attached threads, copied under the agent's lock into room
        // made before the signal is blocked: called on an attached thread,
        // its own timer must not keep it in its handler while this holds
        // the lock or waits below (`mask`), and nothing is allocated or
        // freed with the signal blocked (as in a handler, which the tests'
        // allocation detector watches for). Dropped after it is unblocked.
        let mut attached: Vec<Arc<Attachment>> = Vec::new();
        {
            let _blocked = loop {
                let blocked = Blocked::new(signal);
                let mut threads = self.shared.threads.lock();
                let count = threads.list.len();
                if count <= attached.capacity() {
                    threads.running = false;
                    attached.extend(threads.list.iter().cloned());
                    break blocked;
                }
                drop(threads);
                drop(blocked);
                attached.reserve(count);
            };
            // Each timer is taken, disarmed and deleted under its
            // attachment's own lock, not the agent's: only that thread's
            // detach contends for it, with the signal blocked on its thread,
            // and it must not drain its pending signals while the timer can
            // still send one. Disarmed first, which ends any storm of signals
            // at once; then no handler may re-arm it (`pace`): SeqCst pairs
            // with the fence of a handler's `registry::enter`, so each
            // handler either sees the withdrawal or is seen in flight, and
            // waited for, before the timer is deleted.
            for a in &attached {
                let mut timer = a.timer.lock();
                let Some(live) = timer.as_ref() else {
                    continue;
                };
                // Disarming cannot fail for a live timer; if it did, the
                // timer stays armed until its deletion just below.
                let _ = live.set(0);
                a.record.pace.withdraw();
                fence(Ordering::SeqCst);
                a.wait_for_handlers();
                drop(timer.take());
            }
        }
        let timers_gone_ns = crate::events::monotonic_ns();
        // With every timer gone, no thread is kept in its handler: a pprof
        // worker waiting on a lock such a thread held can finish, and be
        // joined.
        #[cfg(feature = "serve")]
        if let Some(mut server) = self.server.lock().take() {
            server.stop();
        }
        // No timer is left to send the signal. Setting it to be ignored drops
        // any instance still pending for any thread, so none reaches the
        // previous disposition.
        registry::wait_for_handlers();
        let ignore = libc::sigaction {
            sa_sigaction: libc::SIG_IGN,
            // SAFETY: an all-zero sigaction is valid; the fields used are set.
            ..unsafe { std::mem::zeroed() }
        };
        // SAFETY: `ignore` is a valid disposition for a catchable signal.
        unsafe { libc::sigaction(signal, &ignore, std::ptr::null_mut()) };
        registry::wait_for_handlers();
        restore_handler(signal, &self.previous);
        *self.shared.stopping.lock() = true;
        self.shared.doorbell.ring();
        // The collector loop cannot panic short of a bug; its state is below.
        let collector_thread_cpu = collector_thread.join().unwrap_or_default();
        self.shared.collect();
        self.shared.manager.listeners().remove(&self.listener);
        let collector = self.shared.collector.lock().take();
        let threads = self.shared.threads.lock();
        let period_ns = self.shared.config.interval_ns();
        let mut paces = Totals {
            slowest_period_ns: threads.totals.slowest_period_ns.max(period_ns),
            backed_off: threads.totals.backed_off,
            ..Totals::default()
        };
        let mut base = Profile {
            duration: self.started.elapsed(),
            clock: self.shared.config.clock,
            threads: threads.totals.threads + threads.list.len(),
            ring_bytes_per_thread: self.ring_bytes,
            taken: threads.totals.taken,
            dropped: threads.totals.dropped,
            dropped_periods: threads.totals.dropped_periods,
            lookups: threads.totals.lookups,
            stack_ends: threads.totals.ends,
            cpu: threads.totals.cpu,
            attached: threads.totals.attached,
            // Relaxed: a statistic; every pass has returned (the collector
            // is joined, and the last pass above ran on this thread).
            passes: self.shared.passes.load(Ordering::Relaxed),
            probes: ProbeCounts {
                dropped: threads.totals.probe_dropped,
                ..ProbeCounts::default()
            },
            ..Profile::default()
        };
        for a in &threads.list {
            base.taken += a.record.taken();
            base.dropped += a.record.samples.dropped();
            base.dropped_periods += a.record.dropped_periods();
            base.probes.dropped += a.record.probes.dropped();
            base.lookups += a.record.lookups();
            base.stack_ends += a.record.ends();
            base.cpu += a.cpu.lock().unwrap_or_else(|| a.record.cpu_since_attach());
            // A thread still attached was sampled until its timer went.
            base.attached += a.wall.lock().unwrap_or_else(|| {
                Duration::from_nanos(timers_gone_ns.saturating_sub(a.record.attached_at_ns))
            });
            paces.add_pace(&a.record.pace);
        }
        drop(threads);
        base.period = Duration::from_nanos(period_ns);
        base.slowest_period = Duration::from_nanos(paces.slowest_period_ns);
        base.backed_off = paces.backed_off;
        // Release: this agent's teardown happens before the next start.
        ACTIVE.store(false, Ordering::Release);
        let naming_began = record::cpu_clock_ns(libc::CLOCK_THREAD_CPUTIME_ID);
        let mut profile = collector.map_or(base.clone(), |c| c.finish(base));
        profile.naming_cpu = naming_began
            .zip(record::cpu_clock_ns(libc::CLOCK_THREAD_CPUTIME_ID))
            .map_or(Duration::ZERO, |(began, ended)| {
                Duration::from_nanos(ended.saturating_sub(began))
            });
        // The passes on every thread: the collector thread's CPU (its waits'
        // wake-ups included), and the passes windows, `take_kept` and this
        // stop made elsewhere (Relaxed: those callers have returned).
        let elsewhere_ns = self.shared.other_pass_cpu_ns.load(Ordering::Relaxed);
        profile.collector_cpu =
            collector_thread_cpu.saturating_add(Duration::from_nanos(elsewhere_ns));
        profile
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The collector's thread: a pass every `collect_every`, or sooner when a
/// ring's producer rings the doorbell at its bell ([`doorbell`]), until the
/// agent stops. Returns the CPU time the thread used, the agent's own cost
/// beside its handlers' ([`Profile::collector_cpu`]).
fn collector_loop(shared: &Shared) -> Duration {
    // The shortest time between a pass and the next one a doorbell asks
    // for: tiny rings (a capacity of 1 rings for every record) cost at most
    // a pass a millisecond.
    let least = shared.config.collect_every.min(MIN_RUNG_INTERVAL);
    let mut last = Instant::now();
    // A window opened before the first pass counts from here, not from 0.
    {
        let _collector = shared.collector.lock();
        shared.publish_collector_cpu();
    }
    while !*shared.stopping.lock() {
        if shared.doorbell.wait(shared.config.collect_every) {
            std::thread::sleep(least.saturating_sub(last.elapsed()));
        }
        if *shared.stopping.lock() {
            break;
        }
        last = Instant::now();
        shared.pass_on(true);
    }
    record::cpu_clock_ns(libc::CLOCK_THREAD_CPUTIME_ID).map_or(Duration::ZERO, Duration::from_nanos)
}

/// The least time between two passes when a doorbell asks for the second.
const MIN_RUNG_INTERVAL: Duration = Duration::from_millis(1);

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
