//! The agent profiling wasmtime guests registered with `jitmap-wasmtime`.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::guest::{Guest, LEAVES, ROUNDS};
use jitmap::ExecutionManager;
use jitmap::agent::{Agent, AgentConfig, Clock, Profile};
use wasmtime::Engine;

/// The longest a test waits for its samples, however busy the machine.
const CAP: Duration = Duration::from_secs(120);

/// Runs the guest under the agent (CPU clock, `hz`) until the calling
/// thread has `samples` samples; returns the profile and the calls made.
fn profile_guest(samples: u64) -> (Profile, u64) {
    let manager = ExecutionManager::new(4);
    let mut guest = Guest::new(&Engine::default()).unwrap();
    let registration = jitmap_wasmtime::register(&manager, &guest.module).unwrap();
    let agent = Agent::start(
        &manager,
        AgentConfig {
            hz: 1000,
            clock: Clock::Cpu,
            ..AgentConfig::default()
        },
    )
    .unwrap();
    let attached = agent.attach_current_thread().unwrap();
    let began = Instant::now();
    let mut calls = 0;
    let expected = Guest::expected(ROUNDS);
    while attached.samples_taken() < samples && began.elapsed() < CAP {
        assert_eq!(guest.call(ROUNDS).unwrap(), expected);
        calls += 1;
    }
    drop(attached);
    let profile = agent.stop();
    drop(registration);
    (profile, calls)
}

/// Self samples of each frame name at the leaf.
fn self_samples(p: &Profile) -> HashMap<String, u64> {
    let mut by_name = HashMap::new();
    for s in &p.stacks {
        *by_name.entry(s.frames[0].clone()).or_default() += s.count;
    }
    by_name
}

/// Each leaf's share, in points, of the three leaves' self samples.
fn leaf_points(by_name: &HashMap<String, u64>) -> [f64; 3] {
    let n = LEAVES.map(|l| by_name.get(l).copied().unwrap_or(0) as f64);
    let total: f64 = n.iter().sum();
    n.map(|x| 100.0 * x / total)
}

#[test]
fn the_agent_names_every_guest_frame_and_gives_the_leaves_1_2_4() {
    let (profile, _) = profile_guest(3000);
    // Every frame is named: no image method by number, nothing unattributed.
    for s in &profile.stacks {
        for f in &s.frames {
            assert!(
                !f.starts_with("[image method") && f != "[unattributed]",
                "{:?}",
                s.frames
            );
        }
    }
    // Each leaf's usual stack is the whole guest chain, entered through
    // wasmtime's trampolines.
    for leaf in LEAVES {
        let usual = profile
            .stacks
            .iter()
            .filter(|s| s.frames[0] == leaf)
            .max_by_key(|s| s.count)
            .unwrap();
        assert_eq!(
            usual.frames[..4],
            [leaf, "guest::middle", "guest::top", "guest::[trampolines]"],
        );
    }
    let by_name = self_samples(&profile);
    let leaves: u64 = LEAVES.iter().map(|l| by_name[*l]).sum();
    assert!(leaves >= 2000, "{by_name:?}");
    let points = leaf_points(&by_name);
    let expected = [100.0 / 7.0, 200.0 / 7.0, 400.0 / 7.0];
    for (p, e) in points.iter().zip(expected) {
        assert!((p - e).abs() <= 3.0, "{points:?} against {expected:?}");
    }
}
