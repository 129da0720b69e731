//! jitdump in real processes: a child killed mid-run leaves a file that validates
//! up to a record boundary, and real `perf` names the JIT functions.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use jitmap::perf::check::{Body, Violation, check};

mod tools;

const SIM: &str = env!("CARGO_BIN_EXE_jitmap-sim");

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("jitmap-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn killed_writer_leaves_a_valid_prefix() {
    let dir = temp_dir("crash");
    let mut child = Command::new(SIM)
        .args([
            "spin",
            "--functions",
            "16",
            "--seconds",
            "60",
            "--churn",
            "--perf",
            "jitdump",
        ])
        .env("JITMAP_PERF_DIR", &dir)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let path = dir.join(format!("jit-{}.dump", child.id()));
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::fs::metadata(&path).map_or(0, |m| m.len()) < 256 * 1024 {
        assert!(Instant::now() < deadline, "the child wrote too little");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let report = check(&bytes);
    // Everything before the last complete record is valid; at most the tail is cut.
    match report.violations.as_slice() {
        [] => assert_eq!(report.clean_len, bytes.len()),
        [Violation::TruncatedTail { offset, .. }] => assert_eq!(*offset, report.clean_len),
        other => panic!("unexpected violations: {other:?}"),
    }
    let loads = report
        .records
        .iter()
        .filter(|r| matches!(r.body, Body::Load { .. }))
        .count();
    let moves = report
        .records
        .iter()
        .filter(|r| matches!(r.body, Body::Move { .. }))
        .count();
    assert!(loads >= 16 && moves > 0, "loads {loads} moves {moves}");
    assert!(
        !report.records.iter().any(|r| r.body == Body::Close),
        "a killed process writes no close record"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Runs a command with perf's caches kept inside `dir`.
fn perf(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new("perf")
        .args(args)
        .current_dir(dir)
        .env("HOME", dir)
        .env("PERF_BUILDID_DIR", dir.join(".debug"))
        .env("JITMAP_PERF", "jitdump")
        .env("JITMAP_PERF_DIR", dir)
        .output()
        .expect("perf runs")
}

#[test]
fn real_perf_names_jit_functions() {
    if !tools::available("perf") {
        return;
    }
    let must_run = std::env::var("CI").is_ok_and(|v| v == "true");
    let dir = temp_dir("perf-e2e");
    let data = dir.join("perf.data");
    let out = perf(
        &dir,
        &[
            "record",
            "-k",
            "1",
            "-e",
            "cpu-clock",
            "-o",
            data.to_str().unwrap(),
            "--",
            SIM,
            "spin",
            "--functions",
            "4",
            "--seconds",
            "2",
        ],
    );
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!must_run, "perf record failed in CI: {err}");
        println!("skipped: perf cannot record here: {err}");
        return;
    }
    let jit = dir.join("perf.jit.data");
    let inject = perf(
        &dir,
        &[
            "inject",
            "--jit",
            "-i",
            data.to_str().unwrap(),
            "-o",
            jit.to_str().unwrap(),
        ],
    );
    assert!(
        inject.status.success(),
        "{}",
        String::from_utf8_lossy(&inject.stderr)
    );
    let report = perf(
        &dir,
        &[
            "report",
            "-i",
            jit.to_str().unwrap(),
            "--stdio",
            "--sort",
            "dso,sym",
        ],
    );
    assert!(
        report.status.success(),
        "{}",
        String::from_utf8_lossy(&report.stderr)
    );
    let text = String::from_utf8_lossy(&report.stdout);
    for id in 0..4 {
        let name = format!("jitmap_spin_{id}");
        let line = text
            .lines()
            .find(|l| l.contains(&name))
            .unwrap_or_else(|| panic!("{name} missing from perf report:\n{text}"));
        let percent: f64 = line
            .split_whitespace()
            .next()
            .unwrap()
            .trim_end_matches('%')
            .parse()
            .unwrap();
        assert!(percent > 1.0, "{name} has {percent}% of samples");
        assert!(line.contains("jitted-"), "{line}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
