//! The mixed unwinder against the two stacks a frame-pointer walk gets
//! wrong (`jitmap_testkit::frameless`): a native leaf built without frame
//! pointers under JIT code, and JIT code that keeps no frame pointer and
//! describes itself with CFI. Each runs under both modes: the mixed walk
//! must give the exact stack in at least 99% of the samples, and the
//! frame-pointer walk is shown to lose it (so the check can fail). A
//! counting allocator sees no heap call inside the handler in either mode,
//! while it evaluates native rules and the JIT methods' CFI.
//!
//! An outside oracle checks the same stacks: `perf record --call-graph
//! dwarf` samples this test binary, run again as a child whose agent
//! profiles the workload, and `perf inject --jit` hands perf the methods'
//! unwinding tables from the jitdump.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use jitmap::agent::{Agent, AgentConfig, Clock, Profile, Unwind};
use jitmap::{ExecutionManager, HeapConfig};
use jitmap_testkit::e2e;
use jitmap_testkit::frameless::{
    Frameless, JIT_STACK, NATIVE_STACK, PERF_UNWIND_ROOM, build_shared_object, load,
};
use jitmap_testkit::profile::exact_stacks;
use jitmap_testkit::signal_alloc::{
    SignalCounting, check_mask, take_while_blocked, with_sigprof_blocked,
};

/// Counts heap calls made inside a SIGPROF handler (see
/// `jitmap_testkit::signal_alloc`).
#[global_allocator]
static GLOBAL: SignalCounting = SignalCounting;

/// One agent per process: the tests here take turns.
fn one_agent() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `work` for `duration` under an agent on `manager` walking by
/// `unwind`; asserts that the handler made no heap call.
fn profile(manager: &ExecutionManager, unwind: Unwind, samples: u64, work: impl Fn()) -> Profile {
    // The detector itself: an allocation with SIGPROF blocked is caught.
    check_mask(true);
    with_sigprof_blocked(|| drop(std::hint::black_box(vec![1u8; 64])));
    assert_eq!(take_while_blocked(), 2, "alloc and free seen");
    let agent = Agent::start(
        manager,
        AgentConfig {
            hz: 1000,
            clock: Clock::Wall,
            unwind,
            ..AgentConfig::default()
        },
    )
    .unwrap();
    let attached = agent.attach_current_thread().unwrap();
    // Until the samples have been taken (a busy machine takes longer), at
    // most a minute.
    let cap = Instant::now() + Duration::from_secs(60);
    while attached.samples_taken() < samples && Instant::now() < cap {
        work();
    }
    drop(attached);
    let profile = agent.stop();
    check_mask(false);
    assert_eq!(
        take_while_blocked(),
        0,
        "the handler allocated ({unwind:?})"
    );
    profile
}

fn workload() -> (jitmap::OwnedHeap, Frameless, std::path::PathBuf) {
    let heap = ExecutionManager::new(8)
        .create_heap(HeapConfig {
            span: 1 << 20,
            ..HeapConfig::default()
        })
        .unwrap();
    let dir = std::env::temp_dir().join(format!("agent-unwind-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // The frame-pointer functions without CFI: the agent steps them by the
    // convention.
    let frameless = Frameless::build(&heap, &dir, false).unwrap();
    (heap, frameless, dir)
}

/// Every stack printed, for a failure's message.
fn stacks(profile: &Profile) -> String {
    profile
        .stacks
        .iter()
        .take(8)
        .map(|s| format!("{} {}\n", s.count, s.frames.join(" <- ")))
        .collect()
}

/// At least 500 samples in `stack`'s leaf, and at least 99 % of them with
/// exactly `stack` as their innermost frames.
fn assert_mostly_exact(profile: &Profile, stack: &[&str], what: &str) {
    let (in_leaf, good) = exact_stacks(profile, stack);
    println!(
        "{what}: {good} of {in_leaf} leaf samples exact; ends {:?}",
        profile.stack_ends
    );
    assert!(
        in_leaf >= 500,
        "{what}: {in_leaf} samples in the leaf\n{}",
        stacks(profile)
    );
    assert!(
        good * 100 >= in_leaf * 99,
        "{what}: {good} of {in_leaf} exact\n{}",
        stacks(profile)
    );
}

/// Profiles `run` (one call of the workload) under both walks: the mixed
/// walk must give `stack` exactly in at least 99% of the samples in its
/// leaf, with complete stacks; the frame-pointer walk, in none. (These
/// workloads are x86-64 code, so the tests return at once on aarch64; the
/// same `root` check runs there in `tests/plt.rs`'s
/// `samples_in_a_plt_entry_keep_their_callers`, which is how issue 67,
/// item 4 was found to hold: on aarch64 every stack ended `unsupported`.)
fn check(stack: &[&str], run: impl Fn(&Frameless)) {
    let _one = one_agent();
    let (heap, f, dir) = workload();
    let on = |unwind| profile(heap.manager(), unwind, 1500, || run(&f));
    let mixed = on(Unwind::Mixed);
    assert_mostly_exact(&mixed, stack, "mixed");
    // Complete stacks, down to the thread's start.
    assert!(
        mixed.stack_ends.root * 100 >= mixed.stack_ends.total() * 99,
        "{:?}",
        mixed.stack_ends
    );
    let fp = on(Unwind::FramePointer);
    let (fp_leaf, fp_good) = exact_stacks(&fp, stack);
    println!("frame pointers: {fp_good} of {fp_leaf} leaf samples exact");
    assert!(
        fp_leaf >= 500,
        "{fp_leaf} samples in the leaf\n{}",
        stacks(&fp)
    );
    assert_eq!(
        fp_good,
        0,
        "the frame-pointer walk found the stack\n{}",
        stacks(&fp)
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// The leaf keeps rbp at `jit_mid`'s frame: the frame-pointer walk loses
/// `jit_mid`.
#[test]
fn a_frameless_native_leaf_keeps_its_jit_caller() {
    if !jitmap_testkit::e2e::runs_x86_64() {
        return;
    }
    check(&NATIVE_STACK, |f| {
        std::hint::black_box(f.native_leaf(200_000));
    });
}

/// rbp holds garbage in `jit_mid_nofp`: the frame-pointer walk ends there.
#[test]
fn jit_code_without_frame_pointers_unwinds_by_its_cfi() {
    if !jitmap_testkit::e2e::runs_x86_64() {
        return;
    }
    check(&JIT_STACK, |f| {
        std::hint::black_box(f.jit_without_fp(200_000));
    });
}

/// A method without frame pointers, moved: its rows (by code offset) come
/// along, its `.eh_frame` is rewritten for the new address, and its samples
/// keep their exact stacks.
#[test]
fn a_moved_method_without_frame_pointers_keeps_its_unwind_rows() {
    if !jitmap_testkit::e2e::runs_x86_64() {
        return;
    }
    let _one = one_agent();
    let (heap, mut f, dir) = workload();
    let rows_at = |start: usize| {
        let reader = heap.manager().register_reader().unwrap();
        let guard = heap.manager().pin(&reader).unwrap();
        let block = guard.find(start).unwrap();
        let frame = block.eh_frame().unwrap().frame.clone();
        (block.unwind_rows().to_vec(), frame)
    };
    let first = f.jit_without_fp(1000);
    let top = heap
        .live_blocks()
        .into_iter()
        .find(|b| b.info.as_ref().is_some_and(|i| i.name == "jit_top_nofp"))
        .unwrap()
        .code
        .start();
    let (rows, frame) = rows_at(top);
    assert!(rows.len() >= 3, "{rows:?}");
    let (old, new) = f.move_jit_top(&heap).unwrap();
    assert_eq!(old, top);
    assert_ne!(new, old);
    let (moved_rows, moved_frame) = rows_at(new);
    assert_eq!(moved_rows, rows, "the rows are by code offset: unchanged");
    // The FDE's start, the frame's one address, now names the new code:
    // the same bytes but for those 8 (little-endian) bytes.
    let diff: Vec<usize> = (0..frame.len())
        .filter(|&i| frame[i] != moved_frame[i])
        .collect();
    let at = *diff.first().unwrap();
    assert!(diff.iter().all(|&i| i < at + 8), "{diff:?}");
    assert_eq!(&moved_frame[at..at + 8], &(new as u64).to_le_bytes());
    assert_eq!(&frame[at..at + 8], &(old as u64).to_le_bytes());
    assert_eq!(f.jit_without_fp(1000), first);
    let mixed = profile(heap.manager(), Unwind::Mixed, 1500, || {
        std::hint::black_box(f.jit_without_fp(200_000));
    });
    assert_mostly_exact(&mixed, &JIT_STACK, "after the move");
    std::fs::remove_dir_all(dir).unwrap();
}

/// Set in the oracle's child: where it writes its agent's stacks.
const ORACLE_CHILD: &str = "JITMAP_TEST_ORACLE_STACKS";

/// The oracle's name, which its child runs alone.
const ORACLE_TEST: &str = "perf_with_dwarf_unwinding_agrees_with_the_mixed_walk";

/// The workload's functions: a sample whose innermost frame is one of these
/// is the workload's, in both profiles.
const WORKLOAD: [&str; 5] = [
    "frameless_leaf",
    "jit_mid",
    "jit_top",
    "jit_mid_nofp",
    "jit_top_nofp",
];

/// A stack's key: its frames from the innermost to the host function that
/// drives the workload, `;`-separated (the frames below differ between the
/// two profilers' views of the test harness). A stack that never reaches
/// the host function keeps its first six frames.
fn key(frames: &[impl AsRef<str>]) -> String {
    let end = frames
        .iter()
        .position(|f| f.as_ref().starts_with("jitmap_testkit::frameless::drive_"))
        .map_or(frames.len().min(6), |i| i + 1);
    frames[..end]
        .iter()
        .map(AsRef::as_ref)
        .collect::<Vec<_>>()
        .join(";")
}

/// Each key's share, in percent, of the workload's samples among
/// `(frames, count)`.
fn shares<'a, S: AsRef<str> + 'a>(
    stacks: impl Iterator<Item = (&'a [S], u64)>,
) -> BTreeMap<String, f64> {
    let mut counts = BTreeMap::new();
    let mut total = 0;
    for (frames, count) in stacks {
        if frames
            .first()
            .is_some_and(|f| WORKLOAD.contains(&f.as_ref()))
        {
            *counts.entry(key(frames)).or_insert(0u64) += count;
            total += count;
        }
    }
    assert!(total >= 1000, "only {total} samples in the workload");
    counts
        .into_iter()
        .map(|(k, c)| (k, c as f64 * 100.0 / total as f64))
        .collect()
}

/// The oracle. `perf record --call-graph dwarf` (perf's own unwinder, with
/// the libraries' `.eh_frame` and the JIT methods' tables from the jitdump)
/// and the agent's mixed walk sample the same run of the frameless
/// workload. perf must find both exact stacks itself, in at least 95% of
/// the workload's samples, and every stack above 5% in either profile must
/// have the same share in both within 3 points.
#[test]
fn perf_with_dwarf_unwinding_agrees_with_the_mixed_walk() {
    if !jitmap_testkit::e2e::runs_x86_64() {
        return;
    }
    if let Some(out) = std::env::var_os(ORACLE_CHILD) {
        return oracle_child(Path::new(&out));
    }
    if !e2e::available("perf") {
        return;
    }
    let _one = one_agent();
    let dir = e2e::temp_dir("agent-unwind-oracle");
    let data = dir.join("perf.data");
    let agent_out = dir.join("agent.stacks");
    let exe = std::env::current_exe().unwrap();
    let record = e2e::perf_command(
        &dir,
        &[
            "record",
            "-k",
            "1",
            "-e",
            "cpu-clock",
            "-F",
            "1000",
            "--call-graph",
            "dwarf",
            "-o",
            data.to_str().unwrap(),
            "--",
            exe.to_str().unwrap(),
            "--exact",
            ORACLE_TEST,
            "--test-threads",
            "1",
        ],
    )
    .env(ORACLE_CHILD, &agent_out)
    .output()
    .unwrap();
    if !e2e::recorded(&record) {
        return;
    }
    assert!(
        String::from_utf8_lossy(&record.stdout).contains("1 passed"),
        "the child failed:\n{}",
        String::from_utf8_lossy(&record.stdout)
    );
    let by_perf = e2e::inject_and_script(&dir, &data);
    let by_perf = shares(by_perf.iter().map(|f| (f.as_slice(), 1)));
    let agent_text = std::fs::read_to_string(&agent_out).unwrap();
    let agent_stacks: Vec<(u64, Vec<&str>)> = agent_text
        .lines()
        .map(|line| {
            let mut fields = line.split('\t');
            let count = fields.next().unwrap().parse().unwrap();
            (count, fields.collect())
        })
        .collect();
    let by_agent = shares(agent_stacks.iter().map(|(c, f)| (f.as_slice(), *c)));
    let table: String = by_perf
        .keys()
        .chain(by_agent.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .map(|k| {
            let (p, a) = (by_perf.get(k), by_agent.get(k));
            format!("perf {p:>6.2?} agent {a:>6.2?}  {k}\n")
        })
        .collect();
    println!("{table}");
    let exact = by_perf.get(&key(&NATIVE_STACK)).unwrap_or(&0.0)
        + by_perf.get(&key(&JIT_STACK)).unwrap_or(&0.0);
    assert!(exact >= 95.0, "perf found {exact:.1}% exact\n{table}");
    for k in by_perf.keys().chain(by_agent.keys()) {
        let (p, a) = (
            by_perf.get(k).copied().unwrap_or(0.0),
            by_agent.get(k).copied().unwrap_or(0.0),
        );
        if p > 5.0 || a > 5.0 {
            assert!(
                (p - a).abs() <= 3.0,
                "{k}: perf {p:.1}%, agent {a:.1}%\n{table}"
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The oracle's child (under `perf record`): the frameless workload on a
/// heap that leaves perf room for each method's unwinding tables, with a
/// jitdump, profiled for 3 s by the mixed walk on the thread's CPU clock
/// (perf samples `cpu-clock`). Its stacks go to `out`, one per line: the
/// count, then the frames innermost first, tab-separated.
fn oracle_child(out: &Path) {
    let manager = ExecutionManager::new(8);
    let perf = jitmap::perf::PerfOutput::from_env(&manager).unwrap();
    assert!(
        perf.jitdump.is_some(),
        "JITMAP_PERF=jitdump is set by perf_command"
    );
    let heap = manager
        .create_heap(HeapConfig {
            span: 1 << 20,
            unwind_room: PERF_UNWIND_ROOM,
            ..HeapConfig::default()
        })
        .unwrap();
    let f = Frameless::build(&heap, out.parent().unwrap(), true).unwrap();
    let p = profile(&manager, Unwind::Mixed, 3000, || {
        std::hint::black_box(f.native_leaf(200_000));
        std::hint::black_box(f.native_leaf(200_000));
        std::hint::black_box(f.jit_without_fp(200_000));
    });
    manager.listeners().flush();
    assert_eq!(perf.jitdump.as_ref().unwrap().unmapped_tables(), 0);
    let text: String = p
        .stacks
        .iter()
        .map(|s| format!("{}\t{}\n", s.count, s.frames.join("\t")))
        .collect();
    std::fs::write(out, text).unwrap();
}

/// A C `work(n)` whose loop sits 2 KiB into its code: in `liba` after it
/// saved three registers (its return address 24 bytes above the stack
/// pointer), in `libb` with no frame at all (its return address on top).
/// Built alike, the two load at the same address in turn, and `liba`'s
/// rows step `libb`'s frame to a plausible, wrong caller.
fn reload_source(saves_registers: bool) -> String {
    let (frame, used) = if saves_registers {
        (r#"__asm__ volatile("" ::: "rbx", "r12", "r13");"#, "")
    } else {
        ("", "")
    };
    format!(
        r#"#include <stdint.h>
uint64_t work(uint64_t n) {{
    {frame}
    __asm__ volatile(".fill 2048, 1, 0x90");
    uint64_t x = n;
    for (uint64_t i = 0; i < n; i++) {{
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        __asm__ volatile("" : "+r"(x));
    }}
    return x{used};
}}
"#
    )
}

/// The native frame that calls a loaded library's `work`.
#[inline(never)]
fn call_lib(work: extern "C" fn(u64) -> u64, n: u64) -> u64 {
    std::hint::black_box(work(std::hint::black_box(n)))
}

/// An object unloaded and another loaded at its addresses while the agent's
/// table still holds the first one's rows (the collector has not run): the
/// second one's frames are never stepped by the first one's rows. Each of
/// its samples has its exact stack or ends at the leaf, counted as
/// `no_unwind_info`.
#[test]
fn rows_of_an_unloaded_object_never_step_the_object_loaded_in_its_place() {
    if !cfg!(target_arch = "x86_64") {
        println!("skipped on aarch64: the two C libraries save x86-64 registers (rbx, r12, r13)");
        return;
    }
    let _one = one_agent();
    let dir = std::env::temp_dir().join(format!("agent-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let a = build_shared_object(&dir, "reload_a", &reload_source(true)).unwrap();
    let b = build_shared_object(&dir, "reload_b", &reload_source(false)).unwrap();
    let (handle_a, work_a) = load(&a, c"work").unwrap();
    let manager = ExecutionManager::new(8);
    let agent = Agent::start(
        &manager,
        AgentConfig {
            hz: 10_000,
            clock: Clock::Wall,
            max_depth: 16,
            ring_capacity: 1 << 15,
            // No collection pass (and so no new table) until the agent stops:
            // no timer's, and no doorbell's before 16,384 samples (1.6 s;
            // the bell is at half full from 4 kHz).
            collect_every: Duration::from_secs(3600),
            ..AgentConfig::default()
        },
    )
    .unwrap();
    let attached = agent.attach_current_thread().unwrap();
    // SAFETY: `work` has this C signature.
    let work: extern "C" fn(u64) -> u64 = unsafe { std::mem::transmute(work_a) };
    call_lib(work, 1 << 22);
    // SAFETY: the handle `load` opened; nothing of liba runs any more.
    assert_eq!(unsafe { libc::dlclose(handle_a) }, 0);
    let (handle_b, work_b) = load(&b, c"work").unwrap();
    assert_eq!(
        work_b, work_a,
        "libb did not load where liba was: nothing to test"
    );
    // SAFETY: as above.
    let work: extern "C" fn(u64) -> u64 = unsafe { std::mem::transmute(work_b) };
    let mut calls = 0;
    while calls < 30 {
        call_lib(work, 1 << 22);
        calls += 1;
    }
    drop(attached);
    let profile = agent.stop();
    // SAFETY: the handle `load` opened; the agent has stopped.
    unsafe { libc::dlclose(handle_b) };
    let (mut exact, mut cut, mut wrong) = (0, 0, Vec::new());
    for s in profile.stacks.iter().filter(|s| s.frames[0] == "work") {
        if s.frames.len() > 1 && s.frames[1].ends_with("call_lib") {
            exact += s.count;
        } else if s.frames.len() == 1 {
            cut += s.count;
        } else {
            wrong.push(s);
        }
    }
    println!(
        "in work: {exact} exact, {cut} ended at the leaf, {} built from another object's rows; ends {:?}",
        wrong.iter().map(|s| s.count).sum::<u64>(),
        profile.stack_ends
    );
    assert!(
        wrong.is_empty(),
        "stacks stepped by liba's rows in libb: {wrong:?}"
    );
    assert!(
        cut >= 100,
        "only {cut} samples in libb before its rows were loaded"
    );
    assert!(profile.stack_ends.no_unwind_info >= cut);
    std::fs::remove_dir_all(&dir).unwrap();
}
