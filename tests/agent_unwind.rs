//! The mixed unwinder against the two stacks a frame-pointer walk gets
//! wrong (`jitmap_testkit::frameless`): a native leaf built without frame
//! pointers under JIT code, and JIT code that keeps no frame pointer and
//! describes itself with CFI. Each runs under both modes: the mixed walk
//! must give the exact stack in at least 99% of the samples, and the
//! frame-pointer walk is shown to lose it (so the check can fail). A
//! counting allocator sees no heap call inside the handler in either mode,
//! while it evaluates native rules and the JIT methods' CFI.
#![cfg(target_arch = "x86_64")]

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use jitmap::agent::{Agent, AgentConfig, Clock, Profile, Unwind};
use jitmap::{ExecutionManager, HeapConfig};
use jitmap_testkit::frameless::{Frameless, JIT_STACK, NATIVE_STACK};
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

/// Runs `work` for 1.5 s under an agent on `manager` walking by `unwind`;
/// asserts that the handler made no heap call.
fn profile(manager: &ExecutionManager, unwind: Unwind, work: impl Fn()) -> Profile {
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
    let until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < until {
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

/// (samples whose leaf is `stack[0]`, those whose innermost frames are
/// exactly `stack`).
fn exact(profile: &Profile, stack: &[&str]) -> (u64, u64) {
    let mut in_leaf = 0;
    let mut exact = 0;
    for s in &profile.stacks {
        if s.frames.first().map(String::as_str) != Some(stack[0]) {
            continue;
        }
        in_leaf += s.count;
        if s.frames.len() >= stack.len() && s.frames.iter().zip(stack).all(|(f, want)| f == want) {
            exact += s.count;
        }
    }
    (in_leaf, exact)
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

/// Profiles `run` (one call of the workload) under both walks: the mixed
/// walk must give `stack` exactly in at least 99% of the samples in its
/// leaf, with complete stacks; the frame-pointer walk, in none.
fn check(stack: &[&str], run: impl Fn(&Frameless)) {
    let _one = one_agent();
    let (heap, f, dir) = workload();
    let on = |unwind| profile(heap.manager(), unwind, || run(&f));
    let mixed = on(Unwind::Mixed);
    let (in_leaf, good) = exact(&mixed, stack);
    println!(
        "mixed: {good} of {in_leaf} leaf samples exact; ends {:?}",
        mixed.stack_ends
    );
    assert!(
        in_leaf >= 500,
        "{in_leaf} samples in the leaf\n{}",
        stacks(&mixed)
    );
    assert!(
        good * 100 >= in_leaf * 99,
        "{good} of {in_leaf} exact\n{}",
        stacks(&mixed)
    );
    // Complete stacks, down to the thread's start.
    assert!(
        mixed.stack_ends.root * 100 >= mixed.stack_ends.total() * 99,
        "{:?}",
        mixed.stack_ends
    );
    let fp = on(Unwind::FramePointer);
    let (fp_leaf, fp_good) = exact(&fp, stack);
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
    check(&NATIVE_STACK, |f| {
        std::hint::black_box(f.native_leaf(200_000));
    });
}

/// rbp holds garbage in `jit_mid_nofp`: the frame-pointer walk ends there.
#[test]
fn jit_code_without_frame_pointers_unwinds_by_its_cfi() {
    check(&JIT_STACK, |f| {
        std::hint::black_box(f.jit_without_fp(200_000));
    });
}
