//! The agent's costs: one sample through the handler's code at depth 8 and 32
//! (over real JIT frames, under two native frames), walking frame pointers
//! and with the mixed unwinder, and the probes called from JIT code, each
//! beside a floor measured in the same run.

use std::hint::black_box;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use jitmap::agent::{
    Agent, AgentConfig, AttachedThread, CallCounters, Unwind, jitmap_probe_count,
    jitmap_probe_enter,
};
use jitmap::{ExecutionManager, HeapConfig, OwnedHeap};
use jitmap_testkit::jitcode;

/// Samples taken at the bottom of each recursion.
const SAMPLES_PER_CALL: u64 = 64;
/// JIT frames below the callback: more than the deepest walk measured.
const JIT_FRAMES: u64 = 40;

/// The attached handle the callback samples through (this bench's thread only).
static ATTACHED: AtomicPtr<AttachedThread> = AtomicPtr::new(std::ptr::null_mut());

extern "C" fn sample_here(samples: u64) {
    // Relaxed: set by this same thread before the JIT code runs.
    let attached = ATTACHED.load(Ordering::Relaxed);
    // SAFETY: points at the handle below, alive while the bench runs.
    let attached = unsafe { &*attached };
    for _ in 0..samples {
        attached.sample_now();
    }
}

extern "C" fn do_nothing(samples: u64) {
    for _ in 0..samples {
        black_box(());
    }
}

extern "C" fn empty_call(a: u64, b: u64) -> u64 {
    black_box(a ^ b)
}

/// Times `iters` calls of `f`, pausing (untimed) whenever the thread's rings
/// are half full until the collector has drained them, so that no record is
/// dropped and every timed call does the full work.
fn timed_without_drops(iters: u64, attached: &AttachedThread, f: impl Fn(u64)) -> Duration {
    let mut total = Duration::ZERO;
    for i in 0..iters {
        let (samples, probes) = attached.backlog();
        if samples > RING / 2 || probes > RING / 2 {
            while attached.backlog() != (0, 0) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let start = Instant::now();
        f(i);
        total += start.elapsed();
    }
    total
}

/// Ring capacity (samples, and probe records) in these benches.
const RING: usize = 1 << 16;

/// A 1 MiB heap of its own manager, for one bench's JIT code.
fn small_heap() -> OwnedHeap {
    ExecutionManager::new(8)
        .create_heap(HeapConfig {
            span: 1 << 20,
            ..HeapConfig::default()
        })
        .unwrap()
}

fn handler(c: &mut Criterion) {
    let heap = small_heap();
    let rec = jitcode::publish(&heap, "recurse", 1, jitcode::recursion).unwrap();
    // SAFETY: a published function with this C signature (see `jitcode`).
    let recurse: extern "C" fn(u64, extern "C" fn(u64), u64) =
        unsafe { std::mem::transmute(rec.start()) };
    let mut group = c.benchmark_group("agent/sample");
    group.throughput(Throughput::Elements(SAMPLES_PER_CALL));
    group.bench_function("floor (recursion, no sample)", |b| {
        b.iter(|| recurse(JIT_FRAMES, do_nothing, SAMPLES_PER_CALL))
    });
    for (depth, unwind) in [8usize, 32]
        .into_iter()
        .flat_map(|d| [(d, Unwind::FramePointer), (d, Unwind::Mixed)])
    {
        let agent = Agent::start(
            heap.manager(),
            AgentConfig {
                hz: 1, // the timer stays out of the way; samples are taken synchronously
                max_depth: depth,
                ring_capacity: RING,
                collect_every: Duration::from_millis(1),
                unwind,
                ..AgentConfig::default()
            },
        )
        .unwrap();
        let mode = match unwind {
            Unwind::FramePointer => "frame pointers",
            Unwind::Mixed => "mixed",
        };
        let attached = agent.attach_current_thread().unwrap();
        // Relaxed: read by this thread only.
        ATTACHED.store(
            (&attached as *const AttachedThread).cast_mut(),
            Ordering::Relaxed,
        );
        group.bench_function(format!("depth {depth}, {mode}"), |b| {
            b.iter_custom(|iters| {
                timed_without_drops(iters, &attached, |_| {
                    recurse(JIT_FRAMES, sample_here, SAMPLES_PER_CALL)
                })
            })
        });
        // Relaxed: as above.
        ATTACHED.store(std::ptr::null_mut(), Ordering::Relaxed);
        drop(attached);
        let profile = agent.stop();
        eprintln!(
            "depth {depth}, {mode}: {} samples, {} dropped, {:.1} lookups per sample, ends {:?}",
            profile.samples,
            profile.dropped,
            profile.lookups as f64 / profile.samples.max(1) as f64,
            profile.stack_ends
        );
    }
    group.finish();
}

fn probes(c: &mut Criterion) {
    let heap = small_heap();
    let looped = |name: &str, target: usize| {
        let code = jitcode::publish(&heap, name, 2, jitcode::call_loop(target as u64)).unwrap();
        // SAFETY: a published function with this C signature (see `jitcode`).
        let f: extern "C" fn(u64, u64, u64) = unsafe { std::mem::transmute(code.start()) };
        f
    };
    let empty = looped("empty", empty_call as *const () as usize);
    let count = looped("count", jitmap_probe_count as *const () as usize);
    let enter = looped("enter", jitmap_probe_enter as *const () as usize);
    let counters = CallCounters::new(1, u32::MAX).unwrap();
    let cell = counters.cell(0).unwrap() as u64;
    let agent = Agent::start(
        heap.manager(),
        AgentConfig {
            hz: 1,
            probe_capacity: RING,
            collect_every: Duration::from_millis(1),
            ..AgentConfig::default()
        },
    )
    .unwrap();
    let attached = agent.attach_current_thread().unwrap();
    let context = attached.probe_context() as u64;
    const CALLS: u64 = 1000;
    let mut group = c.benchmark_group("agent/probe");
    group.throughput(Throughput::Elements(CALLS));
    group.bench_function("floor (empty native call)", |b| {
        b.iter(|| empty(CALLS, 1, 2))
    });
    group.bench_function("call counter", |b| b.iter(|| count(CALLS, cell, 0)));
    group.bench_function("entry probe", |b| {
        b.iter_custom(|iters| timed_without_drops(iters, &attached, |_| enter(CALLS, context, 7)))
    });
    group.finish();
    drop(attached);
    let profile = agent.stop();
    eprintln!(
        "entry probe: {} recorded, {} dropped",
        profile.probes.enters, profile.probes.dropped
    );
}

criterion_group!(benches, handler, probes);
criterion_main!(benches);
