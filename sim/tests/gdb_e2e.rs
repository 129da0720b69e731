//! The GDB JIT interface, end to end with real gdb: a breakpoint on a JIT
//! function's name is hit, and `bt` from inside it shows the name and, from the
//! object's DWARF line table, the source line the function published.

use std::process::Command;

use jitmap_testkit::e2e;

const SIM: &str = env!("CARGO_BIN_EXE_jitmap-sim");

#[test]
fn real_gdb_breaks_in_and_names_a_jit_function() {
    if !e2e::available("gdb") {
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
            "info line *$pc",
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
    // spin's function N starts at line 10 + N of "spin.jit".
    assert_eq!(*hit, "Breakpoint 1, jitmap_spin_1 () at spin.jit:11");
    let frame = lines
        .iter()
        .find(|l| l.starts_with("#0 "))
        .unwrap_or_else(|| panic!("no backtrace:\n{stdout}"));
    assert_eq!(*frame, "#0  jitmap_spin_1 () at spin.jit:11");
    // Its first row covers the 5-byte `mov eax, imm32`.
    let line = lines
        .iter()
        .find(|l| l.starts_with("Line 11 of \"spin.jit\""))
        .unwrap_or_else(|| panic!("no line info:\n{stdout}"));
    assert!(
        line.contains("<jitmap_spin_1> and ends at ") && line.ends_with("<jitmap_spin_1+5>."),
        "{line}"
    );
    // `info symbol` names the function and the in-memory object it came from.
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("jitmap_spin_1 in section .text of <in-memory@")),
        "{stdout}"
    );
}
