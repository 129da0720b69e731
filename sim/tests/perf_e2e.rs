//! jitdump in real processes: a child killed mid-run leaves a file that validates
//! up to a record boundary, and real `perf` names the JIT functions.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use jitmap::perf::check::{Body, Violation, check};

use jitmap_testkit::e2e::{self, inject_and_report, record, recorded, report_share, temp_dir};

const SIM: &str = env!("CARGO_BIN_EXE_jitmap-sim");

#[test]
fn killed_writer_leaves_a_valid_prefix() {
    if !jitmap_testkit::e2e::runs_x86_64() {
        return;
    }
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

#[test]
fn real_perf_names_jit_functions() {
    if !e2e::available("perf") {
        return;
    }
    let dir = temp_dir("perf-e2e");
    let data = dir.join("perf.data");
    let spin = [SIM, "spin", "--functions", "4", "--seconds", "2"];
    let out = record(&dir, &data, None, &spin).output().unwrap();
    if !recorded(&out) {
        return;
    }
    let text = inject_and_report(&dir, &data, "dso,sym");
    for id in 0..4 {
        let (line, percent) = report_share(&text, &format!("jitmap_spin_{id}"));
        assert!(percent > 1.0, "jitmap_spin_{id} has {percent}% of samples");
        assert!(line.contains("jitted-"), "{line}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `spin` with its outputs on a file-size limit (a full disk, as a writer
/// sees it): the dump and the map stop at their last whole record, and the
/// command says on stderr how many events each lost and why.
#[test]
fn outputs_cut_short_by_a_full_disk_are_reported_and_stay_valid() {
    if !jitmap_testkit::e2e::runs_x86_64() {
        return;
    }
    let dir = temp_dir("full-disk-spin");
    // 64 KiB files. SIGXFSZ keeps its default action (end the process): the
    // writers fail a write past the limit with EFBIG, as a write to a full
    // disk fails with ENOSPC, and take the signal it raised.
    let out = Command::new("bash")
        .args([
            "-c",
            "trap - XFSZ; ulimit -f 64; exec \"$0\" spin --functions 4 --churn --seconds 1 --perf both",
            SIM,
        ])
        .env("JITMAP_PERF_DIR", &dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let warning = |what: &str| {
        stderr
            .lines()
            .find(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no warning for {what} in {stderr}"))
            .to_owned()
    };
    let dump = warning(".dump:");
    assert!(
        dump.contains("code events not written after a write failed: File too large"),
        "{dump}"
    );
    let lost: u64 = dump
        .split(".dump: ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {dump}"));
    assert!(lost > 0, "{dump}");
    let map = warning(".map:");
    assert!(
        map.contains("lines not written after a write failed: File too large"),
        "{map}"
    );
    let path = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "dump"))
        .unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let report = check(&bytes);
    assert_eq!(report.violations, vec![], "the dump does not validate");
    assert_eq!(report.clean_len, bytes.len());
    assert!(bytes.len() <= 64 * 1024);
    std::fs::remove_dir_all(&dir).unwrap();
}
