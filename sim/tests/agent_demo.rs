//! The agent on the demo host: the leaves' shares, their exact stacks, and
//! agreement with real `perf` on the same run.

use std::sync::Arc;
use std::time::Duration;

use jitmap::ExecutionManager;
use jitmap::agent::Clock;
use jitmap_sim::demo::{LEAVES, MIDDLE, NATIVE_CALLER, TOP};
use jitmap_sim::profile;

#[path = "tools/perf.rs"]
mod perf_tools;
mod tools;

use perf_tools::{inject_and_report, perf, temp_dir};

const SIM: &str = env!("CARGO_BIN_EXE_jitmap-sim");
/// 1/7, 2/7 and 4/7, in percent.
const EXPECTED: [f64; 3] = [100.0 / 7.0, 200.0 / 7.0, 400.0 / 7.0];

/// The two runs take a core each at least; they go one at a time, so that
/// neither skews the other's shares.
fn one_run() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn leaves_get_their_share_and_their_exact_stack() {
    if !cfg!(target_arch = "x86_64") {
        println!("skipped: the demo is x86-64 code");
        return;
    }
    let _one = one_run();
    let manager = Arc::new(ExecutionManager::new(16));
    // Wall clock: a high-resolution timer (CPU-time timers tick at CONFIG_HZ).
    let run = profile::run(&manager, 2000, Clock::Wall, Duration::from_millis(1600)).unwrap();
    let p = &run.profile;
    assert_eq!(run.wrong, 0, "the JIT code computed a wrong result");
    assert!(p.samples >= 2000, "only {} samples", p.samples);
    assert_eq!(
        p.unattributed, 0,
        "a sample in a JIT range was unattributed"
    );
    assert_eq!(p.samples + p.dropped, p.taken);
    let summary = p.summary();
    for (leaf, expected) in LEAVES.iter().zip(EXPECTED) {
        let m = summary.iter().find(|m| m.name == *leaf).unwrap();
        let share = m.self_share * 100.0;
        assert!(
            (share - expected).abs() <= 3.0,
            "{leaf}: {share:.1}% of {} samples, expected {expected:.1}%",
            p.samples
        );
    }
    // Every sample in a leaf has exactly leaf;middle;top;native caller inside.
    let mut in_leaves = 0;
    for stack in &p.stacks {
        if LEAVES.contains(&stack.frames[0].as_str()) {
            in_leaves += stack.count;
            assert!(stack.frames.len() >= 4, "{:?}", stack.frames);
            assert_eq!(
                stack.frames[1..4],
                [MIDDLE, TOP, NATIVE_CALLER],
                "{:?}",
                stack.frames
            );
        }
    }
    assert!(
        in_leaves * 10 >= p.samples * 9,
        "{in_leaves} of {}",
        p.samples
    );
    // The five JIT functions are the method versions the profile names.
    let mut names: Vec<_> = p.methods.iter().map(|m| m.label.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["leaf_1x", "leaf_2x", "leaf_4x", "middle", "top"]);
}

/// Each leaf's share of the three leaves' samples, in percent.
fn normalized(shares: [f64; 3]) -> [f64; 3] {
    let sum: f64 = shares.iter().sum();
    shares.map(|s| s * 100.0 / sum)
}

#[test]
fn agent_and_perf_agree_on_one_run() {
    if !tools::available("perf") {
        return;
    }
    let must_run = std::env::var("CI").is_ok_and(|v| v == "true");
    let _one = one_run();
    let dir = temp_dir("agent-perf");
    let data = dir.join("perf.data");
    let out_dir = dir.join("out");
    let record = perf(
        &dir,
        &[
            "record",
            "-k",
            "1",
            "-e",
            "cpu-clock",
            "-F",
            "2000",
            "-o",
            data.to_str().unwrap(),
            "--",
            SIM,
            "profile",
            "--clock",
            "wall",
            "--hz",
            "2000",
            "--seconds",
            "4",
            "--json",
            "--out",
            out_dir.to_str().unwrap(),
        ],
    );
    if !record.status.success() {
        let err = String::from_utf8_lossy(&record.stderr);
        assert!(!must_run, "perf record failed in CI: {err}");
        println!("skipped: perf cannot record here: {err}");
        return;
    }
    let agent: serde_json::Value = serde_json::from_slice(&record.stdout).unwrap();
    assert_eq!(agent["wrong"], 0);
    assert_eq!(agent["unattributed"], 0);
    let agent_share = |name: &str| {
        agent["methods"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == name)
            .and_then(|m| m["self_share"].as_f64())
            .unwrap_or_else(|| panic!("{name} missing from the agent's report"))
    };
    let text = inject_and_report(&dir, &data, "sym");
    let perf_share = |name: &str| -> f64 {
        let line = text
            .lines()
            .find(|l| l.split_whitespace().last() == Some(name))
            .unwrap_or_else(|| panic!("{name} missing from perf report:\n{text}"));
        line.split_whitespace()
            .next()
            .unwrap()
            .trim_end_matches('%')
            .parse()
            .unwrap()
    };
    let from_agent = normalized(LEAVES.map(agent_share));
    let from_perf = normalized(LEAVES.map(perf_share));
    for i in 0..3 {
        assert!(
            (from_agent[i] - from_perf[i]).abs() <= 3.0,
            "{}: agent {:.1}%, perf {:.1}% (of the leaves' samples)",
            LEAVES[i],
            from_agent[i],
            from_perf[i]
        );
        assert!((from_agent[i] - EXPECTED[i]).abs() <= 3.0, "{from_agent:?}");
    }
    for file in [
        "report.txt",
        "stacks.folded",
        "flamegraph.svg",
        "profile.pb.gz",
    ] {
        assert!(out_dir.join(file).is_file(), "{file} not written");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
