//! Running real `perf` for the end-to-end tests, with its caches (`.debug`,
//! the injected `.so` files) kept inside the test's own directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `perf args...` to run in `dir`, with `HOME` and the build-id cache there
/// and jitdump output on for a jitmap host it starts.
pub fn perf_command(dir: &Path, args: &[&str]) -> Command {
    let mut command = Command::new("perf");
    command
        .args(args)
        .current_dir(dir)
        .env("HOME", dir)
        .env("PERF_BUILDID_DIR", dir.join(".debug"))
        .env("JITMAP_PERF", "jitdump")
        .env("JITMAP_PERF_DIR", dir);
    command
}

/// Runs [`perf_command`] to completion.
pub fn perf(dir: &Path, args: &[&str]) -> Output {
    perf_command(dir, args).output().expect("perf runs")
}

/// `perf record -k 1 -e cpu-clock [-F freq] -o DATA -- COMMAND...` in `dir`
/// (see [`perf_command`]).
pub fn record(dir: &Path, data: &Path, freq: Option<u32>, command: &[&str]) -> Command {
    let freq = freq.map(|f| f.to_string());
    let mut args = vec!["record", "-k", "1", "-e", "cpu-clock"];
    if let Some(f) = &freq {
        args.extend(["-F", f]);
    }
    args.extend(["-o", data.to_str().unwrap(), "--"]);
    args.extend(command);
    perf_command(dir, &args)
}

/// Whether `perf record` succeeded; if not, the test is skipped with perf's
/// reason, or fails under `CI=true`.
pub fn recorded(out: &Output) -> bool {
    if out.status.success() {
        return true;
    }
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!crate::tools::must_run(), "perf record failed in CI: {err}");
    println!("skipped: perf cannot record here: {err}");
    false
}

/// The line of a `perf report --stdio` text whose last field (the symbol) is
/// `name`, and its share of the samples in percent.
pub fn report_share<'a>(text: &'a str, name: &str) -> (&'a str, f64) {
    let line = text
        .lines()
        .find(|l| l.split_whitespace().last() == Some(name))
        .unwrap_or_else(|| panic!("{name} missing from perf report:\n{text}"));
    let percent = line
        .split_whitespace()
        .next()
        .unwrap()
        .trim_end_matches('%')
        .parse()
        .unwrap();
    (line, percent)
}

/// `perf inject --jit` of `data`, then `perf report --stdio --sort SORT` of the
/// result: the report's text. Either step failing fails the test.
pub fn inject_and_report(dir: &Path, data: &Path, sort: &str) -> String {
    let jit = dir.join("perf.jit.data");
    let (data, jit_path) = (data.to_str().unwrap(), jit.to_str().unwrap());
    let inject = perf(dir, &["inject", "--jit", "-i", data, "-o", jit_path]);
    assert!(
        inject.status.success(),
        "{}",
        String::from_utf8_lossy(&inject.stderr)
    );
    let report = perf(dir, &["report", "-i", jit_path, "--stdio", "--sort", sort]);
    assert!(
        report.status.success(),
        "{}",
        String::from_utf8_lossy(&report.stderr)
    );
    String::from_utf8_lossy(&report.stdout).into_owned()
}

/// A fresh directory for this test process: `jitmap-NAME-PID` under the
/// system's temporary directory, emptied first.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("jitmap-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
