//! `jitmap profile` (the eBPF profiler) against real hosts: the demo profiled three ways
//! (in-process agent, perf with jitdump, eBPF from outside) in one run; churning
//! hosts (v2, and v1 with methods deep enough for the capped walk) whose every
//! eBPF-named placement must be one the host published; and the bad inputs.
//!
//! Needs root (BPF) and x86-64 (the hosts run x86-64 code). With `CI=true`
//! nothing may be skipped; elsewhere a test says why it skips.

// Without the profiler only `host::main` runs here.
#[cfg_attr(not(feature = "ebpf"), expect(dead_code))]
mod host;

/// Runs the tests, or, started as a host, the host (see `host/mod.rs`).
/// Without the `ebpf` feature there is no profiler to test.
fn main() {
    #[cfg(feature = "ebpf")]
    host::main(&tests::ALL);
    #[cfg(not(feature = "ebpf"))]
    {
        println!("the eBPF profiler's tests need --features ebpf");
        host::main(&[]);
    }
}

#[cfg(feature = "ebpf")]
mod tests {
    use std::collections::HashSet;
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command, Output, Stdio};
    use std::time::{Duration, Instant};

    use jitmap_testkit::demo::{LEAVES, MIDDLE, NATIVE_CALLER, TOP};
    use jitmap_testkit::e2e::{
        self, assert_outputs, inject_and_report, json_share, must_run, normalized, one_run,
        record_demo, report_share, runs_x86_64, temp_dir,
    };

    use crate::host;

    const JITMAP: &str = env!("CARGO_BIN_EXE_jitmap");

    /// The tests, by name.
    pub const ALL: [(&str, fn()); 13] = [
        (
            "a_wasmtime_guest_is_named_alike_by_the_agent_perf_and_ebpf",
            a_wasmtime_guest_is_named_alike_by_the_agent_perf_and_ebpf,
        ),
        (
            "jit_code_without_frame_pointers_is_walked_by_its_unwind_rows",
            jit_code_without_frame_pointers_is_walked_by_its_unwind_rows,
        ),
        (
            "a_native_frame_is_named_with_its_inlined_helpers",
            a_native_frame_is_named_with_its_inlined_helpers,
        ),
        (
            "a_frameless_native_leaf_under_jit_code_is_detected_and_counted",
            a_frameless_native_leaf_under_jit_code_is_detected_and_counted,
        ),
        (
            "agent_perf_and_ebpf_agree_on_one_run",
            agent_perf_and_ebpf_agree_on_one_run,
        ),
        (
            "agent_perf_and_ebpf_agree_on_one_run_on_cranelift",
            agent_perf_and_ebpf_agree_on_one_run_on_cranelift,
        ),
        (
            "a_churning_v2_host_is_never_misnamed",
            a_churning_v2_host_is_never_misnamed,
        ),
        (
            "a_churning_v1_host_within_the_walk_cap_is_never_misnamed",
            a_churning_v1_host_within_the_walk_cap_is_never_misnamed,
        ),
        (
            "a_v1_method_beyond_the_walk_cap_is_too_far_never_wrong",
            a_v1_method_beyond_the_walk_cap_is_too_far_never_wrong,
        ),
        (
            "bad_input_and_missing_privileges_exit_2_with_a_reason",
            bad_input_and_missing_privileges_exit_2_with_a_reason,
        ),
        (
            "a_stripped_host_that_exits_ends_the_profile_with_what_it_took",
            a_stripped_host_that_exits_ends_the_profile_with_what_it_took,
        ),
        (
            "sigint_ends_the_profile_with_its_outputs",
            sigint_ends_the_profile_with_its_outputs,
        ),
        (
            "a_long_name_is_cut_at_256_bytes_and_says_so",
            a_long_name_is_cut_at_256_bytes_and_says_so,
        ),
    ];

    /// A host process, killed when dropped.
    struct Host(Child);

    impl Drop for Host {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// A spin host writing its perf map into `dir`.
    fn spin(dir: &Path, args: &[&str]) -> Host {
        Host(
            host::spin(args)
                .env("JITMAP_PERF", "map")
                .env("JITMAP_PERF_DIR", dir)
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
        )
    }

    /// `ebpf-profile --pid PID --seconds SECONDS --json EXTRA...`.
    fn ebpf_profile(pid: impl ToString, seconds: &str, extra: &[&str]) -> Output {
        ebpf_command(pid, seconds, extra).output().unwrap()
    }

    /// The command [`ebpf_profile`] runs, to start it in the background.
    fn ebpf_command(pid: impl ToString, seconds: &str, extra: &[&str]) -> Command {
        let mut command = Command::new(JITMAP);
        command
            .args(["profile", "--json", "--seconds", seconds, "--pid"])
            .arg(pid.to_string())
            .args(extra);
        command
    }

    /// The longest a test waits for an event (a host publishing, a profile
    /// starting, a host using CPU): far beyond any idle or loaded run.
    const EVENT_CAP: Duration = Duration::from_secs(60);

    /// Waits until the host `pid` has published `n` functions (its perf map
    /// in `dir` has that many lines).
    fn wait_published(dir: &Path, pid: u32, n: usize) {
        let deadline = Instant::now() + EVENT_CAP;
        let map = dir.join(format!("perf-{pid}.map"));
        while std::fs::read_to_string(&map).map_or(0, |t| t.lines().count()) < n {
            assert!(
                Instant::now() < deadline,
                "the host never published {n} functions"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until the host `pid` has published its descriptor: from then
    /// on a profile can read it.
    fn wait_descriptor(pid: u32) {
        let deadline = Instant::now() + EVENT_CAP;
        while jitmap::remote::process::find_descriptor(pid as i32).is_err() {
            assert!(
                Instant::now() < deadline,
                "the host never published its descriptor"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// CPU time process `pid` has used, in clock ticks (utime + stime).
    fn cpu_ticks(pid: u32) -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // pid (comm) state ppid ... utime stime: fields 14 and 15, the 12th
        // and 13th after the comm.
        let Some((_, rest)) = stat.rsplit_once(") ") else {
            return 0;
        };
        let fields: Vec<u64> = rest
            .split_whitespace()
            .skip(11)
            .take(2)
            .filter_map(|f| f.parse().ok())
            .collect();
        fields.iter().sum()
    }

    /// Waits until process `pid` has used `ticks` more clock ticks of CPU:
    /// samples taken meanwhile, however busy the machine is.
    fn wait_cpu(pid: u32, ticks: u64) {
        let deadline = Instant::now() + EVENT_CAP;
        let goal = cpu_ticks(pid) + ticks;
        while cpu_ticks(pid) < goal {
            assert!(
                Instant::now() < deadline,
                "the host never ran {ticks} ticks"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A profiler running in the background, once it samples its host.
    struct Profiler {
        child: Child,
        /// The rest of its stderr, read by a thread so that it never blocks.
        stderr: std::thread::JoinHandle<String>,
        /// What it wrote before it sampled (a reason, if it could not).
        early: String,
    }

    impl Profiler {
        /// Starts [`ebpf_command`] and waits until it says it samples, or
        /// ends without doing so.
        fn start(pid: u32, seconds: &str, extra: &[&str]) -> Self {
            use std::io::BufRead;
            let mut child = ebpf_command(pid, seconds, extra)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
            let mut early = String::new();
            loop {
                let mut line = String::new();
                if err.read_line(&mut line).unwrap() == 0 {
                    break;
                }
                let sampling = line.contains("sampling process");
                early.push_str(&line);
                if sampling {
                    break;
                }
            }
            let stderr = std::thread::spawn(move || {
                let mut rest = String::new();
                std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
                rest
            });
            Self {
                child,
                stderr,
                early,
            }
        }

        /// Waits for it to end; its output, stderr whole.
        fn output(self) -> Output {
            let mut out = self.child.wait_with_output().unwrap();
            let rest = self.stderr.join().unwrap();
            out.stderr = format!("{}{rest}", self.early).into_bytes();
            out
        }
    }

    /// Whether the profile ran; if BPF is unavailable (no privileges, an old
    /// kernel), skips with the reason, or fails under `CI=true`.
    fn ran(out: &Output) -> bool {
        if out.status.success() {
            return true;
        }
        let err = String::from_utf8_lossy(&out.stderr);
        let no_bpf = out.status.code() == Some(2)
            && (err.contains("missing privileges") || err.contains("BPF:"));
        assert!(no_bpf, "ebpf-profile failed: {err}");
        assert!(!must_run(), "BPF must work in CI: {err}");
        println!("skipped: BPF is not available here: {err}");
        false
    }

    fn json(out: &Output) -> serde_json::Value {
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// The child of `parent` running this test binary (as the host), once it
    /// exists.
    fn child_of(parent: u32) -> i32 {
        let exe = host::executable();
        let name = exe.file_name().unwrap().to_string_lossy();
        // The kernel keeps the first 15 bytes of a process's name.
        let comm = format!("({}", &name[..name.len().min(15)]);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            for entry in std::fs::read_dir("/proc").unwrap().flatten() {
                let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                    continue;
                };
                let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                    continue;
                };
                // pid (comm) state ppid ...
                let Some((process, rest)) = stat.split_once(") ") else {
                    continue;
                };
                let ppid = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok());
                if ppid == Some(parent) && process.ends_with(&comm) {
                    return pid;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("perf never started the host");
    }

    /// The placements the host published, from its perf map (read after it
    /// exited, so complete): (start, size, name).
    fn published(dir: &Path, pid: u32) -> HashSet<(u64, u64, String)> {
        let text = std::fs::read_to_string(dir.join(format!("perf-{pid}.map"))).unwrap();
        text.lines()
            .map(|l| {
                let mut f = l.splitn(3, ' ');
                let start = u64::from_str_radix(f.next().unwrap(), 16).unwrap();
                let size = u64::from_str_radix(f.next().unwrap(), 16).unwrap();
                (start, size, f.next().unwrap().to_owned())
            })
            .collect()
    }

    fn agent_perf_and_ebpf_agree_on_one_run() {
        agree_on_one_run("iced");
    }

    /// The same on the demo compiled by Cranelift (jitmap-cranelift), with
    /// the same names and method ids.
    fn agent_perf_and_ebpf_agree_on_one_run_on_cranelift() {
        agree_on_one_run("cranelift");
    }

    fn agree_on_one_run(backend: &str) {
        if !e2e::available("perf") {
            return;
        }
        let _one = one_run();
        let dir = temp_dir(&format!("ebpf-agree-{backend}"));
        let data = dir.join("perf.data");
        let agent_out = dir.join("agent");
        let ebpf_out = dir.join("ebpf");
        // perf starts the demo host with jitdump on, and samples it too.
        let exe = host::executable();
        let host = [exe.to_str().unwrap(), "--backend", backend];
        let mut record = record_demo(&host, &dir, &data, "6", &agent_out);
        let record = host::as_host(&mut record, "profile")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let host = child_of(record.id());
        wait_descriptor(host as u32);
        let ebpf_dir = ebpf_out.to_str().unwrap();
        // 4,000 samples, or what it takes until the demo ends.
        let out = ebpf_profile(
            host,
            "60",
            &["--hz", "2000", "--samples", "4000", "--out", ebpf_dir],
        );
        let record_out = record.wait_with_output().unwrap();
        if !ran(&out) {
            return;
        }
        if !e2e::recorded(&record_out) {
            return;
        }
        let agent: serde_json::Value = serde_json::from_slice(&record_out.stdout).unwrap();
        let ebpf = json(&out);
        let summary = format!(
            "samples {} stale {} (native rows busy {}) empty {} lost {} unattributed {} frames {} reads {}",
            ebpf["samples"],
            ebpf["stale_samples"],
            ebpf["kernel"]["native_busy"],
            ebpf["empty_samples"],
            ebpf["lost"],
            ebpf["unattributed"],
            ebpf["frames"],
            ebpf["reads_per_jit_frame"]
        );
        assert_eq!(agent["wrong"], 0);
        // The eBPF side: nothing lost, dropped, unattributed or unreadable on a
        // host that does not change its code.
        assert!(ebpf["samples"].as_u64().unwrap() >= 1000, "{summary}");
        for counter in ["stale_samples", "empty_samples", "lost", "unattributed"] {
            assert_eq!(ebpf[counter], 0, "{counter}: {summary}");
        }
        for kind in ["errors", "too_far", "stale", "nothing"] {
            assert_eq!(ebpf["frames"][kind], 0, "{kind}: {summary}");
        }
        // The kernel's count of samples is the user side's, exactly, but
        // for samples of a host already exiting (its memory going away), if
        // the demo ended before the samples asked for arrived.
        let unreadable = ebpf["kernel"]["unreadable_samples"].as_u64().unwrap();
        if ebpf["host_exited"] == false {
            assert_eq!(unreadable, 0, "{summary}");
        }
        assert_eq!(
            ebpf["kernel"]["samples"].as_u64().unwrap(),
            ebpf["samples"].as_u64().unwrap() + unreadable,
            "{summary}"
        );
        assert_eq!(ebpf["kernel"]["frames"], ebpf["frames"]["all"]);
        // v2: at most 13 reads for a method frame (5 levels, a fragment, the
        // trailer, two words, the prefix, the header, the name, the sequence).
        // Cranelift's methods carry unwind rows (three: entry, after the
        // push, after the frame is set up), which a walked frame searches in
        // at most two reads, then reads its row.
        let rows = if backend == "cranelift" { 3 } else { 0 };
        let max_reads = ebpf["reads_per_jit_frame"]["max"].as_u64().unwrap();
        assert!((12..=13 + rows).contains(&max_reads), "{summary}");
        // The five functions, with the ids the demo published them under.
        let mut placements: Vec<(String, u64)> = ebpf["placements"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["name"].as_str().unwrap().to_owned(),
                    p["method_id"].as_u64().unwrap(),
                )
            })
            .collect();
        placements.sort();
        let expected: Vec<(String, u64)> = [
            ("leaf_1x", 1),
            ("leaf_2x", 2),
            ("leaf_4x", 3),
            (MIDDLE, 4),
            (TOP, 5),
        ]
        .iter()
        .map(|&(n, id)| (n.to_owned(), id))
        .collect();
        assert_eq!(placements, expected);
        // Every leaf sample has exactly leaf;middle;top;native caller.
        let folded = std::fs::read_to_string(ebpf_out.join("stacks.folded")).unwrap();
        let (mut in_leaves, mut exact) = (0u64, 0u64);
        for line in folded.lines() {
            let (stack, count) = line.rsplit_once(' ').unwrap();
            let count: u64 = count.parse().unwrap();
            if LEAVES.iter().any(|l| stack.ends_with(l)) {
                in_leaves += count;
                let frames: Vec<&str> = stack.split(';').collect();
                if frames.len() >= 4
                    && frames[frames.len() - 4..frames.len() - 1] == [NATIVE_CALLER, TOP, MIDDLE]
                {
                    exact += count;
                }
            }
        }
        // The kernel walks frame pointers: a sample on a leaf's first
        // instruction (before `push rbp`) misses `middle`, as it would for perf.
        assert!(
            exact * 100 >= in_leaves * 99,
            "{exact} of {in_leaves}:\n{folded}"
        );
        let samples = ebpf["samples"].as_u64().unwrap();
        // On failure, say where the other samples went: the heaviest stacks that
        // do not end in a leaf.
        let others = || {
            let mut lines: Vec<(u64, &str)> = folded
                .lines()
                .filter(|l| {
                    !LEAVES
                        .iter()
                        .any(|leaf| l.rsplit_once(' ').unwrap().0.ends_with(leaf))
                })
                .map(|l| {
                    let (stack, count) = l.rsplit_once(' ').unwrap();
                    (count.parse().unwrap(), stack)
                })
                .collect();
            lines.sort_unstable_by(|a, b| b.cmp(a));
            lines
                .iter()
                .take(12)
                .map(|(count, stack)| format!("{count} {stack}"))
                .collect::<Vec<_>>()
                .join("\n")
        };
        // The agent runs in the host too: its handler on the demo thread
        // (unoptimized in a debug build) and its collector. Samples in the
        // library's own frames are the agent's cost, named right, not a
        // misattribution; so are those in the signal's return (`__restore_rt`:
        // the kernel's sigreturn, and the next signal's delivery when one is
        // pending). They took up to a sixth of the samples on a busy machine,
        // and once 64 % (40 % in the handler, most of it its binary search of
        // the native rows, and 24 % in the return; the agent's own report
        // said 2000 Hz kept, no back-off), in a cold CI run on 2026-11-28.
        let agent_own: u64 = folded
            .lines()
            .map(|l| l.rsplit_once(' ').unwrap())
            .filter(|(stack, _)| !LEAVES.iter().any(|leaf| stack.ends_with(leaf)))
            .filter(|(stack, _)| {
                stack.ends_with(";__restore_rt")
                    || stack.split(';').any(|f| f.starts_with("jitmap::"))
            })
            .map(|(_, count)| count.parse::<u64>().unwrap())
            .sum();
        assert!(
            (in_leaves + agent_own) * 10 >= samples * 9,
            "{in_leaves} in the leaves and {agent_own} in the agent of {samples}; heaviest other stacks:\n{}",
            others()
        );
        assert_outputs(&ebpf_out);
        // The three profilers, leaf by leaf.
        let text = inject_and_report(&dir, &data, "sym");
        let from_agent = normalized(LEAVES.map(|l| json_share(&agent, l)));
        let from_perf = normalized(LEAVES.map(|l| report_share(&text, l).1));
        let from_ebpf = normalized(LEAVES.map(|l| json_share(&ebpf, l)));
        println!("agent {from_agent:.1?} perf {from_perf:.1?} ebpf {from_ebpf:.1?}");
        // Each share is a proportion of n samples in the leaves, with a
        // standard error of at most 100 * sqrt(1/4 / n) points; two of them
        // differ by at most sqrt(2) times that in one standard error. Four
        // standard errors of the smallest profile (eBPF's, from fewer samples
        // on a busy machine), and never under 3 points: 4 * 100 *
        // sqrt(1/2 / n) = 283 / sqrt(n), 4.5 points at 4,000 samples.
        let tolerance = (283.0 / (in_leaves.max(1) as f64).sqrt()).max(3.0);
        println!(
            "shares may differ by {tolerance:.1} points ({in_leaves} eBPF samples in the leaves)"
        );
        for i in 0..3 {
            let three = [from_agent[i], from_perf[i], from_ebpf[i]];
            let (lo, hi) = three
                .iter()
                .fold((f64::MAX, f64::MIN), |(lo, hi), &s| (lo.min(s), hi.max(s)));
            assert!(
                hi - lo <= tolerance,
                "{}: agent {:.1}%, perf {:.1}%, ebpf {:.1}% (of the leaves' samples)",
                LEAVES[i],
                three[0],
                three[1],
                three[2]
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The WebAssembly guest (three leaves doing 1, 2 and 4 units of work)
    /// in a wasmtime host registered with jitmap-wasmtime, profiled in one
    /// run by the agent inside it, by perf with wasmtime's own jitdump (the
    /// runtime's oracle), and by eBPF from outside through the descriptor's
    /// image table: every guest frame named, and the three agree.
    fn a_wasmtime_guest_is_named_alike_by_the_agent_perf_and_ebpf() {
        if !e2e::available("perf") {
            return;
        }
        let _one = one_run();
        let dir = temp_dir("ebpf-wasm");
        let data = dir.join("perf.data");
        let agent_out = dir.join("agent");
        let ebpf_out = dir.join("ebpf");
        let exe = host::executable();
        let mut record = record_demo(&[exe.to_str().unwrap()], &dir, &data, "8", &agent_out);
        let record = host::as_host(&mut record, "wasm")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let host = child_of(record.id());
        wait_descriptor(host as u32);
        let ebpf_dir = ebpf_out.to_str().unwrap();
        let out = ebpf_profile(
            host,
            "60",
            &["--hz", "2000", "--samples", "4000", "--out", ebpf_dir],
        );
        let record_out = record.wait_with_output().unwrap();
        if !ran(&out) || !e2e::recorded(&record_out) {
            return;
        }
        let agent: serde_json::Value = serde_json::from_slice(&record_out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&record_out.stderr)));
        let ebpf = json(&out);
        assert_eq!(agent["wrong"], 0);
        assert_eq!(agent["unattributed"], 0);
        // Outside, every frame in the guest's text is named: no image
        // address without its function, nothing unreadable.
        let summary = format!(
            "samples {} frames {} reads {}",
            ebpf["samples"], ebpf["frames"], ebpf["reads_per_jit_frame"]
        );
        assert!(ebpf["samples"].as_u64().unwrap() >= 1000, "{summary}");
        for kind in ["errors", "too_far", "stale", "nothing"] {
            assert_eq!(ebpf["frames"][kind], 0, "{kind}: {summary}");
        }
        let folded = std::fs::read_to_string(ebpf_out.join("stacks.folded")).unwrap();
        assert!(!folded.contains("[image "), "{folded}");
        let leaves = jitmap_wasmtime::demo::LEAVES;
        let (mut in_leaves, mut exact) = (0u64, 0u64);
        for line in folded.lines() {
            let (stack, count) = line.rsplit_once(' ').unwrap();
            let count: u64 = count.parse().unwrap();
            let frames: Vec<&str> = stack.split(';').collect();
            if leaves.contains(frames.last().unwrap()) {
                in_leaves += count;
                let n = frames.len();
                if n >= 4
                    && frames[n - 4..n - 1]
                        == ["guest::[trampolines]", "guest::top", "guest::middle"]
                {
                    exact += count;
                }
            }
        }
        // The kernel walks frame pointers: a sample on a leaf's first
        // instruction (before `push rbp`) misses `middle`.
        assert!(
            exact * 100 >= in_leaves * 99,
            "{exact} of {in_leaves}:\n{folded}"
        );
        assert_outputs(&ebpf_out);
        // perf names the leaves from wasmtime's jitdump.
        let text = inject_and_report(&dir, &data, "sym");
        let perf_share =
            |leaf: &str| e2e::report_share_ending(&text, leaf.trim_start_matches("guest::"));
        let from_agent = normalized(leaves.map(|l| json_share(&agent, l)));
        let from_perf = normalized(leaves.map(perf_share));
        let from_ebpf = normalized(leaves.map(|l| json_share(&ebpf, l)));
        println!("wasm guest: agent {from_agent:.1?} perf {from_perf:.1?} ebpf {from_ebpf:.1?}");
        // As in `agree_on_one_run`: four standard errors of the eBPF side's
        // leaf samples, never under 3 points.
        let tolerance = (283.0 / (in_leaves.max(1) as f64).sqrt()).max(3.0);
        let expected = [100.0 / 7.0, 200.0 / 7.0, 400.0 / 7.0];
        for i in 0..3 {
            let three = [from_agent[i], from_perf[i], from_ebpf[i]];
            for (who, share) in ["agent", "perf", "ebpf"].iter().zip(three) {
                assert!(
                    (share - expected[i]).abs() <= tolerance,
                    "{}: {who} {share:.1}% against {:.1}% (tolerance {tolerance:.1})",
                    leaves[i],
                    expected[i]
                );
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Profiles a spin host started with `args` (and a minute to run) at
    /// 4 kHz until `samples` have arrived, with `extra` options, then checks
    /// every placement the kernel named against the host's perf map;
    /// returns the report, or `None` when the test skips here.
    fn profile_spin(
        name: &str,
        args: &[&str],
        samples: u64,
        extra: &[&str],
    ) -> Option<serde_json::Value> {
        if !runs_x86_64() {
            return None;
        }
        let _one = one_run();
        let dir = temp_dir(name);
        let args: Vec<&str> = args.iter().copied().chain(["--seconds", "60"]).collect();
        let host = spin(&dir, &args);
        let pid = host.0.id();
        wait_published(&dir, pid, 1);
        let samples = samples.to_string();
        let options = ["--hz", "4000", "--samples", &samples];
        let out = ebpf_profile(pid, "60", &[&options[..], extra].concat());
        drop(host);
        if !ran(&out) {
            return None;
        }
        let report = json(&out);
        let published = published(&dir, pid);
        let placements = report["placements"].as_array().unwrap();
        for p in placements {
            let (start, size, lowest, highest) = (
                p["start"].as_u64().unwrap(),
                p["size"].as_u64().unwrap(),
                p["lowest"].as_u64().unwrap(),
                p["highest"].as_u64().unwrap(),
            );
            let name = p["name"].as_str().unwrap().to_owned();
            assert!(
                published.contains(&(start, size, name)),
                "a placement the host never published: {p}"
            );
            assert!(start <= lowest && highest < start + size, "{p}");
        }
        let f = &report["frames"];
        let summary = format!(
            "samples {} stale {} frames {} reads {}",
            report["samples"], report["stale_samples"], f, report["reads_per_jit_frame"]
        );
        assert_eq!(f["errors"], 0, "{summary}");
        assert_eq!(report["lost"], 0, "{summary}");
        // Every sample the kernel counted arrived, or was counted as one
        // whose descriptor could not be read (its page not resident at that
        // instant: the program cannot fault it in).
        let kernel = &report["kernel"];
        assert_eq!(
            kernel["samples"].as_u64().unwrap(),
            report["samples"].as_u64().unwrap()
                + report["stale_samples"].as_u64().unwrap()
                + report["empty_samples"].as_u64().unwrap()
                + kernel["unreadable_samples"].as_u64().unwrap(),
            "{summary} kernel {kernel}"
        );
        println!(
            "{name}: {} placements, {} method frames, {} too far, {} stale samples, \
         {} stale frames, reads per JIT frame {}",
            placements.len(),
            f["methods"],
            f["too_far"],
            report["stale_samples"],
            f["stale"],
            report["reads_per_jit_frame"]
        );
        std::fs::remove_dir_all(&dir).unwrap();
        Some(report)
    }

    fn a_churning_v2_host_is_never_misnamed() {
        let args = ["--functions", "32", "--churn", "--unique-names"];
        let Some(report) = profile_spin("ebpf-churn-v2", &args, 12_000, &[]) else {
            return;
        };
        let methods = report["frames"]["methods"].as_u64().unwrap();
        assert!(methods >= 2000, "{methods}");
        assert_eq!(report["frames"]["too_far"], 0);
        // The pc is always in a live function: only return addresses (which a
        // frame-pointer walk through code without them can make up) may fall
        // between blocks.
        assert_eq!(report["unattributed"], 0);
        // Functions are moved and republished under new names all the time.
        assert!(report["placements"].as_array().unwrap().len() >= 200);
        let max = report["reads_per_jit_frame"]["max"].as_u64().unwrap();
        assert!(max <= 13, "{max}");
        // Every leaf is JIT code: no sample is a frameless native leaf.
        assert_eq!(report["frameless_leaf"], 0);
    }

    /// JIT code calling a native leaf built without frame pointers
    /// (`spin --frameless`), profiled with the native walk off: the
    /// frame-pointer step skips the leaf's JIT caller. The program finds the
    /// caller's return address on top of the stack, and each such sample is
    /// counted as such. (With the native walk on, the leaf is stepped by its
    /// rows: `tests/native_unwind.rs`.)
    fn a_frameless_native_leaf_under_jit_code_is_detected_and_counted() {
        let args = ["--frameless"];
        let off = ["--native-unwind", "off"];
        let Some(report) = profile_spin("ebpf-frameless", &args, 6000, &off) else {
            return;
        };
        let samples = report["samples"].as_u64().unwrap();
        let flagged = report["frameless_leaf"].as_u64().unwrap();
        let leaf = report["methods"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == "frameless_leaf")
            .unwrap_or_else(|| panic!("no frameless_leaf: {}", report["methods"]));
        let in_leaf = leaf["self_samples"].as_u64().unwrap();
        println!(
            "frameless leaf: {flagged} of {in_leaf} samples in the leaf flagged ({samples} in all)"
        );
        // The host runs the C leaf twice for each call of the frameless JIT
        // code (whose samples are not native leaves).
        assert!(in_leaf >= 2000, "{in_leaf} of {samples}");
        assert!(flagged * 100 >= in_leaf * 95, "{flagged} of {in_leaf}");
        assert!(
            flagged <= in_leaf,
            "{flagged} flagged, {in_leaf} in the leaf"
        );
    }

    /// A profile's stacks: frames innermost first, with their counts.
    type Stacks = Vec<(Vec<String>, u64)>;

    /// A spin host run with `args`, profiled at 4 kHz until 6,000 samples
    /// have arrived: the report's JSON and its stacks, or `None` if BPF is
    /// not available here.
    fn profile_stacks(name: &str, args: &[&str]) -> Option<(serde_json::Value, Stacks)> {
        if !runs_x86_64() {
            return None;
        }
        let _one = one_run();
        let dir = temp_dir(name);
        let args: Vec<&str> = args.iter().copied().chain(["--seconds", "60"]).collect();
        let host = spin(&dir, &args);
        let pid = host.0.id();
        wait_descriptor(pid);
        let out_dir = dir.join("out");
        let out = ebpf_profile(
            pid,
            "60",
            &[
                "--hz",
                "4000",
                "--samples",
                "6000",
                "--out",
                out_dir.to_str().unwrap(),
            ],
        );
        drop(host);
        if !ran(&out) {
            return None;
        }
        let folded = std::fs::read_to_string(out_dir.join("stacks.folded")).unwrap();
        // Folded stacks list the outermost frame first.
        let stacks = folded
            .lines()
            .map(|line| {
                let (stack, count) = line.rsplit_once(' ').unwrap();
                let frames = stack.split(';').rev().map(str::to_owned).collect();
                (frames, count.parse().unwrap())
            })
            .collect();
        std::fs::remove_dir_all(&dir).unwrap();
        Some((json(&out), stacks))
    }

    /// A native function whose work is in helpers inlined into it
    /// (`jitmap_testkit::inlined::spin`): each of its frames is named by the
    /// function, after the helpers inlined at the address, each marked
    /// inlined, as the agent names it; a helper never names a frame alone.
    fn a_native_frame_is_named_with_its_inlined_helpers() {
        let Some((report, stacks)) = profile_stacks("ebpf-inlined", &["--inlined"]) else {
            return;
        };
        let samples = report["samples"].as_u64().unwrap();
        let chains = jitmap_testkit::inlined::check_profile(
            stacks
                .iter()
                .map(|(frames, count)| (frames.iter().map(String::as_str).collect(), *count)),
            samples,
        );
        println!("{chains:#?}");
    }

    /// JIT code that keeps no frame pointer (`spin --frameless`:
    /// `jit_top_nofp` calls `jit_mid_nofp`, which fills rbp with garbage
    /// while it loops): the program steps each method by its unwind rows, so
    /// the samples in `jit_mid_nofp` have the exact stack down to the host
    /// function. The kernel's frame-pointer walk ends in `jit_mid_nofp`.
    fn jit_code_without_frame_pointers_is_walked_by_its_unwind_rows() {
        let Some((report, stacks)) = profile_stacks("ebpf-rows", &["--frameless"]) else {
            return;
        };
        let stack = jitmap_testkit::frameless::JIT_STACK;
        let (mut in_leaf, mut exact) = (0u64, 0u64);
        for (frames, count) in &stacks {
            if frames[0] != stack[0] {
                continue;
            }
            in_leaf += count;
            if frames.len() >= stack.len() && frames[..stack.len()] == stack {
                exact += count;
            }
        }
        println!(
            "frameless JIT code: {exact} of {in_leaf} samples exact; kernel {}",
            report["kernel"]
        );
        assert!(in_leaf >= 500, "{in_leaf} samples in the leaf:\n{stacks:?}");
        assert!(
            exact * 100 >= in_leaf * 99,
            "{exact} of {in_leaf} exact:\n{stacks:?}"
        );
        // The JIT methods were stepped by their rows, in most samples twice
        // (both methods, in both stacks of the host).
        let cfi = report["kernel"]["cfi_frames"].as_u64().unwrap();
        assert!(cfi >= 2 * in_leaf, "{cfi} frames stepped by rows");
    }

    fn a_churning_v1_host_within_the_walk_cap_is_never_misnamed() {
        // The hot loop 40,000 bytes in: 157 words back, inside the 256-word cap.
        let args = [
            "--functions",
            "16",
            "--churn",
            "--unique-names",
            "--map",
            "v1",
            "--pad",
            "40000",
        ];
        let Some(report) = profile_spin("ebpf-churn-v1", &args, 12_000, &[]) else {
            return;
        };
        // Every pc is in reach; only made-up return addresses may be too far.
        assert_eq!(report["unattributed"], 0);
        assert!(report["frames"]["methods"].as_u64().unwrap() >= 1000);
        // 5 levels, a fragment, the trailer, the covering word, at most 8
        // chunks, the prefix, the header, the name, the sequence.
        let max = report["reads_per_jit_frame"]["max"].as_u64().unwrap();
        assert!(max <= 20, "{max}");
    }

    fn a_v1_method_beyond_the_walk_cap_is_too_far_never_wrong() {
        // The hot loop 100,000 bytes in: 390 words back, past the cap.
        let args = ["--functions", "8", "--map", "v1", "--pad", "100000"];
        let Some(report) = profile_spin("ebpf-too-far", &args, 8000, &[]) else {
            return;
        };
        let too_far = report["frames"]["too_far"].as_u64().unwrap();
        assert!(too_far >= 1000, "{too_far}");
        assert_eq!(report["unattributed"], too_far);
        // What was named lies within the cap: 256 words of 256 bytes.
        for p in report["placements"].as_array().unwrap() {
            let reach = p["highest"].as_u64().unwrap() - p["start"].as_u64().unwrap();
            assert!(reach < 256 * 256, "{p}");
        }
    }

    /// A copy of `binary` in `dir` that any user may run (the build directory
    /// may not be readable by `nobody`).
    fn world_runnable_copy(dir: &Path, binary: &Path) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let bin = dir.join(binary.file_name().unwrap());
        std::fs::copy(binary, &bin).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        bin
    }

    fn bad_input_and_missing_privileges_exit_2_with_a_reason() {
        let expect = |out: &Output, reason: &str| {
            assert_eq!(out.status.code(), Some(2), "{out:?}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains(reason), "expected {reason:?} in {err:?}");
        };
        // No such process.
        expect(&ebpf_profile("999999999", "5", &[]), "no process 999999999");
        // A process that links no jitmap.
        let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
        let out = ebpf_profile(sleeper.id(), "5", &[]);
        let _ = sleeper.kill();
        let _ = sleeper.wait();
        expect(&out, "is neither a jitmap host nor a .NET process");
        // Options out of range: refused while parsing, by the option's name.
        expect(&ebpf_profile(1, "5", &["--hz", "0"]), "--hz");
        // The old name of the subcommand still works, for one release.
        let old = Command::new(JITMAP)
            .args(["ebpf-profile", "--pid", "999999999", "--seconds", "1"])
            .output()
            .unwrap();
        expect(&old, "no process 999999999");
        // Privileges: only root can take them away here.
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0
            || Command::new("setpriv").arg("--version").output().is_err()
        {
            assert!(!must_run(), "CI runs as root with setpriv (util-linux)");
            println!("skipped the privilege checks: needs root and setpriv");
            return;
        }
        let dir = temp_dir("ebpf-privileges");
        let bin = world_runnable_copy(&dir, Path::new(JITMAP));
        let host_bin = world_runnable_copy(&dir, &host::executable());
        // `nobody` may not read root's host.
        let host = spin(&dir, &["--seconds", "60"]);
        wait_published(&dir, host.0.id(), 1);
        let out = Command::new("setpriv")
            .args([
                "--reuid",
                "65534",
                "--regid",
                "65534",
                "--clear-groups",
                "--",
            ])
            .arg(&bin)
            .args(["profile", "--pid", &host.0.id().to_string()])
            .output()
            .unwrap();
        expect(&out, "missing privileges: reading process");
        drop(host);
        // Root without capabilities may read a host that has none either, but
        // may not load BPF.
        let no_caps = ["--bounding-set=-all", "--inh-caps=-all", "--"];
        let mut setpriv = Command::new("setpriv");
        setpriv
            .args(no_caps)
            .arg(&host_bin)
            .args(["--seconds", "60"]);
        let host = Host(
            host::as_host(&mut setpriv, "spin")
                .env("JITMAP_PERF", "map")
                .env("JITMAP_PERF_DIR", &dir)
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
        );
        wait_published(&dir, host.0.id(), 1);
        let out = Command::new("setpriv")
            .args(no_caps)
            .arg(&bin)
            .args(["profile", "--pid", &host.0.id().to_string()])
            .output()
            .unwrap();
        expect(&out, "loading and attaching BPF programs needs root");
        drop(host);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The host is stripped of its symbol tables, as `strip = true` and
    /// distribution packages leave one: the profiler finds its descriptor
    /// by its section.
    fn a_stripped_host_that_exits_ends_the_profile_with_what_it_took() {
        if !runs_x86_64() {
            return;
        }
        let _one = one_run();
        let dir = temp_dir("ebpf-exit");
        let mut command = Command::new(host::stripped(&dir));
        host::as_host(&mut command, "spin").args(["--functions", "4", "--seconds", "60"]);
        let host = Host(
            command
                .env("JITMAP_PERF", "map")
                .env("JITMAP_PERF_DIR", &dir)
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let pid = host.0.id();
        wait_published(&dir, pid, 4);
        // The host exits once it has been sampled for 50 ticks of its CPU
        // time (500 ms at 100 ticks a second; about 500 samples at 1 kHz).
        let profiler = Profiler::start(pid, "60", &[]);
        wait_cpu(pid, 50);
        drop(host);
        let out = profiler.output();
        if !ran(&out) {
            return;
        }
        let report = json(&out);
        assert_eq!(report["host_exited"], true);
        assert_eq!(report["stopped"], false);
        // Four functions, each named as published.
        let mut names: Vec<&str> = report["placements"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(
            names,
            [
                "jitmap_spin_0",
                "jitmap_spin_1",
                "jitmap_spin_2",
                "jitmap_spin_3"
            ]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn sigint_ends_the_profile_with_its_outputs() {
        if !runs_x86_64() {
            return;
        }
        let _one = one_run();
        let dir = temp_dir("ebpf-sigint");
        let host = spin(&dir, &["--functions", "4", "--seconds", "60"]);
        let pid = host.0.id();
        wait_published(&dir, pid, 4);
        let out_dir = dir.join("out");
        let profiler = Profiler::start(pid, "60", &["--out", out_dir.to_str().unwrap()]);
        // Sampled for 50 ticks of the host's CPU time, then stopped.
        wait_cpu(pid, 50);
        // SAFETY: kill has no memory preconditions; the pid is our child's.
        assert_eq!(
            unsafe { libc::kill(profiler.child.id() as i32, libc::SIGINT) },
            0
        );
        let out = profiler.output();
        drop(host);
        if !ran(&out) {
            return;
        }
        let report = json(&out);
        assert_eq!(report["stopped"], true);
        assert_eq!(report["host_exited"], false);
        assert!(report["samples"].as_u64().unwrap() > 0);
        assert_outputs(&out_dir);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn a_long_name_is_cut_at_256_bytes_and_says_so() {
        if !runs_x86_64() {
            return;
        }
        let _one = one_run();
        let dir = temp_dir("ebpf-names");
        let host = spin(
            &dir,
            &["--functions", "3", "--seconds", "60", "--name-width", "300"],
        );
        let pid = host.0.id();
        wait_published(&dir, pid, 3);
        let out = ebpf_profile(pid, "60", &["--samples", "2000"]);
        drop(host);
        if !ran(&out) {
            return;
        }
        let report = json(&out);
        let published: Vec<String> = published(&dir, pid).into_iter().map(|p| p.2).collect();
        let placements = report["placements"].as_array().unwrap();
        assert_eq!(placements.len(), 3);
        for p in placements {
            let name = p["name"].as_str().unwrap();
            assert_eq!(name.len(), 256);
            assert_eq!(p["truncated"], true);
            assert_eq!(p["label"].as_str().unwrap(), format!("{name}..."));
            let full = published.iter().find(|n| n.starts_with(name)).unwrap();
            assert_eq!(full.len(), 300);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
