//! `jitmap-sim replay`: exact output, error lines, exit status, and round-trips.

use std::io::Write;
use std::process::{Command, Stdio};

use jitmap::MapVersion;
use jitmap_sim::replay::{self, Command as Op, ReplayError, parse_line};

/// Runs `jitmap-sim replay ARGS` with `stdin`: its stdout and exit status;
/// what it says on stderr is returned by [`replay_bin_stderr`].
fn replay_bin(args: &[&str], stdin: &str) -> (String, i32) {
    let (out, code, _) = replay_bin_stderr(args, stdin);
    (out, code)
}

fn replay_bin_stderr(args: &[&str], stdin: &str) -> (String, i32, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_jitmap-sim"))
        .arg("replay")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        String::from_utf8(out.stdout).unwrap(),
        out.status.code().unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn spec_script_v2_exact_output() {
    let script = "# spec\n\nheap 4096\nset 0x130 1024\ndump\nfind 1300\nfind 306\nfind 302\n";
    let (out, code) = replay_bin(&["--map", "v2", "-"], script);
    assert_eq!(
        out,
        "word 1 0x05000000\nword 2 0x00000139\nword 3 0x00000139\nword 4 0x00000139\nend\n\
         find 0x514 0x130\nfind 0x132 0x130\nfind 0x12e none\n"
    );
    assert_eq!(code, 0);
}

#[test]
fn map_line_overrides_flag() {
    let (out, code) = replay_bin(
        &["--map", "v2", "-"],
        "map v1\nheap 0x1000\nset 0x200 0x400\ndump\n",
    );
    assert_eq!(out, "word 2 0x10000000\nend\n");
    assert_eq!(code, 0);
}

#[test]
fn failing_lines_report_and_continue() {
    let script = "set 0 4\nheap 0x1000\nmap v1\nset 0x200 0x400\nset 0x204 4\nbogus 1\nset 0x10\n\
                  del 0x300\nfind 0xzz\nheap 5\nset 3 4\nfind 0x5ff\n";
    let (out, code) = replay_bin(&["-"], script);
    assert_eq!(
        out,
        "error 1 no heap: 'heap SIZE' must come first\n\
         error 3 'map' must come before 'heap'\n\
         error 5 start 0x204 shares a 32-byte bucket with start 0x200\n\
         error 6 unknown command \"bogus\"\n\
         error 7 missing argument\n\
         error 8 no start at 0x300\n\
         error 9 bad number \"0xzz\"\n\
         error 10 heap already set\n\
         error 11 start 0x3 is not 4-byte aligned\n\
         find 0x5ff 0x200\n"
    );
    assert_eq!(code, 1);
}

#[test]
fn missing_file_is_a_distinct_exit_status() {
    let (out, code, err) = replay_bin_stderr(&["/nonexistent/script"], "");
    assert_eq!((out.as_str(), code), ("", 2));
    assert_eq!(
        err,
        "jitmap-sim replay: failed to open file `/nonexistent/script`: \
         No such file or directory (os error 2)\n"
    );
}

#[test]
fn parse_round_trips() {
    let ops = [
        Op::Map(MapVersion::V1),
        Op::Heap(0x10000),
        Op::Set(0x130, 0x400),
        Op::Del(0x130),
        Op::Find(u64::MAX),
        Op::Dump,
    ];
    for op in ops {
        assert_eq!(parse_line(&op.to_string()), Ok(Some(op)));
    }
    assert_eq!(parse_line("set 1 2 3"), Err(ReplayError::ExtraArgument));
    assert_eq!(parse_line("  # comment"), Ok(None));
    assert_eq!(
        parse_line("find 18446744073709551616"),
        Err(ReplayError::BadNumber("18446744073709551616".into()))
    );
}

#[test]
fn heap_of_4_gib_is_rejected() {
    let mut out = Vec::new();
    let ok = replay::run("heap 0x100000000\nfind 0\n", MapVersion::V2, &mut out).unwrap();
    assert!(!ok);
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "error 1 span 0x100000000 is 4 GiB or more\nerror 2 no heap: 'heap SIZE' must come first\n"
    );
}
