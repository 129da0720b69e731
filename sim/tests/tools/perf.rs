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
