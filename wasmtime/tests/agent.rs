//! The agent profiling wasmtime guests registered with `jitmap-wasmtime`.

use std::collections::HashMap;
use std::time::Duration;

use jitmap::ExecutionManager;
use jitmap::agent::{AgentConfig, Clock, Profile};
use jitmap_wasmtime::demo::{self, LEAVES, Until};

/// The longest a test waits for its samples, however busy the machine.
const CAP: Duration = Duration::from_secs(120);

/// Runs the guest under the agent (wall clock, 1 kHz) until the calling
/// thread has `samples` samples; returns the profile. (A CPU-clock timer
/// fires on the scheduler's tick, 250 Hz here, and the guest's rounds lock
/// to its phase: the leaves' shares moved from 51 to 68 % for the 4x leaf
/// run to run. The wall clock's timers are high-resolution.)
fn profile_guest(samples: u64) -> Profile {
    let manager = ExecutionManager::new(4);
    let config = AgentConfig {
        hz: 1000,
        clock: Clock::Wall,
        ..AgentConfig::default()
    };
    let engine = demo::engine(false).unwrap();
    let run = demo::run(
        &manager,
        &engine,
        config,
        Until::Samples(samples, CAP),
        |_| Ok(()),
    )
    .unwrap();
    assert_eq!(run.wrong, 0);
    assert!(run.calls > 0);
    run.profile
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
    let profile = profile_guest(3000);
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
