//! Cranelift code under jitmap's agent and perf: three leaves that take time
//! 1:2:4 get their shares with exact stacks, perf (through the jitdump the
//! manager writes) names the same leaves, and a Rust panic raised in a host
//! function called from Cranelift code unwinds to a `catch_unwind` above it.

mod programs;

use std::time::{Duration, Instant};

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{InstBuilder, types::I64};
use cranelift_module::{FuncId, Linkage, Module, default_libcall_names};
use jitmap::ExecutionManager;
use jitmap::agent::{Agent, AgentConfig, Clock, Profile};
use jitmap_cranelift::{JitmapBuilder, JitmapModule};
use jitmap_testkit::e2e::{
    self, inject_and_report, normalized, one_run, record, recorded, report_share, temp_dir,
};
use jitmap_testkit::rng::Rng;

const LEAVES: [&str; 3] = ["leaf_1x", "leaf_2x", "leaf_4x"];
/// 1/7, 2/7 and 4/7, in percent.
const EXPECTED: [f64; 3] = [100.0 / 7.0, 200.0 / 7.0, 400.0 / 7.0];

/// `leaf_kx(n)`: sums 0..k*n in a loop. `middle(n)` calls the three leaves;
/// `top(rounds, n)` calls `middle` `rounds` times. Returns top's entry.
fn demo(module: &mut JitmapModule) -> extern "C" fn(i64, i64) -> i64 {
    let mut leaves = Vec::new();
    for (k, name) in [1i64, 2, 4].into_iter().zip(LEAVES) {
        let id = module
            .declare_function(name, Linkage::Export, &programs::sig(module, 1))
            .unwrap();
        let mut ctx = programs::body(module, 1, |_, b, args| {
            let head = b.create_block();
            let step = b.create_block();
            let done = b.create_block();
            b.append_block_param(head, I64);
            b.append_block_param(head, I64);
            let n = b.ins().imul_imm_s(args[0], k);
            let zero = b.ins().iconst(I64, 0);
            b.ins().jump(head, &[n.into(), zero.into()]);
            b.switch_to_block(head);
            let (i, acc) = (b.block_params(head)[0], b.block_params(head)[1]);
            let more = b.ins().icmp_imm_s(IntCC::SignedGreaterThan, i, 0);
            b.ins().brif(more, step, &[], done, &[]);
            b.switch_to_block(step);
            let acc2 = b.ins().iadd(acc, i);
            let i2 = b.ins().iadd_imm_s(i, -1);
            b.ins().jump(head, &[i2.into(), acc2.into()]);
            b.switch_to_block(done);
            b.ins().return_(&[acc]);
        });
        module.define_function(id, &mut ctx).unwrap();
        leaves.push(id);
    }
    let middle = module
        .declare_function("middle", Linkage::Export, &programs::sig(module, 1))
        .unwrap();
    let mut ctx = programs::body(module, 1, |module, b, args| {
        let mut sum = b.ins().iconst(I64, 0);
        for &leaf in &leaves {
            let f = module.declare_func_in_func(leaf, b.func);
            let c = b.ins().call(f, &[args[0]]);
            let r = b.inst_results(c)[0];
            sum = b.ins().iadd(sum, r);
        }
        b.ins().return_(&[sum]);
    });
    module.define_function(middle, &mut ctx).unwrap();
    let top: FuncId = module
        .declare_function("top", Linkage::Export, &programs::sig(module, 2))
        .unwrap();
    let mut ctx = programs::body(module, 2, |module, b, args| {
        let f = module.declare_func_in_func(middle, b.func);
        let head = b.create_block();
        let step = b.create_block();
        let done = b.create_block();
        b.append_block_param(head, I64);
        b.append_block_param(head, I64);
        let zero = b.ins().iconst(I64, 0);
        b.ins().jump(head, &[args[0].into(), zero.into()]);
        b.switch_to_block(head);
        let (i, acc) = (b.block_params(head)[0], b.block_params(head)[1]);
        let more = b.ins().icmp_imm_s(IntCC::SignedGreaterThan, i, 0);
        b.ins().brif(more, step, &[], done, &[]);
        b.switch_to_block(step);
        let c = b.ins().call(f, &[args[1]]);
        let r = b.inst_results(c)[0];
        let acc2 = b.ins().iadd(acc, r);
        let i2 = b.ins().iadd_imm_s(i, -1);
        b.ins().jump(head, &[i2.into(), acc2.into()]);
        b.switch_to_block(done);
        b.ins().return_(&[acc]);
    });
    module.define_function(top, &mut ctx).unwrap();
    module.finalize_definitions().unwrap();
    // SAFETY: `top` takes two i64s and returns one.
    unsafe { programs::f2(module.get_finalized_function(top)) }
}

/// What `top(1, n)` returns.
fn expected(n: i64) -> i64 {
    [1, 2, 4].iter().map(|k| (k * n) * (k * n + 1) / 2).sum()
}

/// The native frame that calls `top`, kept out of line.
#[inline(never)]
fn call_top(top: extern "C" fn(i64, i64) -> i64, n: i64) -> i64 {
    std::hint::black_box(top(1, std::hint::black_box(n)))
}

/// Runs the demo under the agent (wall clock, `hz`) until its thread has
/// taken `samples` samples (at most a minute); returns
/// the profile and the number of wrong results.
fn profile_demo(manager: &ExecutionManager, hz: u32, samples: u64) -> (Profile, u64) {
    let mut module =
        JitmapModule::new(JitmapBuilder::new(manager, default_libcall_names()).unwrap()).unwrap();
    let top = demo(&mut module);
    let agent = Agent::start(
        manager,
        AgentConfig {
            hz,
            clock: Clock::Wall,
            ..AgentConfig::default()
        },
    )
    .unwrap();
    let attached = agent.attach_current_thread().unwrap();
    let mut rng = Rng::new(7);
    let mut wrong = 0;
    // The samples asked for, however long a busy machine takes, at most a
    // minute.
    let cap = Instant::now() + Duration::from_secs(60);
    while attached.samples_taken() < samples && Instant::now() < cap {
        // A base that changes every call, so the sampler cannot phase-lock.
        let n = 10_000 + rng.below(20_000) as i64;
        wrong += u64::from(call_top(top, n) != expected(n));
    }
    drop(attached);
    (agent.stop(), wrong)
}

#[test]
fn leaves_get_their_share_and_their_exact_stack() {
    let _one = one_run();
    let manager = ExecutionManager::new(16);
    let (p, wrong) = profile_demo(&manager, 2000, 3200);
    assert_eq!(wrong, 0);
    assert!(p.samples >= 2000, "only {} samples", p.samples);
    assert_eq!(p.unattributed, 0);
    let summary = p.summary();
    for (leaf, expected) in LEAVES.iter().zip(EXPECTED) {
        let share = summary.iter().find(|m| m.name == *leaf).unwrap().self_share * 100.0;
        assert!(
            (share - expected).abs() <= 3.0,
            "{leaf}: {share:.1}%, expected {expected:.1}%"
        );
    }
    // Every sample in a leaf: leaf; middle; top; the native caller.
    let mut in_leaves = 0;
    for stack in &p.stacks {
        if LEAVES.contains(&stack.frames[0].as_str()) {
            in_leaves += stack.count;
            assert_eq!(stack.frames[1..3], ["middle", "top"], "{:?}", stack.frames);
            assert!(stack.frames[3].ends_with("call_top"), "{:?}", stack.frames);
        }
    }
    assert!(
        in_leaves * 10 >= p.counted() * 9,
        "{in_leaves} of {}",
        p.samples
    );
}

/// Run by `perf_names_the_same_leaves` as the recorded process: the demo
/// under the agent, with jitdump on, printing the agent's leaf shares.
#[test]
#[ignore = "the child process of perf_names_the_same_leaves"]
fn child_demo_under_perf() {
    let manager = ExecutionManager::new(16);
    let _perf = jitmap::perf::PerfOutput::from_env(&manager).unwrap();
    let (p, wrong) = profile_demo(&manager, 2000, 6000);
    assert_eq!(wrong, 0);
    let summary = p.summary();
    let shares = LEAVES.map(|l| {
        summary
            .iter()
            .find(|m| m.name == l)
            .map_or(0.0, |m| m.self_share * 100.0)
    });
    println!("agent-shares {} {} {}", shares[0], shares[1], shares[2]);
}

#[test]
fn perf_names_the_same_leaves() {
    if !e2e::available("perf") {
        return;
    }
    let _one = one_run();
    let dir = temp_dir("cranelift-perf");
    let data = dir.join("perf.data");
    let exe = std::env::current_exe().unwrap();
    let command = [
        exe.to_str().unwrap(),
        "--exact",
        "child_demo_under_perf",
        "--ignored",
        "--nocapture",
    ];
    let out = record(&dir, &data, Some(2000), &command).output().unwrap();
    if !recorded(&out) {
        return;
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let agent: Vec<f64> = stdout
        .lines()
        .find_map(|l| l.strip_prefix("agent-shares "))
        .unwrap_or_else(|| panic!("no shares from the child: {stdout}"))
        .split(' ')
        .map(|s| s.parse().unwrap())
        .collect();
    let text = inject_and_report(&dir, &data, "sym");
    let from_perf = normalized(LEAVES.map(|l| report_share(&text, l).1));
    let from_agent = normalized([agent[0], agent[1], agent[2]]);
    // Each sampler is steady within a run but not from run to run: on this
    // 2-vCPU VM, run alone, the two differed by 3.4 to 5.5 points on one
    // leaf in 3 runs of 8, before issue 57 as after, whichever was off, and
    // once by 10 points; more samples did not narrow it (18,000 each: still
    // 5.2). A leaf named wrongly or not at all moves its share by 14 points
    // or more, and `report_share` fails on a missing name.
    for i in 0..3 {
        assert!(
            (from_agent[i] - from_perf[i]).abs() <= 7.0,
            "{}: agent {:.1}%, perf {:.1}%",
            LEAVES[i],
            from_agent[i],
            from_perf[i]
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

extern "C-unwind" fn boom(x: i64) -> i64 {
    if x > 0 {
        panic!("raised in a host function below a Cranelift frame");
    }
    x
}

#[test]
fn a_panic_unwinds_through_a_cranelift_frame() {
    let manager = ExecutionManager::new(4);
    let mut builder = JitmapBuilder::new(&manager, default_libcall_names()).unwrap();
    builder.symbol("boom", boom as *const u8);
    let mut module = JitmapModule::new(builder).unwrap();
    let sig = programs::sig(&module, 1);
    let host = module
        .declare_function("boom", Linkage::Import, &sig)
        .unwrap();
    let calls = module
        .declare_function("calls_boom", Linkage::Export, &sig)
        .unwrap();
    let mut ctx = programs::body(&mut module, 1, |module, b, args| {
        let f = module.declare_func_in_func(host, b.func);
        let c = b.ins().call(f, &[args[0]]);
        let r = b.inst_results(c)[0];
        let r = b.ins().iadd_imm_s(r, 1);
        b.ins().return_(&[r]);
    });
    module.define_function(calls, &mut ctx).unwrap();
    module.finalize_definitions().unwrap();
    // SAFETY: `calls_boom` takes and returns one i64, and may unwind.
    let f: extern "C-unwind" fn(i64) -> i64 =
        unsafe { std::mem::transmute(module.get_finalized_function(calls)) };
    assert_eq!(f(0), 1);
    for _ in 0..3 {
        let caught = std::panic::catch_unwind(|| f(1)).unwrap_err();
        assert_eq!(
            caught.downcast_ref::<&str>(),
            Some(&"raised in a host function below a Cranelift frame")
        );
    }
}

/// Calls `f` (a trampoline's address) `n` times, out of line: the native
/// frame a trampoline returns into.
#[inline(never)]
fn call_through(f: extern "C" fn(i64) -> i64, n: i64) -> i64 {
    let mut acc = 0i64;
    for i in 0..n {
        acc = acc.wrapping_add(f(std::hint::black_box(i)));
    }
    acc
}

/// Samples a loop that calls a tiny Cranelift function through its
/// trampoline until `wanted` samples fell in the trampoline (at most 60 s),
/// with `unwind`; returns (exact, total) over those samples. Exact: the
/// trampoline, then `call_through`, then its caller, this function's loop.
#[inline(never)]
fn trampoline_stacks(unwind: jitmap::agent::Unwind, wanted: u64) -> (u64, u64) {
    let manager = ExecutionManager::new(16);
    let mut module =
        JitmapModule::new(JitmapBuilder::new(&manager, default_libcall_names()).unwrap()).unwrap();
    let id = module
        .declare_function("inc", Linkage::Export, &programs::sig(&module, 1))
        .unwrap();
    let mut ctx = programs::body(&mut module, 1, |_, b, args| {
        let r = b.ins().iadd_imm_s(args[0], 1);
        b.ins().return_(&[r]);
    });
    module.define_function(id, &mut ctx).unwrap();
    module.finalize_definitions().unwrap();
    // SAFETY: `inc` takes and returns one i64; the address is its trampoline.
    let inc = unsafe { programs::f1(module.get_finalized_function(id)) };
    let agent = Agent::start(
        &manager,
        AgentConfig {
            hz: 10_000,
            clock: Clock::Wall,
            unwind,
            ..AgentConfig::default()
        },
    )
    .unwrap();
    // The module names its trampolines' kind; the agent labels them so.
    let stub = format!(
        "[stub {}: trampoline ({})]",
        jitmap_cranelift::TRAMPOLINE.get(),
        jitmap_cranelift::STUB_OWNER
    );
    let done = std::sync::atomic::AtomicBool::new(false);
    let (exact, total) = std::thread::scope(|s| {
        let windows = s.spawn(|| {
            let (mut exact, mut total) = (0, 0);
            let cap = Instant::now() + Duration::from_secs(60);
            while total < wanted && Instant::now() < cap {
                let p = agent.profile_window(Duration::from_millis(200)).unwrap();
                for stack in p.stacks.iter().filter(|s| s.frames[0] == stub) {
                    total += stack.count;
                    let f = &stack.frames;
                    if f.len() > 2
                        && f[1].ends_with("call_through")
                        && f[2].starts_with("profile::trampoline_stacks")
                    {
                        exact += stack.count;
                    } else if exact + total < 20 {
                        eprintln!("{unwind:?}: {f:?}");
                    }
                }
            }
            // Relaxed: a stop flag; the scope's join orders the rest.
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            (exact, total)
        });
        let attached = agent.attach_current_thread().unwrap();
        // Relaxed: as above.
        while !done.load(std::sync::atomic::Ordering::Relaxed) {
            assert_eq!(call_through(inc, 10_000), 10_000 * 10_001 / 2);
        }
        drop(attached);
        windows.join().unwrap()
    });
    drop(agent.stop());
    (exact, total)
}

#[test]
fn a_sample_in_a_trampoline_keeps_its_caller() {
    let _one = one_run();
    for unwind in [
        jitmap::agent::Unwind::Mixed,
        jitmap::agent::Unwind::FramePointer,
    ] {
        let (exact, total) = trampoline_stacks(unwind, 300);
        assert!(
            total >= 300,
            "{unwind:?}: only {total} samples in the trampoline"
        );
        assert!(
            exact * 100 >= total * 99,
            "{unwind:?}: {exact} of {total} samples in the trampoline have the exact stack"
        );
    }
}
