//! The WebAssembly guest of `jitmap_wasmtime::demo` in a wasmtime host,
//! profiled in one run by the agent inside it and by `perf record` reading
//! wasmtime's own jitdump (the runtime's oracle, after `perf inject --jit`):
//! the three leaves' shares agree. (The same run with eBPF beside them is
//! in `ebpf.rs`, which needs the `ebpf` feature.)
//!
//! Needs Linux perf; with `CI=true` it must run, elsewhere it says why it
//! skips.

// `spin`, which only the inspect tests start, is unused here.
#[expect(dead_code)]
mod host;

use jitmap_testkit::e2e::{
    self, inject_and_report, json_share, normalized, one_run, record_demo, temp_dir,
};
use std::process::Stdio;

/// Runs the test, or, started as a host, the host.
fn main() {
    host::main(&[(
        "the_agent_and_perf_with_wasmtimes_jitdump_agree_on_the_guest",
        the_agent_and_perf_with_wasmtimes_jitdump_agree_on_the_guest,
    )]);
}

fn the_agent_and_perf_with_wasmtimes_jitdump_agree_on_the_guest() {
    if !e2e::available("perf") {
        return;
    }
    let _one = one_run();
    let dir = temp_dir("perf-wasm");
    let data = dir.join("perf.data");
    let agent_out = dir.join("agent");
    let exe = host::executable();
    let mut record = record_demo(&[exe.to_str().unwrap()], &dir, &data, "4", &agent_out);
    let out = host::as_host(&mut record, "wasm")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    if !e2e::recorded(&out) {
        return;
    }
    let agent: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(agent["wrong"], 0);
    assert_eq!(agent["unattributed"], 0);
    let leaves = jitmap_wasmtime::demo::LEAVES;
    let samples: u64 = leaves
        .iter()
        .map(|l| {
            agent["methods"]
                .as_array()
                .unwrap()
                .iter()
                .find(|m| m["name"] == *l)
                .and_then(|m| m["self_samples"].as_u64())
                .unwrap_or(0)
        })
        .sum();
    // perf names the leaves from wasmtime's jitdump (its names end in the
    // function's name).
    let text = inject_and_report(&dir, &data, "sym");
    let perf_share =
        |leaf: &str| e2e::report_share_ending(&text, leaf.trim_start_matches("guest::"));
    let from_agent = normalized(leaves.map(|l| json_share(&agent, l)));
    let from_perf = normalized(leaves.map(perf_share));
    println!("wasm guest: agent {from_agent:.1?} perf {from_perf:.1?}");
    // Four standard errors of the agent's leaf samples (a share's standard
    // error is at most 100 * sqrt(1/4 / n) points, a difference of two
    // sqrt(2) times that): 283 / sqrt(n), never under 3 points.
    let tolerance = (283.0 / (samples.max(1) as f64).sqrt()).max(3.0);
    let expected = [100.0 / 7.0, 200.0 / 7.0, 400.0 / 7.0];
    for i in 0..3 {
        for (who, share) in [("agent", from_agent[i]), ("perf", from_perf[i])] {
            assert!(
                (share - expected[i]).abs() <= tolerance,
                "{}: {who} {share:.1}% against {:.1}% (tolerance {tolerance:.1}, {samples} agent samples)",
                leaves[i],
                expected[i]
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
