//! The profile the collector builds: stacks with counts, the method versions
//! they name, and the counters. Also its text report and folded stacks.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Duration;

use crate::JitKind;

use super::StackEnds;

/// One version of a JIT method that appears in the profile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MethodVersion {
    /// The runtime's method id.
    pub method_id: u64,
    /// The name it was published with.
    pub name: String,
    /// The name used in stacks: the name, or, when several versions of one name
    /// were sampled, the name and its version number (`f [v2]`).
    pub label: String,
    /// The tier that produced it.
    pub kind: JitKind,
    /// Where it was when it was published (it may have moved since).
    pub start: usize,
    /// Whether it was freed while the agent ran.
    pub freed: bool,
    /// How many versions this entry stands for: 0 for one version;
    /// otherwise it is the entry of its tier into which the collector
    /// merged retired versions past [`super::AgentConfig::profile_versions`]
    /// (named `[retired <tier> versions]`, with `method_id` and `start` 0).
    pub merged: u64,
}

/// Labels for method versions named `names`, in order: a name's first
/// version keeps it, later ones get `name [v2]`, `name [v3]`, ... so that
/// stacks tell versions of one method apart.
///
/// ```
/// use jitmap::agent::version_labels;
/// assert_eq!(version_labels(["f", "g", "f"]), ["f", "g", "f [v2]"]);
/// ```
pub fn version_labels<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    names
        .into_iter()
        .map(|name| {
            let n = seen.entry(name).or_default();
            *n += 1;
            if *n > 1 {
                format!("{name} [v{n}]")
            } else {
                name.to_owned()
            }
        })
        .collect()
}

/// One frame of a kept sample ([`super::AgentConfig::keep_samples`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleFrame {
    /// A JIT method version: an index into [`Profile::methods`].
    Jit {
        /// The pc or return address.
        addr: usize,
        /// Index into [`Profile::methods`].
        method: usize,
        /// Offset of the looked-up address in the method.
        offset: u32,
    },
    /// A method of a precompiled image.
    Image {
        /// The pc or return address.
        addr: usize,
        /// Its method id.
        method_id: u64,
        /// Offset in the method.
        offset: u32,
    },
    /// A stub block.
    Stub {
        /// The pc or return address.
        addr: usize,
        /// Its kind.
        kind: u8,
    },
    /// Native code (outside every heap and image).
    Native {
        /// The pc or return address.
        addr: usize,
    },
    /// Inside a heap or image but in no method or stub.
    Unattributed {
        /// The pc or return address.
        addr: usize,
    },
}

/// One sample, kept whole ([`super::AgentConfig::keep_samples`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    /// Kernel thread id of the sampled thread.
    pub tid: u32,
    /// CLOCK_MONOTONIC ns when the handler started walking.
    pub begin_ns: u64,
    /// CLOCK_MONOTONIC ns after its last lookup.
    pub end_ns: u64,
    /// The timer expirations it stands for: 1 plus the signal's overrun.
    pub weight: u32,
    /// Frames, innermost first.
    pub frames: Vec<SampleFrame>,
}

/// One probe record, kept whole ([`super::AgentConfig::keep_samples`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeEvent {
    /// Kernel thread id of the calling thread.
    pub tid: u32,
    /// CLOCK_MONOTONIC ns, converted from the CPU's cycle counter.
    pub time_ns: u64,
    /// The method id the JIT code passed.
    pub method_id: u64,
    /// The value, for [`super::jitmap_probe_value`]; `None` for an entry.
    pub value: Option<u64>,
}

/// The samples and probe records kept since the last take
/// ([`super::Agent::take_kept`]), with the method versions their frames
/// index. A run that keeps samples for hours takes them now and then, so
/// that the agent holds only what came since.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Kept {
    /// The samples, in the order they were drained.
    pub samples: Vec<Sample>,
    /// The probe records, in the order they were drained.
    pub probes: Vec<ProbeEvent>,
    /// The versions [`SampleFrame::Jit`] frames of `samples` name, by index.
    pub methods: std::collections::BTreeMap<usize, MethodVersion>,
}

impl Kept {
    /// The version a [`SampleFrame::Jit`] frame's `method` names. Its
    /// `label` is its name: labels are given when the profile ends.
    pub fn method(&self, index: usize) -> Option<&MethodVersion> {
        self.methods.get(&index)
    }
}

/// What the probes recorded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProbeCounts {
    /// [`super::jitmap_probe_enter`] records.
    pub enters: u64,
    /// [`super::jitmap_probe_value`] records.
    pub values: u64,
    /// Records dropped because a thread's probe ring was full.
    pub dropped: u64,
}

/// A distinct stack and how many samples had it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stack {
    /// Frame names, innermost first.
    pub frames: Vec<String>,
    /// The timer periods its samples stand for: each sample counts 1 plus
    /// its signal's overrun.
    pub count: u64,
}

impl Stack {
    /// Distinct stacks with their counts, most samples first (then by frames):
    /// the order of [`Profile::stacks`].
    ///
    /// ```
    /// use jitmap::agent::Stack;
    /// let stacks = Stack::ranked([(vec!["a".to_string()], 1), (vec!["b".to_string()], 2)]);
    /// assert_eq!(stacks[0], Stack { frames: vec!["b".into()], count: 2 });
    /// ```
    pub fn ranked(counts: impl IntoIterator<Item = (Vec<String>, u64)>) -> Vec<Stack> {
        let mut stacks: Vec<Stack> = counts
            .into_iter()
            .map(|(frames, count)| Stack { frames, count })
            .collect();
        stacks.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.frames.cmp(&b.frames)));
        stacks
    }
}

/// A name's samples: as the innermost frame (self) and anywhere (total).
#[derive(Clone, Debug, PartialEq)]
pub struct MethodSummary {
    /// The frame name.
    pub name: String,
    /// Samples with it innermost.
    pub self_samples: u64,
    /// Samples with it anywhere in the stack.
    pub total_samples: u64,
    /// `self_samples` over all samples.
    pub self_share: f64,
    /// `total_samples` over all samples.
    pub total_share: f64,
}

/// A finished profile, from [`super::Agent::stop`].
#[derive(Clone, Debug, Default)]
pub struct Profile {
    /// How long the agent ran.
    pub duration: Duration,
    /// Signals the handlers ran for.
    pub taken: u64,
    /// Samples in the profile (signals whose walk was recorded).
    pub samples: u64,
    /// The timer expirations those samples stand for: each sample counts 1
    /// plus its signal's overrun, the expirations the kernel coalesced into
    /// it while it was pending (a thread waiting for a CPU under the wall
    /// clock; a CPU timer faster than the scheduler's tick). The stacks'
    /// counts add up to this; 0 in a profile built by hand, whose counts
    /// are its samples. The dropped samples' periods are not in it (they
    /// have no stack): see [`Profile::dropped_periods`].
    pub periods: u64,
    /// The clock the timers ran on: what a period measures (CPU or wall
    /// time), and so the pprof's sample type.
    pub clock: super::Clock,
    /// Samples lost: a full ring, or a handler that could not pin.
    pub dropped: u64,
    /// The timer expirations the dropped samples stood for, each 1 plus its
    /// signal's overrun as in [`Profile::periods`]: `periods +
    /// dropped_periods` is all the time the timers sampled, which under
    /// load, when signals coalesce and rings fill, `dropped` (signals)
    /// would undercount.
    pub dropped_periods: u64,
    /// Samples whose pc was in a heap or image but in no method or stub.
    pub unattributed: u64,
    /// Samples that gave up waiting for a JIT version the collector never
    /// heard of: a frame named a version whose event had not come two
    /// collection passes and a second after the sample. That frame counts
    /// as `[unattributed]` (and the sample in [`Profile::unattributed`] when
    /// it is the leaf) rather than the sample waiting for good. Samples
    /// still waiting when the agent stopped count here too (all their
    /// frames `[unattributed]`).
    pub gave_up: u64,
    /// Lookups the handlers made (one per frame).
    pub lookups: u64,
    /// Why the stack walks ended: each walk counts the periods its sample
    /// stands for (1 + its signal's overrun), as [`Stack::count`] does.
    pub stack_ends: StackEnds,
    /// Threads that were attached.
    pub threads: usize,
    /// CPU time the attached threads used while attached: what CPU-clock
    /// timers ([`super::Clock::Cpu`]) sample, so that a profile with fewer
    /// samples than its duration suggests explains itself (a loaded
    /// machine gives its threads less CPU).
    pub cpu: Duration,
    /// Wall time the threads were attached, summed over them: what
    /// wall-clock timers ([`super::Clock::Wall`]) sample.
    pub attached: Duration,
    /// CPU time the collection passes used, on every thread: the collector
    /// thread's (its passes and their wake-ups), and the passes windows,
    /// [`super::Agent::take_kept`] and `stop` made. In a window's profile,
    /// the passes' CPU while the window was open (the collector thread's
    /// as of its last pass; not the window's own closing pass): the agent's
    /// collection cost in steady state, without its start and its stop. With
    /// [`Profile::handler_time`], what the agent costs the process while it
    /// samples; divided by [`Profile::samples`], its cost a sample.
    pub collector_cpu: Duration,
    /// CPU time `stop` spent naming the profile: the native frames of the
    /// objects loaded before the agent started are symbolized only then,
    /// from their debug info (addr2line), which makes most of `stop`'s
    /// cost, once per profile (zero in a window's profile).
    pub naming_cpu: Duration,
    /// Collection passes made (zero in a window's profile): one per
    /// [`super::AgentConfig::collect_every`], one per ring that filled to
    /// its bell (at most one a millisecond), and one per window, take and
    /// stop.
    pub passes: u64,
    /// The time the agent's handlers spent on the samples kept, on the
    /// monotonic clock: from each handler's entry to the end of its walk
    /// (in a window's profile, on the window's samples). The kernel's
    /// delivery of the signal is not in it, nor the handler's last steps
    /// (its timer's pacing, the doorbell), nor the handlers of dropped
    /// samples; a handler preempted mid-walk counts its wait.
    pub handler_time: Duration,
    /// Ring memory per attached thread, in bytes (samples and probes).
    pub ring_bytes_per_thread: usize,
    /// The timers' configured period ([`super::AgentConfig::interval_ns`]);
    /// zero in a profile built by hand or a window's.
    pub period: Duration,
    /// The longest period any thread's timer reached: [`Profile::period`]
    /// unless its signals came late (a handler that could not keep up, or a
    /// thread waiting for a CPU under the wall clock) and its handler backed
    /// it off (see [`super::AgentConfig::hz`]). The stacks count configured
    /// periods either way; [`Profile::coalesced`] counts the periods a
    /// backed-off signal stands for beyond its one.
    pub slowest_period: Duration,
    /// Threads whose handler backed them off at some point.
    pub backed_off: usize,
    /// Distinct stacks, most samples first.
    pub stacks: Vec<Stack>,
    /// The JIT method versions the stacks name.
    pub methods: Vec<MethodVersion>,
    /// Probe counts.
    pub probes: ProbeCounts,
    /// Every sample, if kept.
    pub kept_samples: Vec<Sample>,
    /// Every probe record, if kept.
    pub kept_probes: Vec<ProbeEvent>,
}

impl Profile {
    /// What the stacks' counts add up to: the periods (the samples in a
    /// profile built by hand, which has none).
    pub fn counted(&self) -> u64 {
        if self.periods == 0 {
            self.samples
        } else {
            self.periods
        }
    }

    /// How many of the counted periods came from coalesced signals: each
    /// sample's overrun, summed.
    pub fn coalesced(&self) -> u64 {
        self.counted().saturating_sub(self.samples)
    }

    /// Self and total samples of every frame name, most self samples first
    /// (then most total samples, then by name).
    pub fn summary(&self) -> Vec<MethodSummary> {
        let mut by_name: HashMap<&str, (u64, u64)> = HashMap::new();
        for stack in &self.stacks {
            if let Some(leaf) = stack.frames.first() {
                by_name.entry(leaf).or_default().0 += stack.count;
            }
            let mut seen: Vec<&str> = Vec::with_capacity(stack.frames.len());
            for frame in &stack.frames {
                if !seen.contains(&frame.as_str()) {
                    seen.push(frame);
                    by_name.entry(frame).or_default().1 += stack.count;
                }
            }
        }
        let all = self.counted().max(1) as f64;
        let mut summary: Vec<_> = by_name
            .into_iter()
            .map(|(name, (own, total))| MethodSummary {
                name: name.to_owned(),
                self_samples: own,
                total_samples: total,
                self_share: own as f64 / all,
                total_share: total as f64 / all,
            })
            .collect();
        summary.sort_by(|a, b| {
            (b.self_samples, b.total_samples)
                .cmp(&(a.self_samples, a.total_samples))
                .then_with(|| a.name.cmp(&b.name))
        });
        summary
    }

    /// Folded stacks: one line per stack, outermost frame first, frames joined
    /// by `;`, then a space and the count (the input of flamegraph tools).
    ///
    /// ```
    /// use jitmap::agent::{Profile, Stack};
    /// let profile = Profile {
    ///     samples: 3,
    ///     stacks: vec![
    ///         Stack { frames: vec!["leaf".into(), "main".into()], count: 2 },
    ///         Stack { frames: vec!["main".into()], count: 1 },
    ///     ],
    ///     ..Profile::default()
    /// };
    /// assert_eq!(profile.folded(), "main;leaf 2\nmain 1\n");
    /// ```
    pub fn folded(&self) -> String {
        let mut out = String::new();
        for stack in &self.stacks {
            let names: Vec<String> = stack
                .frames
                .iter()
                .rev()
                .map(|f| f.replace(';', ":"))
                .collect();
            let _ = writeln!(out, "{} {}", names.join(";"), stack.count);
        }
        out
    }

    /// The report's rate line: the rate asked for; the slowest a thread's
    /// handler backed off to, if one did; otherwise, if signals came at
    /// under three quarters of it, the rate they came at and why. `None`
    /// without a period.
    ///
    /// A CPU-time timer fires at most once per scheduler tick (250 Hz on
    /// many kernels), so at 1 kHz on [`super::Clock::Cpu`] each signal
    /// stands for about four periods (its overrun): the profile counts
    /// them all, but its stacks come from a quarter as many walks.
    ///
    /// ```
    /// use std::time::Duration;
    /// use jitmap::agent::{Clock, Profile};
    /// let profile = Profile {
    ///     period: Duration::from_micros(100),
    ///     slowest_period: Duration::from_micros(800),
    ///     backed_off: 1,
    ///     threads: 2,
    ///     ..Profile::default()
    /// };
    /// assert_eq!(
    ///     profile.rate_line().unwrap(),
    ///     "rate: 10000 Hz asked; 1 of 2 thread(s) backed off, the slowest to 1250 Hz \
    ///      (its signals came late: a slow handler, or a busy CPU)\n"
    /// );
    /// let tick = Profile {
    ///     period: Duration::from_millis(1),
    ///     slowest_period: Duration::from_millis(1),
    ///     clock: Clock::Cpu,
    ///     samples: 500,
    ///     periods: 2000,
    ///     cpu: Duration::from_secs(2),
    ///     threads: 1,
    ///     ..Profile::default()
    /// };
    /// assert_eq!(
    ///     tick.rate_line().unwrap(),
    ///     "rate: 1000 Hz asked; signals came at 250 Hz of CPU time, each standing for \
    ///      4.0 periods on average (a CPU-time timer fires at most once per scheduler tick)\n"
    /// );
    /// ```
    pub fn rate_line(&self) -> Option<String> {
        let hz = |d: Duration| 1.0 / d.as_secs_f64().max(1e-9);
        if self.period.is_zero() {
            return None;
        }
        let asked = hz(self.period);
        if self.backed_off > 0 {
            return Some(format!(
                "rate: {asked:.0} Hz asked; {} of {} thread(s) backed off, the slowest to {:.0} Hz \
                 (its signals came late: a slow handler, or a busy CPU)\n",
                self.backed_off,
                self.threads,
                hz(self.slowest_period)
            ));
        }
        // The time the timers measured: the threads' CPU time, or their
        // wall time while attached (for a profile that does not say, the
        // run's, for each thread).
        let measured = match self.clock {
            super::Clock::Cpu => self.cpu.as_secs_f64(),
            super::Clock::Wall if !self.attached.is_zero() => self.attached.as_secs_f64(),
            super::Clock::Wall => self.duration.as_secs_f64() * self.threads as f64,
        };
        let signals = (self.samples + self.dropped) as f64;
        let came = signals / measured;
        if measured <= 0.0 || signals == 0.0 || came * 4.0 >= asked * 3.0 {
            return Some(format!("rate: {asked:.0} Hz asked, and kept\n"));
        }
        let (time, why) = match self.clock {
            super::Clock::Cpu => (
                "CPU time",
                "a CPU-time timer fires at most once per scheduler tick",
            ),
            super::Clock::Wall => (
                "attached time",
                "the threads waited for a CPU, or blocked the signal",
            ),
        };
        let each = (self.counted() + self.dropped_periods) as f64 / signals;
        Some(format!(
            "rate: {asked:.0} Hz asked; signals came at {came:.0} Hz of {time}, each standing for \
             {each:.1} periods on average ({why})\n"
        ))
    }

    /// The agent's own CPU time, a line of the report: its handlers' and
    /// its collector's, in all and a sample. `None` when neither was
    /// measured (one built by hand). A profile with no passes counted is a
    /// window's ([`super::Agent::profile_window`]): its line says what the
    /// agent cost while the window was open.
    ///
    /// ```
    /// use std::time::Duration;
    /// use jitmap::agent::Profile;
    ///
    /// let profile = Profile {
    ///     samples: 1000,
    ///     handler_time: Duration::from_micros(500),
    ///     collector_cpu: Duration::from_micros(1500),
    ///     passes: 12,
    ///     ..Profile::default()
    /// };
    /// assert_eq!(
    ///     profile.agent_cpu_line().unwrap(),
    ///     "agent cpu: 0.5 ms in the handlers and 1.5 ms in the collector's 12 passes: \
    ///      2.00 µs a sample; 0.0 ms naming the profile at stop\n"
    /// );
    /// assert_eq!(Profile::default().agent_cpu_line(), None);
    /// // A window's profile counts no passes of its own, and names nothing
    /// // at stop: its line says what the agent cost while it was open.
    /// let window = Profile { passes: 0, ..profile.clone() };
    /// assert_eq!(
    ///     window.agent_cpu_line().unwrap(),
    ///     "agent cpu: 0.5 ms in the handlers and 1.5 ms in the collection passes \
    ///      while the window was open: 2.00 µs a sample\n"
    /// );
    /// // Any field values, even absurd ones, give a line.
    /// let absurd = Profile { handler_time: Duration::MAX, collector_cpu: Duration::MAX, ..profile };
    /// assert!(absurd.agent_cpu_line().unwrap().starts_with("agent cpu: "));
    /// ```
    pub fn agent_cpu_line(&self) -> Option<String> {
        if self.collector_cpu.is_zero() && self.handler_time.is_zero() {
            return None;
        }
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let per_sample = self
            .handler_time
            .saturating_add(self.collector_cpu)
            .as_secs_f64()
            * 1e6
            / self.samples.max(1) as f64;
        // A whole run's profile counts its passes (`stop` makes one at
        // least); a window's counts none.
        if self.passes == 0 {
            return Some(format!(
                "agent cpu: {:.1} ms in the handlers and {:.1} ms in the collection passes \
                 while the window was open: {per_sample:.2} µs a sample\n",
                ms(self.handler_time),
                ms(self.collector_cpu),
            ));
        }
        Some(format!(
            "agent cpu: {:.1} ms in the handlers and {:.1} ms in the collector's {} passes: \
             {per_sample:.2} µs a sample; {:.1} ms naming the profile at stop\n",
            ms(self.handler_time),
            ms(self.collector_cpu),
            self.passes,
            ms(self.naming_cpu)
        ))
    }

    /// Lookups per second of the agent's run.
    pub fn lookups_per_second(&self) -> f64 {
        self.lookups as f64 / self.duration.as_secs_f64().max(1e-9)
    }

    /// The text report: counters, then the top `top` names by self and by total
    /// samples, with their shares of all samples.
    pub fn report(&self, top: usize) -> String {
        let mut out = String::new();
        let secs = self.duration.as_secs_f64();
        let _ = writeln!(
            out,
            "signals: {} kept in {:.2} s on {} thread(s); taken {}, dropped {}, unattributed {}",
            self.samples, secs, self.threads, self.taken, self.dropped, self.unattributed
        );
        let _ = write!(
            out,
            "samples: {}, one per timer period, what every count below counts; {} of them \
             from coalesced signals (the timer's overrun)",
            self.counted(),
            self.coalesced()
        );
        if self.dropped_periods > 0 {
            let _ = write!(out, "; {} more in dropped signals", self.dropped_periods);
        }
        out.push('\n');
        if self.gave_up > 0 {
            let _ = writeln!(
                out,
                "gave up: {} signal(s) named a JIT version the collector never heard of \
                 (its load event never came); those frames count as [unattributed]",
                self.gave_up
            );
        }
        if let Some(rate) = self.rate_line() {
            out.push_str(&rate);
        }
        // Each thread's own attached time (for a profile that does not
        // say, the run's, for each thread).
        let attached = if self.attached.is_zero() {
            secs * self.threads.max(1) as f64
        } else {
            self.attached.as_secs_f64()
        };
        let _ = writeln!(
            out,
            "cpu: {:.2} s used by the attached threads while attached ({:.0}% of their {:.2} s attached)",
            self.cpu.as_secs_f64(),
            100.0 * self.cpu.as_secs_f64() / attached.max(1e-9),
            attached
        );
        if let Some(line) = self.agent_cpu_line() {
            out.push_str(&line);
        }
        let _ = writeln!(
            out,
            "lookups: {} ({:.0} per second); ring memory per thread: {} bytes",
            self.lookups,
            self.lookups_per_second(),
            self.ring_bytes_per_thread
        );
        let _ = writeln!(
            out,
            "probes: {} entries, {} values, {} dropped",
            self.probes.enters, self.probes.values, self.probes.dropped
        );
        out.push_str(&self.top_tables(top));
        out
    }

    /// The report's two tables: the top `top` names by self samples, then by
    /// total samples, each with both counts and shares of all samples. (A
    /// profiler other than the agent prints its own counters above them.)
    ///
    /// ```
    /// use jitmap::agent::{Profile, Stack};
    ///
    /// let profile = Profile {
    ///     samples: 4,
    ///     stacks: vec![
    ///         Stack { frames: vec!["leaf".into(), "main".into()], count: 3 },
    ///         Stack { frames: vec!["main".into()], count: 1 },
    ///     ],
    ///     ..Profile::default()
    /// };
    /// let tables = profile.top_tables(1);
    /// assert!(tables.contains("       3   75.0%        3   75.0%  leaf"));
    /// assert!(tables.contains("       4  100.0%        1   25.0%  main"));
    /// ```
    pub fn top_tables(&self, top: usize) -> String {
        let mut out = String::new();
        let mut summary = self.summary();
        // Each table leads with its own count and share, then the other's.
        let mut table = |title: &str, by_self: bool, rows: &[MethodSummary]| {
            let (first, second) = if by_self {
                ("self", "total")
            } else {
                ("total", "self")
            };
            let _ = writeln!(out, "\ntop by {title} samples:");
            let _ = writeln!(
                out,
                "{first:>8} {:>7} {second:>8} {:>7}  name",
                format!("{first}%"),
                format!("{second}%")
            );
            for m in rows.iter().take(top) {
                let own = (m.self_samples, m.self_share);
                let all = (m.total_samples, m.total_share);
                let ((a, a_share), (b, b_share)) = if by_self { (own, all) } else { (all, own) };
                let _ = writeln!(
                    out,
                    "{a:>8} {:>6.1}% {b:>8} {:>6.1}%  {}",
                    a_share * 100.0,
                    b_share * 100.0,
                    m.name
                );
            }
        };
        table("self", true, &summary);
        summary.sort_by(|a, b| {
            b.total_samples
                .cmp(&a.total_samples)
                .then_with(|| a.name.cmp(&b.name))
        });
        table("total", false, &summary);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::{Profile, Stack};

    fn profile() -> Profile {
        let stack = |frames: &[&str], count| Stack {
            frames: frames.iter().map(|s| s.to_string()).collect(),
            count,
        };
        Profile {
            samples: 10,
            stacks: vec![
                stack(&["leaf", "mid", "main"], 6),
                stack(&["mid", "main"], 3),
                stack(&["a;b", "main"], 1),
            ],
            ..Profile::default()
        }
    }

    /// Signals at three quarters of the rate asked or more: kept. Under
    /// it, the rate they came at, per second of the time the clock
    /// measures, and the periods each stood for; on the wall clock, per
    /// second of each thread's attached time.
    #[test]
    fn the_rate_line_says_when_signals_came_slower_than_asked() {
        use std::time::Duration;
        let wall = |samples| Profile {
            period: Duration::from_millis(1),
            slowest_period: Duration::from_millis(1),
            clock: super::super::Clock::Wall,
            duration: Duration::from_secs(2),
            threads: 2,
            samples,
            dropped: 100,
            periods: 3900,
            dropped_periods: 100,
            ..Profile::default()
        };
        assert_eq!(
            wall(2900).rate_line().unwrap(),
            "rate: 1000 Hz asked, and kept\n"
        );
        assert_eq!(
            wall(1900).rate_line().unwrap(),
            "rate: 1000 Hz asked; signals came at 500 Hz of attached time, each standing for \
             2.0 periods on average (the threads waited for a CPU, or blocked the signal)\n"
        );
        // A thread attached for 0.3 s of a 1.3 s run, signalled on time:
        // kept. (The old line divided by the run's length: 231 Hz.)
        let late_attach = Profile {
            period: Duration::from_millis(1),
            slowest_period: Duration::from_millis(1),
            clock: super::super::Clock::Wall,
            duration: Duration::from_millis(1300),
            attached: Duration::from_millis(300),
            threads: 1,
            samples: 300,
            periods: 300,
            ..Profile::default()
        };
        assert_eq!(
            late_attach.rate_line().unwrap(),
            "rate: 1000 Hz asked, and kept\n"
        );
        let none = Profile {
            period: Duration::from_millis(1),
            ..Profile::default()
        };
        assert_eq!(none.rate_line().unwrap(), "rate: 1000 Hz asked, and kept\n");
    }

    #[test]
    fn summary_counts_self_and_total_once_per_stack() {
        let s = profile().summary();
        let rows: Vec<_> = s
            .iter()
            .map(|m| (m.name.as_str(), m.self_samples, m.total_samples))
            .collect();
        assert_eq!(
            rows,
            [
                ("leaf", 6, 6),
                ("mid", 3, 9),
                ("a;b", 1, 1),
                ("main", 0, 10)
            ]
        );
        assert_eq!(s[1].self_share, 0.3);
        assert_eq!(s[1].total_share, 0.9);
    }

    #[test]
    fn folded_is_outermost_first_and_escapes_separators() {
        assert_eq!(
            profile().folded(),
            "main;mid;leaf 6\nmain;mid 3\nmain;a:b 1\n"
        );
    }

    #[test]
    fn report_lists_shares() {
        let report = profile().report(2);
        assert!(report.contains(
            "signals: 10 kept in 0.00 s on 0 thread(s); taken 0, dropped 0, unattributed 0"
        ));
        assert!(
            report.contains("       6   60.0%        6   60.0%  leaf\n"),
            "{report}"
        );
        assert!(
            report.contains("      10  100.0%        0    0.0%  main\n"),
            "{report}"
        );
    }

    /// Dropped samples' periods and samples that gave up are reported only
    /// when there are some.
    #[test]
    fn report_tells_dropped_periods_and_samples_that_gave_up_when_there_are_some() {
        let periods = "samples: 10, one per timer period, what every count below counts; 0 of them \
                       from coalesced signals (the timer's overrun)";
        let plain = profile().report(2);
        assert!(plain.contains(&format!("\n{periods}\n")), "{plain}");
        assert!(!plain.contains("gave up"), "{plain}");
        let report = Profile {
            dropped_periods: 7,
            gave_up: 2,
            ..profile()
        }
        .report(2);
        assert!(
            report.contains(&format!(
                "\n{periods}; 7 more in dropped signals\n\
                 gave up: 2 signal(s) named a JIT version the collector never heard of \
                 (its load event never came); those frames count as [unattributed]\n"
            )),
            "{report}"
        );
    }
}
