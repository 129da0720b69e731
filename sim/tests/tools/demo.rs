//! The demo host (`jitmap-sim profile`) as the profiler tests run it: one at
//! a time, under `perf record`, with each leaf's share read from a report.

use std::path::Path;
use std::process::Command;

/// The runs take a core each at least; they go one at a time, so that one's
/// sampling does not starve or skew another's host.
pub fn one_run() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Each leaf's share of the three leaves' samples, in percent.
pub fn normalized(shares: [f64; 3]) -> [f64; 3] {
    let sum: f64 = shares.iter().sum();
    shares.map(|s| s * 100.0 / sum)
}

/// `name`'s self share in a profile's JSON (`profile --json` and
/// `ebpf-profile --json` both list `methods` with `self_share`).
pub fn json_share(report: &serde_json::Value, name: &str) -> f64 {
    report["methods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == name)
        .and_then(|m| m["self_share"].as_f64())
        .unwrap_or_else(|| panic!("{name} missing from {}", report["methods"]))
}

/// `perf record` at 2 kHz of the demo profiled by its own agent at 2 kHz
/// (wall clock) for `seconds`, printing its JSON and writing its outputs to
/// `out`, with jitdump on.
pub fn record_demo(dir: &Path, data: &Path, seconds: &str, out: &Path) -> Command {
    let sim = env!("CARGO_BIN_EXE_jitmap-sim");
    let profile = [
        sim,
        "profile",
        "--clock",
        "wall",
        "--hz",
        "2000",
        "--seconds",
        seconds,
        "--json",
        "--out",
        out.to_str().unwrap(),
    ];
    crate::perf_tools::record(dir, data, Some(2000), &profile)
}

/// Asserts that a profiler wrote its four outputs into `dir`.
pub fn assert_outputs(dir: &Path) {
    for file in [
        "report.txt",
        "stacks.folded",
        "flamegraph.svg",
        "profile.pb.gz",
    ] {
        assert!(dir.join(file).is_file(), "{file} not written");
    }
}
