//! `jitmap profile` on hosts built the way users build them: without forced
//! frame pointers. `jitmap-host` (testkit's host binary) is built here with
//! `RUSTFLAGS=-Cforce-frame-pointers=no` into a target directory of its
//! own, so neither the host's Rust code nor Debian's libc keeps a frame
//! pointer; the kernel walks native frames by their objects' rows.
//!
//! - the 1:2:4 demo under `middle` and `top`, called from the host's native
//!   loop: the exact stack down to the host's `main` in at least 99% of the
//!   leaves' samples, the agent's mixed walk in the same process gives the
//!   same stacks, and with the native walk off the same check fails;
//! - `frameless`: the frameless C leaf keeps its JIT caller;
//! - `plt`: a sample in a PLT entry keeps its callers;
//! - `trampoline`: a sample in a stub declared frameless keeps its caller;
//! - `dlopen-churn`: libraries loaded and unloaded in a loop; no stack is
//!   built from another object's rows;
//! - `overlay`: a large library mapped over many small ones just unloaded
//!   (whose rows the tables keep as candidates): its samples keep their
//!   callers.
//!
//! Needs root (BPF), x86-64 and a C compiler. With `CI=true` nothing may be
//! skipped.
#![cfg(feature = "ebpf")]

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::sync::OnceLock;

use jitmap::agent::INLINED;
use jitmap_testkit::demo::{LEAVES, MIDDLE, NATIVE_CALLER, TOP};
use jitmap_testkit::dlopen_churn::DRIVER;
use jitmap_testkit::e2e::{must_run, one_run, runs_x86_64, temp_dir};
use jitmap_testkit::frameless::{JIT_STACK, NATIVE_STACK};
use jitmap_testkit::overlay::LARGE_STACK;
use jitmap_testkit::plt::PLT_STACK;
use jitmap_testkit::trampoline::TRAMPOLINE_STACK;

const JITMAP: &str = env!("CARGO_BIN_EXE_jitmap");

/// The host's `main`, where a whole stack of the host's ends (its callers
/// are the Rust runtime's and libc's start-up).
const HOST_MAIN: &str = "jitmap_host::main";

/// The demo's stack below `top`, down to the host's `main`, innermost first.
fn demo_chain() -> Vec<String> {
    [
        NATIVE_CALLER,
        "jitmap_demo::demo::Demo::run",
        "jitmap_demo::demo::PublishedDemo::run",
        "jitmap_testkit::profile::run_with",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([format!("jitmap_host::run{INLINED}"), HOST_MAIN.to_owned()])
    .collect()
}

/// `jitmap-host`, built once per test run without forced frame pointers.
fn host_binary() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let target = jitmap_testkit::e2e::cargo_target_dir(workspace).join("no-frame-pointers");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = Command::new(cargo)
            .current_dir(workspace)
            .args(["build", "-p", "jitmap-testkit", "--bin", "jitmap-host"])
            .arg("--target-dir")
            .arg(&target)
            // An explicit RUSTFLAGS replaces the workspace's, which force
            // frame pointers.
            .env("RUSTFLAGS", "-C force-frame-pointers=no")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .status()
            .expect("cargo runs");
        assert!(status.success(), "building jitmap-host failed");
        let binary = target.join("debug").join("jitmap-host");
        assert_frameless(&binary, DRIVER);
        binary
    })
}

/// Asserts that `function` in `binary` sets up no frame pointer: its code
/// does not begin `push rbp; mov rbp, rsp`, as every function of a build
/// with forced frame pointers does.
fn assert_frameless(binary: &Path, function: &str) {
    use object::{Object, ObjectSection, ObjectSymbol};
    let data = std::fs::read(binary).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let symbol = file
        .symbols()
        .find(|s| {
            s.name()
                .is_ok_and(|n| format!("{:#}", rustc_demangle::demangle(n)) == function)
        })
        .unwrap_or_else(|| panic!("{function} is not in {binary:?}"));
    let text = file
        .section_by_index(symbol.section_index().unwrap())
        .unwrap();
    let at = (symbol.address() - text.address()) as usize;
    let code = &text.data().unwrap()[at..at + 4];
    assert_ne!(
        code,
        [0x55, 0x48, 0x89, 0xe5],
        "{function} keeps a frame pointer: the host was built with them"
    );
}

/// A started host, killed when dropped.
struct Host {
    child: Child,
    stdout: BufReader<ChildStdout>,
}

impl Host {
    /// Starts `jitmap-host ARGS` and waits until it is ready.
    fn start(args: &[&str]) -> Self {
        let mut child = Command::new(host_binary())
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "jitmap-host {args:?}");
        Self { child, stdout }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for it to exit; the rest of its stdout.
    fn finish(mut self) -> String {
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut self.stdout, &mut rest).unwrap();
        assert!(self.child.wait().unwrap().success());
        rest
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `jitmap profile --json --pid PID --hz 4000 --samples SAMPLES --seconds
/// 60 --out OUT EXTRA...`, started.
fn profile(pid: u32, samples: u64, out: &Path, extra: &[&str]) -> Child {
    Command::new(JITMAP)
        .args(["profile", "--json", "--hz", "4000", "--seconds", "60"])
        .args(["--pid", &pid.to_string(), "--samples", &samples.to_string()])
        .arg("--out")
        .arg(out)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Stacks, innermost first, with their counts.
type Stacks = Vec<(Vec<String>, u64)>;

/// The report and the stacks (innermost first, with counts), or `None` if
/// BPF is not available here (a skip, which CI does not allow).
fn finished(child: Child, out: &Path) -> Option<(serde_json::Value, Stacks)> {
    let output: Output = child.wait_with_output().unwrap();
    if !output.status.success() {
        let err = String::from_utf8_lossy(&output.stderr);
        let no_bpf = output.status.code() == Some(2)
            && (err.contains("missing privileges") || err.contains("BPF:"));
        assert!(no_bpf && !must_run(), "jitmap profile failed: {err}");
        println!("skipped: BPF is not available here: {err}");
        return None;
    }
    let report = serde_json::from_slice(&output.stdout).unwrap();
    Some((report, folded(&out.join("stacks.folded"))))
}

/// Folded stacks (outermost first), innermost first.
fn folded(path: &Path) -> Stacks {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|line| {
            let (stack, count) = line.rsplit_once(' ').unwrap();
            (
                stack.split(';').rev().map(str::to_owned).collect(),
                count.parse().unwrap(),
            )
        })
        .collect()
}

/// A stack up to and including the host's `main` (whole stacks go on into
/// the runtime's start-up, which the agent and the kernel name alike but
/// need not both reach).
fn to_main(frames: &[String]) -> Vec<String> {
    match frames.iter().position(|f| f == HOST_MAIN) {
        Some(i) => frames[..=i].to_vec(),
        None => frames.to_vec(),
    }
}

/// (samples whose leaf is `stack[0]`, those whose innermost frames are
/// `stack` with more below): how a test checks that samples in a leaf kept
/// their callers, from outside.
fn kept_callers(stacks: &[(Vec<String>, u64)], stack: &[&str]) -> (u64, u64) {
    let (mut all, mut exact) = (0, 0);
    for (frames, n) in stacks {
        if frames[0] != stack[0] {
            continue;
        }
        all += n;
        if frames.len() > stack.len() && frames[..stack.len()] == *stack {
            exact += n;
        }
    }
    (all, exact)
}

/// Of the samples whose leaf is a demo leaf: how many, and how many have
/// the exact stack down to the host's `main`.
fn demo_exact(stacks: &[(Vec<String>, u64)]) -> (u64, u64) {
    let chain = demo_chain();
    let (mut leaves, mut exact) = (0, 0);
    for (frames, count) in stacks {
        if !LEAVES.contains(&frames[0].as_str()) {
            continue;
        }
        leaves += count;
        let mut want = vec![frames[0].clone(), MIDDLE.to_owned(), TOP.to_owned()];
        want.extend(chain.iter().cloned());
        if to_main(frames) == want {
            exact += count;
        }
    }
    (leaves, exact)
}

/// Each stack of the host's main thread (those that reach its `main`), cut
/// there, with its share of that thread's samples, in percent. The agent
/// samples only the thread it attached; the kernel samples every thread of
/// the process, among them the agent's collector, whose naming at start-up
/// can take a second of CPU on a loaded machine: shares of all samples
/// would not compare.
fn shares(stacks: &[(Vec<String>, u64)]) -> HashMap<Vec<String>, f64> {
    let main_thread: Vec<_> = stacks
        .iter()
        .filter(|(frames, _)| frames.iter().any(|f| f == HOST_MAIN))
        .collect();
    let total: u64 = main_thread.iter().map(|(_, c)| c).sum();
    let mut out: HashMap<Vec<String>, f64> = HashMap::new();
    for (frames, count) in main_thread {
        *out.entry(to_main(frames)).or_default() += *count as f64 * 100.0 / total as f64;
    }
    out
}

/// The demo on a host without frame pointers, profiled twice at once: with
/// native rows (the default) and without. With them, at least 99% of the
/// leaves' samples have the whole stack down to the host's `main`, and the
/// agent in the host (its mixed walk, over the same seconds) has the same
/// stacks of the main thread within 3 points each above 5%. Without them, the walk ends in the
/// first frameless native frame: the same check fails.
#[test]
fn a_host_without_frame_pointers_has_whole_stacks_down_to_main() {
    if !runs_x86_64() {
        return;
    }
    let _one = one_run();
    let dir = temp_dir("native-demo");
    let agent_out = dir.join("agent");
    let host = Host::start(&["demo", "12", agent_out.to_str().unwrap()]);
    let (on_out, off_out) = (dir.join("on"), dir.join("off"));
    let on = profile(host.pid(), 8000, &on_out, &[]);
    let off = profile(host.pid(), 4000, &off_out, &["--native-unwind", "off"]);
    let (Some((report, stacks)), Some((_, off_stacks))) =
        (finished(on, &on_out), finished(off, &off_out))
    else {
        return;
    };
    host.finish();
    let agent = folded(&agent_out.join("stacks.folded"));
    let (leaves, exact) = demo_exact(&stacks);
    let (off_leaves, off_exact) = demo_exact(&off_stacks);
    let kernel = &report["kernel"];
    println!(
        "native rows: {exact} of {leaves} leaf samples exact down to main; without: \
         {off_exact} of {off_leaves}; kernel {kernel}; rows {}",
        report["native"]
    );
    assert!(leaves >= 2000, "{leaves} leaf samples");
    assert!(exact * 100 >= leaves * 99, "{exact} of {leaves} exact");
    assert!(off_leaves >= 1000, "{off_leaves} leaf samples");
    assert!(
        off_exact * 100 < off_leaves * 50,
        "without native rows {off_exact} of {off_leaves} exact: the host keeps frame pointers"
    );
    assert!(kernel["native_frames"].as_u64().unwrap() >= 4 * leaves);
    assert_eq!(report["stale_rows"], 0);
    // The agent's mixed walk, the same seconds, the same process.
    let (from_agent, from_ebpf) = (shares(&agent), shares(&stacks));
    let mut compared = 0;
    for (stack, &share) in from_agent.iter().chain(&from_ebpf) {
        if share <= 5.0 {
            continue;
        }
        let a = from_agent.get(stack).copied().unwrap_or(0.0);
        let e = from_ebpf.get(stack).copied().unwrap_or(0.0);
        assert!(
            (a - e).abs() <= 3.0,
            "{stack:?}: agent {a:.1}%, eBPF {e:.1}%"
        );
        compared += 1;
    }
    // The three leaves' stacks, from each side.
    assert_eq!(compared, 6);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `frameless` on a host without frame pointers: the frameless C leaf,
/// called from JIT code, keeps its JIT caller and the host's frames below
/// it, and so does the JIT code that keeps no frame pointer.
#[test]
fn a_frameless_leaf_keeps_its_jit_caller_without_frame_pointers() {
    if !runs_x86_64() {
        return;
    }
    let _one = one_run();
    let dir = temp_dir("native-frameless");
    let host = Host::start(&["frameless", "60"]);
    let out = dir.join("out");
    let Some((report, stacks)) = finished(profile(host.pid(), 6000, &out, &[]), &out) else {
        return;
    };
    // Again with a cap of 20,000 rows, which the host's own rows (36,000
    // and more) exceed: it is left out, said so, and the rows stay under
    // the cap.
    let capped_out = dir.join("capped");
    let cap = ["--native-rows", "20000"];
    let capped = finished(profile(host.pid(), 500, &capped_out, &cap), &capped_out);
    drop(host);
    let (capped, _) = capped.unwrap();
    let native = &capped["native"];
    let rows = native["rows"].as_u64().unwrap();
    let listed: u64 = native["per_object"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["rows"].as_u64().unwrap())
        .sum();
    let left_out = native["left_out"].as_array().unwrap();
    println!("capped at 20,000 rows: {native}");
    assert!(rows <= 20_000 && rows == listed, "{native}");
    assert!(
        left_out
            .iter()
            .any(|o| o.as_str().unwrap().ends_with("jitmap-host: Cap")),
        "{native}"
    );
    let (leaf, leaf_exact) = kept_callers(&stacks, &NATIVE_STACK);
    let (jit, jit_exact) = kept_callers(&stacks, &JIT_STACK);
    println!(
        "frameless leaf: {leaf_exact} of {leaf} exact; frameless JIT code: {jit_exact} of \
         {jit}; flagged {}; kernel {}",
        report["frameless_leaf"], report["kernel"]
    );
    assert!(leaf >= 2000, "{leaf} samples in the leaf");
    assert!(leaf_exact * 100 >= leaf * 99, "{leaf_exact} of {leaf}");
    assert!(jit >= 500, "{jit} samples in the frameless JIT code");
    assert!(jit_exact * 100 >= jit * 99, "{jit_exact} of {jit}");
    // Walked, so no longer flagged as a skipped caller.
    assert!(report["frameless_leaf"].as_u64().unwrap() * 100 <= leaf);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `plt` on a host without frame pointers: a sample in the helper's
/// `plt_target@plt` entry (its CFI the lazy PLT's DWARF expression) keeps
/// the helper, the JIT caller and the host's function under it.
#[test]
fn a_sample_in_a_plt_entry_keeps_its_callers() {
    if !runs_x86_64() {
        return;
    }
    let _one = one_run();
    let dir = temp_dir("native-plt");
    let host = Host::start(&["plt", "60"]);
    let out = dir.join("out");
    // The share of samples that land in the one-instruction entry varies
    // from run to run with the libraries' placement: from 1.1 % (CI, on
    // 2026-11-28) to 40 % on this machine kind. 16,000 samples (4 s) give
    // at least 40 in it at the lowest share seen, with a wide margin.
    let Some((report, stacks)) = finished(profile(host.pid(), 16_000, &out, &[]), &out) else {
        return;
    };
    drop(host);
    let want: Vec<&str> = PLT_STACK
        .iter()
        .copied()
        .chain(["jitmap_testkit::frameless::JitCaller::call"])
        .collect();
    let (in_plt, exact) = kept_callers(&stacks, &want);
    let shown: Vec<_> = stacks.iter().take(6).collect();
    println!(
        "plt_target@plt: {exact} of {in_plt} exact; kernel {}",
        report["kernel"]
    );
    assert!(in_plt >= 40, "{in_plt} samples in the PLT entry: {shown:?}");
    assert!(exact * 100 >= in_plt * 99, "{exact} of {in_plt}: {shown:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `trampoline` on a host without frame pointers: a sample in a stub of a
/// kind the host declared frameless (through the descriptor) takes the
/// entry rule and keeps its caller, as in the agent's trampoline test.
#[test]
fn a_sample_in_a_frameless_trampoline_keeps_its_caller() {
    if !runs_x86_64() {
        return;
    }
    let _one = one_run();
    let dir = temp_dir("native-trampoline");
    let host = Host::start(&["trampoline", "60"]);
    let out = dir.join("out");
    let Some((report, stacks)) = finished(profile(host.pid(), 4000, &out, &[]), &out) else {
        return;
    };
    drop(host);
    let (in_stub, exact) = kept_callers(&stacks, &TRAMPOLINE_STACK);
    let shown: Vec<_> = stacks.iter().take(6).collect();
    println!(
        "trampoline: {exact} of {in_stub} exact; kernel {}",
        report["kernel"]
    );
    assert!(
        in_stub >= 200,
        "{in_stub} samples in the trampoline: {shown:?}"
    );
    assert!(
        exact * 100 >= in_stub * 99,
        "{exact} of {in_stub}: {shown:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Two libraries with the same functions and different frames, loaded and
/// unloaded in turn, mostly each where the other was, hundreds of times a
/// second, while profiled: every stack is either the exact one (the
/// library's frames, then the driver and the host's frames down to `main`)
/// or says why it is not: `[stale unwind rows]` where the kernel found
/// another object mapped than any rows it had (under 5 %: the rows of
/// objects unmapped since are kept as candidates), `[no unwind rule]` at a
/// library's `.init`, `[frame pointer through unknown code]` at a
/// library mapped where none was at the last refresh. None is built from
/// another object's rows.
#[test]
fn a_host_that_loads_and_unloads_libraries_never_gets_another_objects_rows() {
    if !runs_x86_64() {
        return;
    }
    let _one = one_run();
    let dir = temp_dir("native-churn");
    let host = Host::start(&["dlopen-churn", "60"]);
    let out = dir.join("out");
    // 3 s at 4 kHz. The stale stacks are those before the first refresh
    // that saw the second library (one follows the first stale walk within
    // a pass of the profile loop, 20 ms here, longer on a loaded machine);
    // the share is of the whole run.
    let Some((report, stacks)) = finished(profile(host.pid(), 12_000, &out, &[]), &out) else {
        return;
    };
    drop(host);
    let below_driver = [
        DRIVER.to_owned(),
        "jitmap_testkit::dlopen_churn::run".to_owned(),
        format!("jitmap_host::run{INLINED}"),
        HOST_MAIN.to_owned(),
    ];
    let (mut whole, mut cut, mut no_rule, mut unknown, mut samples) = (0, 0, 0, 0, 0);
    for (frames, count) in &stacks {
        samples += count;
        match frames.last().map(String::as_str) {
            Some("[stale unwind rows]") => {
                cut += count;
                continue;
            }
            // A library's .init has no CFI: the walk ends there.
            Some("[no unwind rule]") => {
                no_rule += count;
                continue;
            }
            // A library mapped where none was before the last refresh:
            // its frame is stepped by the frame pointer, and says so.
            Some("[frame pointer through unknown code]") => {
                unknown += count;
                continue;
            }
            _ => {}
        }
        let frames = to_main(frames);
        let at = frames.iter().position(|f| *f == below_driver[0]);
        let Some(at) = at.filter(|&i| frames[i..] == below_driver) else {
            panic!("a stack neither whole nor cut at stale rows: {frames:?}");
        };
        // In a library: `churn_inner` and `churn_work`, or `churn_work`
        // (the names of a library unloaded before it was named are
        // addresses); elsewhere the loader's or libc's own frames.
        let library = |f: &String| f.starts_with("churn_") || f.starts_with("0x");
        if frames[..at].iter().any(library) {
            let depths: &[usize] = match frames[0].as_str() {
                "churn_inner" => &[2],
                "churn_work" => &[1],
                _ => &[1, 2],
            };
            assert!(
                depths.contains(&at) && frames[..at].iter().all(library),
                "a library's frames stepped to a wrong caller: {frames:?}"
            );
        }
        whole += count;
    }
    let kernel = &report["kernel"];
    println!(
        "dlopen churn: {whole} whole stacks, {cut} cut at stale rows, {no_rule} at a frame \
         without a rule, {unknown} stepped through unknown code, of {samples}; \
         stale samples {}, unreadable {}, rows rewritten during a sample {}; native {}",
        report["stale_samples"],
        kernel["unreadable_samples"],
        kernel["native_busy"],
        report["native"]
    );
    assert_eq!(report["stale_rows"].as_u64().unwrap(), cut);
    assert!(samples >= 6000, "{samples}");
    // Rows went stale, and the kernel saw it: before the first refresh
    // that saw the second library. After it, each library mapped where the
    // other was finds its rows among the candidates (at most 5 %; 49 %
    // when the tables kept only what the last refresh saw mapped).
    assert!(cut > 0, "no walk met stale rows");
    assert!(
        cut * 100 < samples * 5,
        "{cut} of {samples} cut at stale rows"
    );
    assert!(report["native"]["refreshes"].as_u64().unwrap() > 0);
    assert!(report["native"]["candidates"].as_u64().unwrap() >= 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `overlay`: 16 small libraries are loaded and held while the profiler
/// attaches and sees them, then unloaded (their rows stay as candidates,
/// about 13 of whose ranges start inside the large library's code range),
/// and the large one is loaded over their addresses and runs `large_hot`,
/// past all their starts. Its samples keep their callers: the kernel's
/// scan, 8 ranges back from the pc, reaches the large library's range
/// because the tables let no more than 7 candidates start inside a mapped
/// range. Until the first refresh after the large one is mapped, its
/// samples are cut as stale (the tables still hold the small ones as
/// mapped): up to a fifth of them here. (Before, all 16 candidates stayed
/// and the scan stopped among them: every sample in `large_hot` was cut as
/// stale here, where a small library's code range held its pc and failed
/// its check; where none holds it, the walk would step by the frame
/// pointer instead.)
#[test]
fn a_library_mapped_over_many_unloaded_ones_keeps_its_callers() {
    if !runs_x86_64() {
        return;
    }
    let _one = one_run();
    let dir = temp_dir("native-overlay");
    let host = Host::start(&["overlay", "60"]);
    let out = dir.join("out");
    // 3 s of the large library's CPU at 4 kHz (the 5 s before it, the host
    // sleeps: no samples).
    let Some((report, stacks)) = finished(profile(host.pid(), 12_000, &out, &[]), &out) else {
        return;
    };
    // The layout the test needs: at least 8 of the small libraries' code
    // ranges start inside the large one's, before `large_hot`.
    let mut host = host;
    let mut line = String::new();
    host.stdout.read_line(&mut line).unwrap();
    drop(host);
    let overlaid: usize = line
        .trim()
        .strip_prefix("overlaid=")
        .unwrap_or_else(|| panic!("{line:?}"))
        .parse()
        .unwrap();
    assert!(
        overlaid >= 8,
        "{overlaid} small code ranges start inside the large one's"
    );
    let want: Vec<&str> = LARGE_STACK
        .iter()
        .copied()
        .chain([jitmap_testkit::overlay::DRIVER])
        .collect();
    let (in_hot, exact) = kept_callers(&stacks, &want);
    let stale: u64 = stacks
        .iter()
        .filter(|(frames, _)| frames[0] == LARGE_STACK[0])
        .filter(|(frames, _)| frames.last().map(String::as_str) == Some("[stale unwind rows]"))
        .map(|(_, n)| n)
        .sum();
    let shown: Vec<_> = stacks.iter().take(4).collect();
    println!(
        "large_hot: {exact} of {in_hot} exact, {stale} cut as stale; native {}; kernel {}",
        report["native"], report["kernel"]
    );
    // The small libraries were seen mapped, then kept as candidates.
    assert!(report["native"]["candidates"].as_u64().unwrap() >= 8);
    assert!(in_hot >= 6000, "{in_hot} samples in large_hot: {shown:?}");
    assert_eq!(exact + stale, in_hot, "{shown:?}");
    assert!(
        stale * 5 <= in_hot,
        "{stale} of {in_hot} cut as stale: {shown:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
