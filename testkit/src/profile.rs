//! `profile`: runs the demo host under the in-process agent and writes the
//! agent's outputs.

use std::path::Path;
use std::time::{Duration, Instant};

use jitmap::ExecutionManager;
use jitmap::agent::{Agent, AgentConfig, Clock, Profile, Unwind};

use crate::demo::{Demo, DemoBackend, PublishedDemo};
use crate::rng::Rng;
pub use jitmap_demo::output::{
    BASE_ITERATIONS, median, methods_json, ratios, throughput, write_profile,
};

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

/// The run as one JSON object: `samples`, `periods` (the timer expirations
/// they stand for), `coalesced`, `dropped`, `unattributed`, and
/// `methods` (`name`, `self_samples`, `total_samples`, `self_share`), plus the
/// other counters.
pub fn json(run: &ProfileRun) -> serde_json::Value {
    let p = &run.profile;
    let methods = methods_json(p);
    serde_json::json!({
        "samples": p.samples,
        "periods": p.counted(),
        "coalesced": p.coalesced,
        "dropped": p.dropped,
        "unattributed": p.unattributed,
        "taken": p.taken,
        "lookups": p.lookups,
        "lookups_per_second": p.lookups_per_second(),
        "seconds": p.duration.as_secs_f64(),
        "ring_bytes_per_thread": p.ring_bytes_per_thread,
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

/// The demo's throughput with the agent at one rate, as a ratio to no agent
/// in the same run, beside the floor: a timer at the same rate whose handler
/// does nothing (the kernel's and the machine's cost of delivering signals).
#[derive(Clone, Debug, PartialEq)]
pub struct Overhead {
    /// The sampling rate (wall clock).
    pub hz: u32,
    /// Throughput with the agent (its default, mixed unwinder) over
    /// throughput without, per round.
    pub ratios: Vec<f64>,
    /// The same with the agent walking frame pointers only.
    pub frame_pointer: Vec<f64>,
    /// Throughput with an empty handler over throughput without, per round.
    pub floor: Vec<f64>,
}

extern "C" fn empty_handler(_: libc::c_int) {}

/// Runs `f` with a wall-clock timer on this thread sending SIGPROF `hz` times
/// a second to a handler that does nothing; the previous disposition is
/// restored after.
fn with_empty_timer<R>(hz: u32, f: impl FnOnce() -> R) -> std::io::Result<R> {
    // SAFETY: zeroed sigaction/sigevent are valid; the fields used are set; the
    // handler is empty, so async-signal-safe; the timer is deleted before the
    // previous disposition returns, and a pending signal is flushed by SIG_IGN.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = empty_handler as *const () as libc::sighandler_t;
        action.sa_flags = libc::SA_RESTART;
        let mut previous: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGPROF, &action, &mut previous) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut event: libc::sigevent = std::mem::zeroed();
        event.sigev_notify = libc::SIGEV_THREAD_ID;
        event.sigev_signo = libc::SIGPROF;
        event.sigev_notify_thread_id = libc::gettid();
        let mut timer: libc::timer_t = std::ptr::null_mut();
        if libc::timer_create(libc::CLOCK_MONOTONIC, &mut event, &mut timer) != 0 {
            let e = std::io::Error::last_os_error();
            libc::sigaction(libc::SIGPROF, &previous, std::ptr::null_mut());
            return Err(e);
        }
        let period = libc::timespec {
            tv_sec: 0,
            tv_nsec: (1_000_000_000 / hz.max(1)) as libc::c_long,
        };
        let spec = libc::itimerspec {
            it_interval: period,
            it_value: period,
        };
        libc::timer_settime(timer, 0, &spec, std::ptr::null_mut());
        let result = f();
        libc::timer_delete(timer);
        let mut ignore: libc::sigaction = std::mem::zeroed();
        ignore.sa_sigaction = libc::SIG_IGN;
        libc::sigaction(libc::SIGPROF, &ignore, std::ptr::null_mut());
        libc::sigaction(libc::SIGPROF, &previous, std::ptr::null_mut());
        Ok(result)
    }
}

/// Measures the agent's cost on the demo: `rounds` rounds, each running the
/// demo for `slice` without the agent, then for each rate in `rates` with an
/// empty-handler timer (the floor) and with the agent (wall clock, the thread
/// attached), side by side.
pub fn overhead(
    manager: &ExecutionManager,
    rates: &[u32],
    slice: Duration,
    rounds: usize,
) -> Result<Vec<Overhead>, Box<dyn std::error::Error>> {
    let demo = Demo::publish(manager)?;
    let mut rng = Rng::new(7);
    let mut out: Vec<Overhead> = rates
        .iter()
        .map(|&hz| Overhead {
            hz,
            ratios: Vec::new(),
            frame_pointer: Vec::new(),
            floor: Vec::new(),
        })
        .collect();
    for _ in 0..rounds {
        let base = throughput(&demo, slice, &mut rng);
        for row in &mut out {
            let empty = with_empty_timer(row.hz, || throughput(&demo, slice, &mut rng))?;
            row.floor.push(empty / base);
            for unwind in [Unwind::Mixed, Unwind::FramePointer] {
                let agent = Agent::start(
                    manager,
                    AgentConfig {
                        hz: row.hz,
                        clock: Clock::Wall,
                        unwind,
                        ..AgentConfig::default()
                    },
                )?;
                let attached = agent.attach_current_thread()?;
                let with = throughput(&demo, slice, &mut rng);
                drop(attached);
                agent.stop();
                match unwind {
                    Unwind::Mixed => row.ratios.push(with / base),
                    Unwind::FramePointer => row.frame_pointer.push(with / base),
                }
            }
        }
    }
    Ok(out)
}
