//! How the agent samples: [`AgentConfig`], its limits, the clock and the
//! walk it uses.

use std::time::Duration;

use super::AgentError;

/// The shortest timer period the agent accepts: 100 µs.
///
/// A timer whose period is shorter than signal delivery plus the handler
/// keeps its thread in the handler: the next expiration is pending when the
/// handler returns, and the thread's own code never runs again. On a 2-vCPU
/// VM an empty handler cost about 19 µs of delivery per signal on a 10 µs
/// wall timer. At 100 µs delivery takes a fifth of the thread at worst, and a
/// handler that still falls behind backs its own thread off (see
/// [`AgentConfig::hz`]). async-profiler refuses wall intervals under 100 µs
/// for the same reason.
pub const MIN_PERIOD: Duration = Duration::from_micros(100);
/// Highest sampling frequency accepted: one sample per [`MIN_PERIOD`].
pub const MAX_HZ: u32 = 10_000;
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

/// How the agent samples. Start from [`AgentConfig::default`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgentConfig {
    /// Samples per second per thread, 1 to [`MAX_HZ`] (a period of at least
    /// [`MIN_PERIOD`]). Default 1000.
    ///
    /// This is the rate asked for. A thread whose signals come late backs
    /// off: after two late signals in a row (a walk that took more than a
    /// quarter of the period, or a wall-clock signal with an overrun less
    /// than a period after the thread's previous handler returned), its
    /// handler re-arms the thread's timer at twice the period, up to 1024
    /// times this one; 64 on time in a row halve it again. Its samples weigh
    /// the configured periods they stand for, and
    /// [`super::Profile::slowest_period`] says how far the slowest thread
    /// backed off.
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
    /// The longest the collector waits between passes. Default 250 ms.
    ///
    /// It passes sooner when a thread's sample or probe ring fills to its
    /// bell: the producer rings the collector's doorbell (one `write(2)` to
    /// an eventfd, async-signal-safe), so a ring is drained before it fills
    /// at any rate, as long as the collector gets a CPU in the time the
    /// rest of the ring takes to fill. A probe ring rings at half full; a
    /// sample ring leaves at least 32 ms of samples at `hz` free and at
    /// least a quarter of the ring, ringing between half and three
    /// quarters full (at 1 kHz a ring of 256 rings at 192, 64 ms before it
    /// fills; from 4 kHz at 128). A pass costs a wake-up whatever it
    /// drains (about 75 µs of CPU on a 2-vCPU VM, beside about 0.8 µs a
    /// sample drained), so a long wait makes a cheap agent: with passes
    /// every 20 ms, wake-ups were most of the collector's 6 µs a sample at
    /// 1 kHz, and at 100 ms still about half of its 1.6 µs. The wait
    /// bounds only how long samples sit in the rings
    /// ([`super::Agent::take_kept`],
    /// [`super::Agent::profile_window`] and `stop` make a pass of their
    /// own), and how soon an object loaded by `dlopen` is unwound through:
    /// the collector rebuilds the native tables on its next pass, and until
    /// then a sample in the new object ends at its leaf
    /// (counted in [`super::StackEnds::no_unwind_info`]).
    pub collect_every: Duration,
    /// Keep every sample and probe record in the profile, not only the
    /// aggregates. Default false.
    pub keep_samples: bool,
    /// How the handler walks stacks. Default [`Unwind::Mixed`].
    pub unwind: Unwind,
    /// Method versions the whole-run profile names one by one, at least 2.
    /// Default 16,384. Past it, the collector merges the versions it has
    /// forgotten (freed, and past their grace period), first sampled first,
    /// into one entry per tier ([`super::MethodVersion::merged`]), until
    /// half the cap is used. A runtime that churns code keeps a profile of
    /// bounded size: the live versions, the cap, and their stacks.
    pub profile_versions: usize,
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
            collect_every: Duration::from_millis(250),
            keep_samples: false,
            unwind: Unwind::Mixed,
            profile_versions: 16_384,
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
        if self.profile_versions < 2 {
            return Err(AgentError::ProfileVersionsTooFew {
                versions: self.profile_versions,
            });
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
