//! Every `jitmap` subcommand given bad values: each exits with status 2
//! before doing any work, and its message names the option, file or process
//! at fault.

use std::process::{Command, Output};

const JITMAP: &str = env!("CARGO_BIN_EXE_jitmap");

fn jitmap(args: &[&str]) -> Output {
    Command::new(JITMAP).args(args).output().unwrap()
}

fn refused(args: &[&str], culprit: &str) {
    jitmap_testkit::e2e::assert_refused(JITMAP, args, culprit);
}

#[test]
fn a_missing_jitdump_is_named() {
    refused(&["jitdump-check", "/nonexistent.dump"], "/nonexistent.dump");
}

#[test]
fn inspect_names_the_process_and_the_address() {
    refused(&["inspect", "--pid", "999999999"], "process 999999999");
    refused(&["inspect", "--pid", "1", "--ip", "0xzz"], "--ip");
    refused(&["inspect", "--pid", "1", "--range", "0x10:4"], "--dotnet");
}

#[test]
fn profile_refuses_bad_values_by_name() {
    for bad in ["0", "-2", "nan", "inf", "1e300"] {
        refused(&["profile", "--pid", "1", "--seconds", bad], "--seconds");
    }
    for bad in ["0", "100001", "-1"] {
        refused(&["profile", "--pid", "1", "--hz", bad], "--hz");
    }
    refused(&["profile", "--overhead", "--pid", "1"], "--pid");
    refused(&["profile", "--overhead", "--json"], "--json");
    refused(&["profile"], "--pid");
}

/// Without the `ebpf` feature the profiler says how to get it; with it, an
/// output directory that cannot be made is refused by name before the
/// profile starts.
/// `--help` says which options have no default: required, or optional.
#[test]
fn profile_help_says_what_has_no_default() {
    let out = jitmap(&["profile", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("Required, unless --overhead"), "{help}");
    assert!(
        help.contains("Without it (the default), only the report is printed"),
        "{help}"
    );
}

#[test]
fn profile_checks_its_output_directory_first() {
    let out = jitmap(&["profile", "--pid", "1", "--out", "/proc/nope"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    if cfg!(feature = "ebpf") {
        assert!(err.contains("/proc/nope"), "{err}");
    } else {
        assert!(
            err.contains("cargo install --path cli --locked --features ebpf"),
            "{err}"
        );
    }
}
