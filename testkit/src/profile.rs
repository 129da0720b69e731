//! `profile`: runs the demo host under the in-process agent and writes the
//! agent's outputs.

use std::path::Path;
use std::time::{Duration, Instant};

use jitmap::ExecutionManager;
use jitmap::agent::{Agent, AgentConfig, Clock, Profile};

use crate::demo::{Demo, DemoBackend, PublishedDemo};
use crate::rng::Rng;
pub use jitmap_demo::output::{BASE_ITERATIONS, methods_json, write_profile};

/// (samples whose leaf is `stack[0]`, those whose innermost frames are
/// exactly `stack`): how a test checks that samples in a leaf kept their
/// callers.
///
/// ```
/// use jitmap::agent::{Profile, Stack};
/// let stack = |frames: &[&str], count| Stack { frames: frames.iter().map(|f| f.to_string()).collect(), count };
/// let profile = Profile {
///     stacks: vec![stack(&["leaf", "caller", "main"], 3), stack(&["leaf"], 1), stack(&["main"], 2)],
///     ..Profile::default()
/// };
/// assert_eq!(jitmap_testkit::profile::exact_stacks(&profile, &["leaf", "caller"]), (4, 3));
/// ```
pub fn exact_stacks(profile: &Profile, stack: &[&str]) -> (u64, u64) {
    let mut in_leaf = 0;
    let mut exact = 0;
    for s in &profile.stacks {
        if s.frames.first().map(String::as_str) != Some(stack[0]) {
            continue;
        }
        in_leaf += s.count;
        if s.frames.len() >= stack.len() && s.frames.iter().zip(stack).all(|(f, want)| f == want) {
            exact += s.count;
        }
    }
    (in_leaf, exact)
}

/// Samples the calling thread under an agent of `manager` (wall clock,
/// 1 kHz, the mixed walk) while it calls `work` in a loop, until `samples`
/// were taken (at most 300 s: a loaded machine takes longer, not fewer);
/// the agent's profile. Start it after the native code `work` reaches is
/// loaded: the agent's first table then holds that code's rows.
pub fn sample_mixed(
    manager: &ExecutionManager,
    samples: u64,
    mut work: impl FnMut(),
) -> Result<Profile, jitmap::agent::AgentError> {
    let agent = Agent::start(
        manager,
        AgentConfig {
            hz: 1000,
            clock: Clock::Wall,
            unwind: jitmap::agent::Unwind::Mixed,
            ..AgentConfig::default()
        },
    )?;
    let attached = agent.attach_current_thread()?;
    let cap = Instant::now() + Duration::from_secs(300);
    while attached.samples_taken() < samples && Instant::now() < cap {
        work();
    }
    drop(attached);
    Ok(agent.stop())
}

/// The profile's `n` most sampled stacks, one a line (`count a <- b`), for
/// an assertion's message.
///
/// ```
/// use jitmap::agent::{Profile, Stack};
/// let profile = Profile {
///     stacks: vec![Stack { frames: vec!["leaf".into(), "main".into()], count: 3 }],
///     ..Profile::default()
/// };
/// assert_eq!(jitmap_testkit::profile::shown(&profile, 8), "3 leaf <- main\n");
/// ```
pub fn shown(profile: &Profile, n: usize) -> String {
    profile
        .stacks
        .iter()
        .take(n)
        .map(|s| format!("{} {}\n", s.count, s.frames.join(" <- ")))
        .collect()
}

/// A profiled run of the demo.
#[derive(Debug)]
pub struct ProfileRun {
    /// The agent's profile.
    pub profile: Profile,
    /// Calls of `top` made (one round each).
    pub calls: u64,
    /// Calls whose result was not the predicted one.
    pub wrong: u64,
    /// The sampling period in ns.
    pub period_ns: u64,
}

/// Runs the demo, published by `backend`, on the calling thread for
/// `duration` under an agent sampling at `hz` on `clock`. `manager` should be
/// fresh (its heaps hold the demo).
pub fn run(
    manager: &ExecutionManager,
    backend: DemoBackend,
    hz: u32,
    clock: Clock,
    until: impl Into<Until>,
) -> Result<ProfileRun, Box<dyn std::error::Error>> {
    run_with(manager, backend, hz, clock, until, |_| Ok(()))
}

/// When a demo run ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Until {
    /// After this much wall time.
    Elapsed(Duration),
    /// Once the demo thread's handler has taken this many samples, or after
    /// [`SAMPLES_CAP`]: a test's floor of samples, however busy the machine.
    Samples(u64),
}

/// The longest an [`Until::Samples`] run lasts.
pub const SAMPLES_CAP: Duration = Duration::from_secs(60);

impl From<Duration> for Until {
    fn from(d: Duration) -> Self {
        Self::Elapsed(d)
    }
}

/// [`run`], calling `started` with the agent once it runs (to serve its
/// profiles, for example).
pub fn run_with(
    manager: &ExecutionManager,
    backend: DemoBackend,
    hz: u32,
    clock: Clock,
    until: impl Into<Until>,
    started: impl FnOnce(&Agent) -> Result<(), Box<dyn std::error::Error>>,
) -> Result<ProfileRun, Box<dyn std::error::Error>> {
    let demo = PublishedDemo::publish(manager, backend)?;
    let config = AgentConfig {
        hz,
        clock,
        ..AgentConfig::default()
    };
    let agent = Agent::start(manager, config)?;
    started(&agent)?;
    let attached = agent.attach_current_thread()?;
    let (mut calls, mut wrong) = (0u64, 0u64);
    let mut rng = Rng::new(0x5eed);
    let began = Instant::now();
    let until = until.into();
    let done = || match until {
        Until::Elapsed(d) => began.elapsed() >= d,
        Until::Samples(n) => attached.samples_taken() >= n || began.elapsed() >= SAMPLES_CAP,
    };
    while !done() {
        let base = BASE_ITERATIONS / 2 + rng.below(u64::from(BASE_ITERATIONS)) as u32;
        calls += 1;
        wrong += u64::from(demo.run(1, base) != Demo::expected(1, base));
    }
    drop(attached);
    let profile = agent.stop();
    Ok(ProfileRun {
        profile,
        calls,
        wrong,
        period_ns: 1_000_000_000 / u64::from(hz),
    })
}

/// The run as one JSON object: `signals` (those kept), `samples` (one per
/// timer period, the unit of every count of samples: a signal whose timer
/// overran stands for several), `coalesced`, `dropped` (signals),
/// `dropped_periods` (the samples the dropped signals stood for),
/// `unattributed` and `gave_up` (signals whose leaf was unnamed, and whose
/// JIT version was never heard of), and `methods` (`name`, `self_samples`,
/// `total_samples`, `self_share`), plus the other counters.
pub fn json(run: &ProfileRun) -> serde_json::Value {
    let p = &run.profile;
    let methods = methods_json(p);
    serde_json::json!({
        "signals": p.samples,
        "samples": p.counted(),
        "coalesced": p.coalesced(),
        "dropped": p.dropped,
        "dropped_periods": p.dropped_periods,
        "unattributed": p.unattributed,
        "gave_up": p.gave_up,
        "taken": p.taken,
        "lookups": p.lookups,
        "lookups_per_second": p.lookups_per_second(),
        "seconds": p.duration.as_secs_f64(),
        "ring_bytes_per_thread": p.ring_bytes_per_thread,
        "period_ns": p.period.as_nanos() as u64,
        "slowest_period_ns": p.slowest_period.as_nanos() as u64,
        "backed_off": p.backed_off,
        "calls": run.calls,
        "wrong": run.wrong,
        "methods": methods,
    })
}

/// Writes `report.txt`, `stacks.folded`, `flamegraph.svg` and `profile.pb.gz`
/// into `dir` (created if needed).
pub fn write_outputs(run: &ProfileRun, dir: &Path) -> std::io::Result<()> {
    let p = &run.profile;
    write_profile(
        p,
        &p.report(20),
        "jitmap agent: demo host",
        run.period_ns,
        dir,
    )
}
