//! The GDB JIT interface, end to end with real gdb: a breakpoint on a JIT
//! function's name is hit, and `bt` from inside it shows the name.

use std::process::Command;

const SIM: &str = env!("CARGO_BIN_EXE_jitmap-sim");

#[test]
fn real_gdb_breaks_in_and_names_a_jit_function() {
    let must_run = std::env::var("CI").is_ok_and(|v| v == "true");
    if !cfg!(target_arch = "x86_64") {
        assert!(!must_run, "CI must run the gdb end-to-end test on x86-64");
        println!("skipped: the spin functions are x86-64 code");
        return;
    }
    if Command::new("gdb").arg("--version").output().is_err() {
        assert!(!must_run, "gdb is not installed; .ci/run installs it");
        println!("skipped: gdb is not installed");
        return;
    }
    let out = Command::new("gdb")
        .args([
            "-nx",
            "-batch",
            "-ex",
            "set breakpoint pending on",
            "-ex",
            "break jitmap_spin_1",
            "-ex",
            "run",
            "-ex",
            "bt 1",
            "-ex",
            "info symbol $pc",
            "-ex",
            "kill",
            "--args",
            SIM,
            "spin",
            "--functions",
            "3",
            "--seconds",
            "1",
            "--gdb",
            "--perf",
            "off",
        ])
        .output()
        .expect("gdb runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stdout.lines().collect();
    let hit = lines
        .iter()
        .find(|l| l.starts_with("Breakpoint 1, "))
        .unwrap_or_else(|| panic!("breakpoint not hit:\n{stdout}\n{stderr}"));
    assert!(hit.ends_with(" in jitmap_spin_1 ()"), "{hit}");
    let frame = lines
        .iter()
        .find(|l| l.starts_with("#0 "))
        .unwrap_or_else(|| panic!("no backtrace:\n{stdout}"));
    assert!(frame.ends_with(" in jitmap_spin_1 ()"), "{frame}");
    // `info symbol` names the function and the in-memory object it came from.
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("jitmap_spin_1 in section .text")),
        "{stdout}"
    );
}
