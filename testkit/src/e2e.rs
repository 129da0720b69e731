//! Helpers for the end-to-end tests that run real outside tools (perf, gdb,
//! BPF) against the demo hosts: whether a tool can run here, `perf` with its
//! caches kept in the test's own directory, and the demo's shares.
//!
//! Under `CI=true` (`.ci/run` installs every tool) no such test may skip;
//! elsewhere a test that cannot run its tool says why and passes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Whether this is CI (`CI=true`), where `.ci/run` installed every tool and no
/// end-to-end test may skip.
pub fn must_run() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// The target directory of the cargo run that built the calling test: its
/// `CARGO_TARGET_DIR` when one is set (`.ci/run` keeps every build in a
/// cache outside the clone), a relative one taken from `workspace` (where
/// `.ci/run` and the README run cargo; cargo itself resolves it against the
/// directory it was started in, which a test cannot see), and otherwise
/// `workspace/target`. Tests that build a host of their
/// own in a nested cargo run put it under this, so that it is cached too.
///
/// ```
/// use std::path::Path;
/// let dir = jitmap_testkit::e2e::cargo_target_dir(Path::new("/src/jitmap"));
/// match std::env::var_os("CARGO_TARGET_DIR") {
///     None => assert_eq!(dir, Path::new("/src/jitmap/target")),
///     Some(set) => assert!(dir.ends_with(set)),
/// }
/// ```
pub fn cargo_target_dir(workspace: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => workspace.join(dir),
        _ => workspace.join("target"),
    }
}

/// The demo backend that runs on this machine: the iced demo on x86-64,
/// Cranelift's elsewhere (`jitmap-sim profile --backend`).
pub const NATIVE_DEMO_BACKEND: &str = if cfg!(target_arch = "x86_64") {
    "iced"
} else {
    "cranelift"
};

/// True when the spin functions and the iced demo (x86-64 code) can run
/// here; on aarch64 the test is skipped with the reason printed (in CI too:
/// CI runs it natively on x86-64).
pub fn runs_x86_64() -> bool {
    if cfg!(target_arch = "x86_64") {
        return true;
    }
    println!("skipped on aarch64: the spin functions and the iced demo are x86-64 code");
    false
}

/// True when `tool` runs here and against this process. Otherwise the test
/// is skipped with the reason printed; with `CI=true` it fails instead,
/// because `.ci/run` installs every tool (but on aarch64, where perf, gdb
/// and BPF would watch qemu, not the guest: those skip in CI too).
pub fn available(tool: &str) -> bool {
    if !cfg!(target_arch = "x86_64") && ["perf", "gdb", "bpftool"].contains(&tool) {
        // perf, gdb and BPF see the host (x86-64) kernel and processes, not
        // the emulated guest.
        println!("skipped on aarch64: {tool} does not see into a qemu-user guest");
        return false;
    }
    if Command::new(tool).arg("--version").output().is_err() {
        assert!(!must_run(), "{tool} is not installed; .ci/run installs it");
        println!("skipped: {tool} is not installed");
        return false;
    }
    true
}

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
    assert!(!must_run(), "perf record failed in CI: {err}");
    println!("skipped: perf cannot record here: {err}");
    false
}

/// The first line of a `perf report --stdio` text whose last field (the
/// symbol) is `name`, and that symbol's share of the samples in percent,
/// over every line that names it (perf keeps one line per symbol object:
/// a method loaded twice has two).
pub fn report_share<'a>(text: &'a str, name: &str) -> (&'a str, f64) {
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.split_whitespace().last() == Some(name))
        .collect();
    let first = lines
        .first()
        .unwrap_or_else(|| panic!("{name} missing from perf report:\n{text}"));
    let percent = lines
        .iter()
        .map(|l| {
            l.split_whitespace()
                .next()
                .unwrap()
                .trim_end_matches('%')
                .parse::<f64>()
                .unwrap()
        })
        .sum();
    (first, percent)
}

/// The share, in percent, of the `perf report --stdio` line whose symbol
/// ends with `suffix`: for names a runtime writes with a prefix of its own
/// (wasmtime's jitdump names a guest function `wasm[0]::function[1]::leaf`).
pub fn report_share_ending(text: &str, suffix: &str) -> f64 {
    let line = text
        .lines()
        .find(|l| {
            l.split_whitespace()
                .last()
                .is_some_and(|s| s.ends_with(suffix))
        })
        .unwrap_or_else(|| panic!("{suffix} missing from perf report:\n{text}"));
    line.split_whitespace()
        .next()
        .unwrap()
        .trim_end_matches('%')
        .parse()
        .unwrap()
}

/// `perf ARGS` run to completion in `dir`: its standard output. A failure
/// fails the test, with perf's message.
fn perf_ok(dir: &Path, args: &[&str]) -> String {
    let out = perf(dir, args);
    assert!(
        out.status.success(),
        "perf {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `perf inject --jit` of `data` into `dir/perf.jit.data`: that path.
fn inject(dir: &Path, data: &Path) -> PathBuf {
    let jit = dir.join("perf.jit.data");
    let (data, jit_path) = (data.to_str().unwrap(), jit.to_str().unwrap());
    perf_ok(dir, &["inject", "--jit", "-i", data, "-o", jit_path]);
    jit
}

/// `perf inject --jit` of `data`, then `perf report --stdio --sort SORT` of the
/// result: the report's text. Either step failing fails the test.
pub fn inject_and_report(dir: &Path, data: &Path, sort: &str) -> String {
    let jit = inject(dir, data);
    let jit = jit.to_str().unwrap();
    perf_ok(dir, &["report", "-i", jit, "--stdio", "--sort", sort])
}

/// `perf inject --jit` of `data`, then its samples' stacks from
/// `perf script`: each stack's frames, innermost first, named by perf's
/// symbols (`[unknown]` where it has none). Either step failing fails the
/// test.
pub fn inject_and_script(dir: &Path, data: &Path) -> Vec<Vec<String>> {
    let jit = inject(dir, data);
    let text = perf_ok(
        dir,
        &["script", "-i", jit.to_str().unwrap(), "-F", "ip,sym"],
    );
    // One sample per block of lines, blocks apart by an empty line; each
    // line is an address, then the symbol (which may hold spaces).
    text.split("\n\n")
        .map(|block| {
            block
                .lines()
                .filter_map(|line| {
                    let line = line.trim();
                    let (_address, symbol) = line.split_once(char::is_whitespace)?;
                    Some(symbol.trim().to_owned())
                })
                .collect::<Vec<_>>()
        })
        .filter(|frames| !frames.is_empty())
        .collect()
}

/// A fresh directory for this test process: `jitmap-NAME-PID` under the
/// system's temporary directory, emptied first.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("jitmap-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

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
/// `out`, with jitdump on. `host` is the command that runs the demo host and
/// takes `profile`'s options (`jitmap-sim profile`, or a test's own host).
pub fn record_demo(host: &[&str], dir: &Path, data: &Path, seconds: &str, out: &Path) -> Command {
    let options = [
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
    let command: Vec<&str> = host.iter().copied().chain(options).collect();
    record(dir, data, Some(2000), &command)
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

/// Runs `binary args...` and asserts that it refused them the way both of
/// jitmap's binaries refuse bad input: exit status 2, nothing on stdout (no
/// work was done), no panic, and `culprit` (the option, file or process at
/// fault) in the message.
pub fn assert_refused(binary: &str, args: &[&str], culprit: &str) {
    let out = Command::new(binary).args(args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(out.stdout.is_empty(), "{args:?} did work: {out:?}");
    assert!(
        err.contains(culprit),
        "{args:?}: {culprit:?} not in {err:?}"
    );
    assert!(!err.contains("panicked"), "{args:?}: {err}");
}

/// `GET path` from `host` over HTTP/1.0, for the pprof endpoint's tests:
/// the status code and the body.
pub fn http_get(host: &str, path: &str) -> (u16, Vec<u8>) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(host).unwrap();
    // No answer within the longest profile a test asks for plus a margin is
    // a failure, not a hang.
    s.set_read_timeout(Some(std::time::Duration::from_secs(120)))
        .unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").unwrap();
    let mut response = Vec::new();
    s.read_to_end(&mut response).unwrap();
    let end = response.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let status = String::from_utf8_lossy(&response[..end])
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap();
    (status, response[end + 4..].to_vec())
}
