//! Every `jitmap-sim` subcommand given the bad values a new user tried: each
//! exits with status 2 before doing any work, and its message names the
//! option or file at fault.

use std::process::{Command, Output};

const SIM: &str = env!("CARGO_BIN_EXE_jitmap-sim");

fn sim(args: &[&str]) -> Output {
    Command::new(SIM).args(args).output().unwrap()
}

fn refused(args: &[&str], culprit: &str) {
    jitmap_testkit::e2e::assert_refused(SIM, args, culprit);
}

#[test]
fn seconds_that_no_run_can_take_are_refused_everywhere() {
    for bad in ["0", "-2", "nan", "inf", "1e300"] {
        for sub in ["run", "stress", "spin", "profile"] {
            refused(&[sub, "--seconds", bad], "--seconds");
        }
        refused(&["profile", "--overhead", "--seconds", bad], "--seconds");
    }
}

#[test]
fn thread_counts_and_rates_out_of_range_are_refused() {
    for bad in ["0", "100000", "-1"] {
        refused(&["stress", "--threads", bad], "--threads");
        refused(&["run", "--threads", bad], "--threads");
    }
    // A stress run needs a writer and a reader.
    refused(
        &["stress", "--threads", "1"],
        "--threads must be at least 2",
    );
    for bad in ["0", "100001", "-5"] {
        refused(&["run", "--hz", bad], "--hz");
        refused(&["profile", "--hz", bad], "--hz");
    }
}

#[test]
fn output_paths_are_checked_before_the_work_and_named() {
    refused(&["run", "--out", "/proc/nope"], "/proc/nope");
    refused(&["profile", "--out", "/proc/nope"], "/proc/nope");
    refused(&["compare", "--plot", "/proc/nope.svg"], "/proc/nope.svg");
    // An existing file where a directory is asked for is named as such.
    let file = std::env::temp_dir().join(format!("jitmap-out-file-{}", std::process::id()));
    std::fs::write(&file, b"").unwrap();
    let path = file.to_str().unwrap();
    refused(
        &["profile", "--seconds", "1", "--out", path],
        &format!("{path} is a file, not a directory"),
    );
    std::fs::remove_file(&file).unwrap();
}

/// Every subcommand says what it does in `--help`.
#[test]
fn every_subcommand_is_described() {
    let out = sim(&["--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    let commands: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .collect();
    assert!(commands.len() >= 7, "{help}");
    for line in commands {
        let mut words = line.split_whitespace();
        let name = words.next().unwrap();
        assert!(
            words.next().is_some(),
            "`{name}` has no description:\n{help}"
        );
    }
}

#[test]
fn an_unknown_backend_is_named_with_the_ones_there_are() {
    for sub in ["run", "profile"] {
        refused(&[sub, "--backend", "llvm"], "--backend");
        let out = sim(&[sub, "--backend", "llvm"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("unknown backend \"llvm\"; the backends are: cranelift, iced"),
            "{sub}: {err}"
        );
    }
}

#[test]
fn a_missing_script_is_named() {
    refused(&["replay", "/nonexistent"], "/nonexistent");
}

#[test]
fn spin_blames_its_own_options() {
    refused(&["spin", "--functions", "100000000"], "--functions");
    refused(&["spin", "--functions", "0"], "--functions");
    refused(
        &["spin", "--functions", "100000", "--pad", "1048576"],
        "--functions 100000 with --pad 1048576",
    );
    refused(&["spin", "--perf", "bogus"], "--perf");
    refused(&["spin", "--pad", "1048577"], "--pad");
}

#[test]
fn profile_overhead_refuses_the_options_it_would_ignore() {
    refused(&["profile", "--overhead", "--hz", "100"], "--hz");
    refused(&["profile", "--overhead", "--json"], "--json");
    refused(&["profile", "--overhead", "--clock", "wall"], "--clock");
}

#[test]
fn an_unknown_scenario_is_named() {
    refused(&["run", "--scenario", "nope"], "--scenario");
}

/// The command that once livelocked: 100 kHz on the wall clock, in the
/// tests' (debug) build. The agent samples at most 10 kHz, so the run says
/// it holds the rate there, and a handler that still cannot keep up backs
/// its thread off; every run ends, and its report names the rate it ran at.
#[test]
fn the_command_that_hung_ends_every_time_and_names_its_rate() {
    // Under qemu-user each signal costs far more; fewer runs keep the
    // suite's time.
    let runs = if cfg!(target_arch = "x86_64") { 20 } else { 3 };
    let dir = std::env::temp_dir().join(format!("jitmap-sim-rates-{}", std::process::id()));
    let args = [
        "profile",
        "--backend",
        jitmap_testkit::e2e::NATIVE_DEMO_BACKEND,
        "--hz",
        "100000",
        "--clock",
        "wall",
        "--seconds",
        "1",
        "--out",
        dir.to_str().unwrap(),
    ];
    for run in 0..runs {
        let mut child = Command::new(SIM)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // A cap, not a timing: a run takes about 1 s; a hung one never ends.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                child.kill().unwrap();
                panic!("run {run} of `jitmap-sim {}` did not end", args.join(" "));
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let out = child.wait_with_output().unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert_eq!(out.status.code(), Some(0), "run {run}: {stderr}");
        assert!(
            stderr.contains(
                "--hz 100000 is over the agent's 10000 Hz (a timer period under 100 µs keeps \
                 a thread in its signal handler): sampling at 10000 Hz"
            ),
            "run {run}: {stderr}"
        );
        let rate = stdout
            .lines()
            .find(|l| l.starts_with("rate: "))
            .unwrap_or_else(|| panic!("run {run}: no rate line in {stdout}"));
        // Kept; or backed off; or, on a busy machine, kept but its signals
        // coalesced while the thread waited for a CPU (each counted whole).
        assert!(
            rate == "rate: 10000 Hz asked, and kept"
                || rate.starts_with(
                    "rate: 10000 Hz asked; 1 of 1 thread(s) backed off, the slowest to "
                )
                || (rate.starts_with("rate: 10000 Hz asked; signals came at ")
                    && rate.contains(" Hz of attached time, each standing for ")
                    && rate.ends_with(
                        " periods on average (the threads waited for a CPU, or blocked the \
                         signal)"
                    )),
            "run {run}: {rate}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The agent at its highest rate on the wall clock may drop samples on a
/// busy machine; a run that dropped more than 1% says so on stderr, and one
/// that did not stays quiet.
#[test]
fn a_profile_that_dropped_samples_says_so() {
    let dir = std::env::temp_dir().join(format!("jitmap-sim-drops-{}", std::process::id()));
    let out = sim(&[
        "profile",
        "--backend",
        jitmap_testkit::e2e::NATIVE_DEMO_BACKEND,
        "--hz",
        "10000",
        "--clock",
        "wall",
        "--seconds",
        "1",
        "--json",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (taken, dropped) = (
        report["taken"].as_u64().unwrap(),
        report["dropped"].as_u64().unwrap(),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    let warned = err.contains(&format!("warning: {dropped} of {taken} timer interrupts"));
    assert_eq!(
        warned,
        dropped * 100 > taken,
        "taken {taken}, dropped {dropped}, stderr {err:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
