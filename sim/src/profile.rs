//! `profile`: runs the demo host under the in-process agent and writes the
//! agent's outputs.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use jitmap::ExecutionManager;
use jitmap::agent::{Agent, AgentConfig, Clock, Profile};

use crate::demo::Demo;
use crate::rng::Rng;

/// Leaf iterations per unit of work, on average: long enough that calls cost
/// little. Each call draws its own count around it (see [`crate::demo`]).
pub const BASE_ITERATIONS: u32 = 20_000;

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

/// Runs the demo on the calling thread for `duration` under an agent sampling
/// at `hz` on `clock`. `manager` should be fresh (its heaps hold the demo).
pub fn run(
    manager: &Arc<ExecutionManager>,
    hz: u32,
    clock: Clock,
    duration: Duration,
) -> Result<ProfileRun, Box<dyn std::error::Error>> {
    let demo = Demo::publish(manager)?;
    let config = AgentConfig {
        hz,
        clock,
        ..AgentConfig::default()
    };
    let agent = Agent::start(manager, config)?;
    let attached = agent.attach_current_thread()?;
    let (mut calls, mut wrong) = (0u64, 0u64);
    let mut rng = Rng::new(0x5eed);
    let deadline = Instant::now() + duration;
    while Instant::now() < deadline {
        let base = BASE_ITERATIONS / 2 + rng.below(u64::from(BASE_ITERATIONS)) as u32;
        calls += 1;
        wrong += u64::from(demo.run(1, base) != Demo::expected(1, base));
    }
    drop(attached);
    let profile = agent.stop()?;
    Ok(ProfileRun {
        profile,
        calls,
        wrong,
        period_ns: 1_000_000_000 / u64::from(hz),
    })
}

/// The run as one JSON object: `samples`, `dropped`, `unattributed`, and
/// `methods` (`name`, `self_samples`, `total_samples`, `self_share`), plus the
/// other counters.
pub fn json(run: &ProfileRun) -> serde_json::Value {
    let p = &run.profile;
    let methods: Vec<_> = p
        .summary()
        .into_iter()
        .map(|m| {
            serde_json::json!({
                "name": m.name,
                "self_samples": m.self_samples,
                "total_samples": m.total_samples,
                "self_share": m.self_share,
            })
        })
        .collect();
    serde_json::json!({
        "samples": p.samples,
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
    std::fs::create_dir_all(dir)?;
    let p = &run.profile;
    std::fs::write(dir.join("report.txt"), p.report(20))?;
    std::fs::write(dir.join("stacks.folded"), p.folded())?;
    let svg = std::fs::File::create(dir.join("flamegraph.svg"))?;
    p.write_flamegraph("jitmap agent: demo host", std::io::BufWriter::new(svg))?;
    let pb = std::fs::File::create(dir.join("profile.pb.gz"))?;
    p.write_pprof(run.period_ns, std::io::BufWriter::new(pb))?;
    Ok(())
}
