//! Signal-safety torture: threads that live in malloc and free, in panics
//! caught by `catch_unwind`, in heap publish and free, and in `dlopen`, a
//! call into the object just loaded and `dlclose`, sampled at 10 kHz for 5
//! seconds with the agent's default (mixed) unwinder, whose native tables
//! follow the loads and unloads. No deadlock (a watchdog aborts the process),
//! no crash, at least 80% of the expected samples (10 kHz over the CPU time
//! the workers got), a counting allocator that sees no allocation inside the
//! handler or the probes, and samples inside the loaded objects unwound to
//! the worker that called them.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use jitmap::agent::{
    Agent, AgentConfig, CallCounters, Clock, jitmap_probe_count, jitmap_probe_enter,
    jitmap_probe_value,
};
use jitmap::{CodeInfo, ExecutionManager, HeapConfig, JitKind};
use jitmap_testkit::frameless;
use jitmap_testkit::signal_alloc::{
    SignalCounting, check_mask, take_while_blocked, thread_heap_calls, with_sigprof_blocked,
};

/// Counts each thread's heap calls, and those made inside a SIGPROF handler
/// (see `jitmap_testkit::signal_alloc`).
#[global_allocator]
static GLOBAL: SignalCounting = SignalCounting;

const HZ: u32 = 10_000;
const THREADS: usize = 2;
/// CPU time each worker runs for: what a wall-clock timer can sample, so a
/// loaded machine takes longer, never fewer samples.
const WORK_CPU_NS: u64 = 1_500_000_000;
/// The longest a worker runs, in wall time, however little CPU it gets.
const CAP: Duration = Duration::from_secs(120);

/// The calling thread's CPU time in nanoseconds.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is valid storage; the clock always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[test]
fn sampling_malloc_panics_and_heap_writers_is_safe() {
    // The detector itself: an allocation with SIGPROF blocked is caught.
    check_mask(true);
    with_sigprof_blocked(|| drop(std::hint::black_box(vec![1u8; 64])));
    assert_eq!(take_while_blocked(), 2, "alloc and free seen");

    std::panic::set_hook(Box::new(|_| {})); // the panics below are expected
    let manager = ExecutionManager::new(32);
    let heap = manager
        .create_heap(HeapConfig {
            span: 4 << 20,
            ..HeapConfig::default()
        })
        .unwrap();
    let counters = CallCounters::new(16, 1000).unwrap();
    // One object, copied under a new name for each load: each `dlopen` maps
    // a new object, and each `dlclose` unmaps it.
    let dir = std::env::temp_dir().join(format!("agent-torture-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let object =
        frameless::build_shared_object(&dir, "frameless_leaf", frameless::leaf_source()).unwrap();
    let loads = AtomicU64::new(0);
    let agent = Agent::start(
        &manager,
        AgentConfig {
            hz: HZ,
            clock: Clock::Wall,
            ring_capacity: 1024,
            // A pass every 20 ms (the default waits 100): an object loaded
            // for 50 ms is unwound from the pass after its load on.
            collect_every: Duration::from_millis(20),
            ..AgentConfig::default()
        },
    )
    .unwrap();
    let progress: Vec<AtomicU64> = (0..THREADS).map(|_| AtomicU64::new(0)).collect();
    let done = AtomicBool::new(false);
    let probe_heap_calls = AtomicU64::new(0);
    // CPU nanoseconds the workers ran: a wall-clock timer's signal reaches a
    // thread only while it runs, so this, not the wall time, is what a busy
    // machine leaves to be sampled.
    let cpu_ns = AtomicU64::new(0);
    let started = Instant::now();
    let finished = AtomicU64::new(0);
    std::thread::scope(|s| {
        // Watchdog: no progress for 15 s means a deadlock; abort so the test fails.
        s.spawn(|| {
            let mut last = vec![0; THREADS];
            let mut still = Instant::now();
            // Relaxed: a stop flag.
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(100));
                // Relaxed: progress counters, compared over time only.
                let now: Vec<u64> = progress.iter().map(|p| p.load(Ordering::Relaxed)).collect();
                if now.iter().zip(&last).all(|(a, b)| a > b) {
                    still = Instant::now();
                    last = now;
                } else if still.elapsed() > Duration::from_secs(15) {
                    eprintln!("watchdog: no progress for 15 s ({now:?}): deadlock");
                    std::process::abort();
                }
            }
        });
        for (t, progress) in progress.iter().enumerate() {
            let (agent, heap, counters, probe_heap_calls, cpu_ns) =
                (&agent, &heap, &counters, &probe_heap_calls, &cpu_ns);
            let (dir, object, loads, finished) = (&dir, &object, &loads, &finished);
            s.spawn(move || {
                let attached = agent.attach_current_thread().unwrap();
                let cpu_start = thread_cpu_ns();
                let context = attached.probe_context();
                let cell = counters.cell(t as u32).unwrap();
                let mut round = 0u64;
                while thread_cpu_ns() - cpu_start < WORK_CPU_NS && started.elapsed() < CAP {
                    // One round in 32 (the others take a millisecond or
                    // so): an object loaded, run for 50 ms (so that the
                    // collector's 20 ms passes see it), and unloaded.
                    let kind = if round % 32 == 31 { 3 } else { round % 3 };
                    match kind {
                        3 => {
                            // Relaxed: a unique number.
                            let n = loads.fetch_add(1, Ordering::Relaxed);
                            let copy = dir.join(format!("libtorture{n}.so"));
                            std::fs::copy(object, &copy).unwrap();
                            let (handle, leaf) = frameless::load(&copy, c"frameless_leaf").unwrap();
                            // SAFETY: the C leaf's signature.
                            let leaf: extern "C" fn(u64) -> u64 =
                                unsafe { std::mem::transmute(leaf) };
                            let until = Instant::now() + Duration::from_millis(50);
                            while Instant::now() < until {
                                std::hint::black_box(leaf(std::hint::black_box(10_000)));
                            }
                            // SAFETY: opened above, closed once, its code no
                            // longer running.
                            assert_eq!(unsafe { libc::dlclose(handle) }, 0);
                            std::fs::remove_file(&copy).unwrap();
                        }
                        // malloc and free of many sizes
                        0 => {
                            let mut v: Vec<Vec<u8>> = Vec::new();
                            for i in 0..64 {
                                v.push(vec![i as u8; 16 + (i * 97 + round as usize) % 4000]);
                            }
                            let s: String = v.iter().map(|x| x.len().to_string()).collect();
                            std::hint::black_box(s);
                        }
                        // panics caught: the unwinder's locks and allocations
                        1 => {
                            for _ in 0..4 {
                                let r = std::panic::catch_unwind(|| {
                                    panic!("{}", std::hint::black_box("torture"))
                                });
                                assert!(r.is_err());
                            }
                        }
                        // heap writers: publish and free (the heap's lock)
                        _ => {
                            let mut refs = Vec::new();
                            for i in 0..16 {
                                let mut r = heap.reserve(32 + i).unwrap();
                                r.code_mut().fill(0xC3);
                                refs.push(
                                    r.publish(CodeInfo::new(i, "t", JitKind::Optimized))
                                        .unwrap(),
                                );
                            }
                            for r in refs {
                                heap.free(r).unwrap();
                            }
                        }
                    }
                    // The probes, interrupted by signals too, allocate nothing.
                    let before = thread_heap_calls();
                    for i in 0..100 {
                        // SAFETY: this thread's own context and a live cell.
                        unsafe {
                            jitmap_probe_enter(context, i);
                            jitmap_probe_value(context, i, round);
                            jitmap_probe_count(cell);
                        }
                    }
                    // Relaxed: a sum read after the join.
                    probe_heap_calls.fetch_add(thread_heap_calls() - before, Ordering::Relaxed);
                    round += 1;
                    // Relaxed: read by the watchdog only.
                    progress.store(round, Ordering::Relaxed);
                }
                drop(attached);
                // Relaxed: a sum read after the join.
                cpu_ns.fetch_add(thread_cpu_ns(), Ordering::Relaxed);
                // Relaxed: polled by the loop below; the join orders the rest.
                finished.fetch_add(1, Ordering::Relaxed);
            });
        }
        // Wait for the workers (they are joined by the scope), then stop the watchdog.
        // Relaxed: as above.
        while finished.load(Ordering::Relaxed) < THREADS as u64 {
            std::thread::sleep(Duration::from_millis(50));
        }
        // Relaxed: a stop flag.
        done.store(true, Ordering::Relaxed);
    });
    // Relaxed: the workers are joined.
    let cpu_secs = cpu_ns.load(Ordering::Relaxed) as f64 / 1e9;
    let profile = agent.stop();
    // Every thread is joined.
    check_mask(false);
    assert_eq!(take_while_blocked(), 0, "the handler allocated");
    // Relaxed: as above.
    assert_eq!(
        probe_heap_calls.load(Ordering::Relaxed),
        0,
        "a probe allocated"
    );
    assert!(cpu_secs > 1.0, "the workers ran only {cpu_secs:.2} s");
    // The handlers' own time is not billed to the frames they interrupted
    // (on the wall clock a sample leaves out the whole periods its thread's
    // previous handler took): what the timers sampled is the workers' CPU
    // less the handlers'.
    let expected = f64::from(HZ) * (cpu_secs - profile.handler_time.as_secs_f64());
    println!(
        "torture: {} taken of {expected:.0} expected ({cpu_secs:.2} CPU seconds), {} dropped, {} probe records",
        profile.taken,
        profile.dropped,
        profile.probes.enters + profile.probes.values
    );
    // Periods, not signals: a thread whose handler fell behind (qemu-user's
    // deep walks, a loaded machine) backs off, and its fewer signals each
    // stand for several periods, dropped ones too.
    let periods = profile.counted() + profile.dropped_periods;
    assert!(
        periods as f64 >= 0.8 * expected,
        "{periods} periods of {expected:.0} expected ({} signals)",
        profile.taken
    );
    assert_eq!(profile.samples + profile.dropped, profile.taken);
    assert_eq!(profile.threads, THREADS);
    assert!(profile.probes.enters > 0);
    // Samples in the loaded objects: once the collector has seen a load
    // (within its 20 ms pass), the leaf's caller is the worker itself. The
    // leaf is named if the object was still loaded when the collector named
    // it, and is an address otherwise.
    let (mut named, mut unwound) = (0, 0);
    for stack in &profile.stacks {
        let leaf = &stack.frames[0];
        if (leaf == "frameless_leaf" || leaf.starts_with("0x"))
            && stack
                .frames
                .get(1)
                .is_some_and(|f| f.starts_with("agent_torture::"))
        {
            unwound += stack.count;
            if leaf == "frameless_leaf" {
                named += stack.count;
            }
        }
    }
    println!(
        "torture: {} objects loaded; {unwound} samples in them unwound to the worker ({named} named); ends {:?}",
        // Relaxed: the workers are joined.
        loads.load(Ordering::Relaxed),
        profile.stack_ends
    );
    assert!(
        unwound > 1000,
        "{unwound} samples in loaded objects unwound"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
