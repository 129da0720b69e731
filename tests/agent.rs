//! The agent: configuration errors and misuse, the signal disposition it
//! restores, the probes, and sampling while methods are freed and re-jitted.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use jitmap::agent::{
    Agent, AgentConfig, AgentError, CallCounters, Clock, CounterError, ProbeEvent, Profile,
    SampleFrame, jitmap_probe_count, jitmap_probe_enter, jitmap_probe_value,
};
use jitmap::{CodeInfo, CodeRef, ExecutionManager, HeapConfig, JitKind};

/// One agent per process: the tests that start one take turns.
fn one_agent() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn manager() -> ExecutionManager {
    ExecutionManager::new(16)
}

#[test]
fn every_bad_config_is_its_own_error() {
    let ok = AgentConfig::default();
    let cases = [
        (AgentConfig { hz: 0, ..ok }, AgentError::ZeroFrequency),
        (
            AgentConfig { hz: 10_001, ..ok },
            AgentError::FrequencyTooHigh { hz: 10_001 },
        ),
        (AgentConfig { max_depth: 0, ..ok }, AgentError::ZeroDepth),
        (
            AgentConfig {
                profile_versions: 1,
                ..ok
            },
            AgentError::ProfileVersionsTooFew { versions: 1 },
        ),
        (
            AgentConfig {
                max_depth: 257,
                ..ok
            },
            AgentError::DepthTooLarge { depth: 257 },
        ),
        (
            AgentConfig {
                ring_capacity: 0,
                ..ok
            },
            AgentError::ZeroCapacity,
        ),
        (
            AgentConfig {
                probe_capacity: 0,
                ..ok
            },
            AgentError::ZeroCapacity,
        ),
        (
            AgentConfig {
                ring_capacity: (1 << 20) + 1,
                ..ok
            },
            AgentError::CapacityTooLarge {
                capacity: (1 << 20) + 1,
            },
        ),
        (
            AgentConfig { signal: 0, ..ok },
            AgentError::BadSignal { signal: 0 },
        ),
        (
            AgentConfig {
                signal: libc::SIGKILL,
                ..ok
            },
            AgentError::BadSignal {
                signal: libc::SIGKILL,
            },
        ),
        (
            AgentConfig {
                signal: libc::SIGSEGV,
                ..ok
            },
            AgentError::BadSignal {
                signal: libc::SIGSEGV,
            },
        ),
        (
            AgentConfig { signal: 65, ..ok },
            AgentError::BadSignal { signal: 65 },
        ),
        (
            AgentConfig {
                collect_every: Duration::ZERO,
                ..ok
            },
            AgentError::ZeroInterval,
        ),
    ];
    let _one = one_agent();
    let manager = manager();
    for (config, error) in cases {
        assert_eq!(Agent::start(&manager, config).unwrap_err(), error);
    }
    // The limits themselves are accepted, and the failed starts left nothing
    // behind: an agent starts now.
    let edge = AgentConfig {
        hz: 10_000,
        max_depth: 256,
        ring_capacity: 1,
        probe_capacity: 1,
        signal: libc::SIGRTMIN() + 3,
        ..ok
    };
    assert_eq!(edge.validate(), Ok(()));
    Agent::start(&manager, edge).unwrap().stop();
}

#[test]
fn one_agent_at_a_time_and_one_attachment_per_thread() {
    let _one = one_agent();
    let manager = manager();
    let agent = Agent::start(&manager, AgentConfig::default()).unwrap();
    assert_eq!(
        Agent::start(&manager, AgentConfig::default()).unwrap_err(),
        AgentError::AlreadyRunning
    );
    let attached = agent.attach_current_thread().unwrap();
    let tid = attached.tid();
    assert_eq!(
        agent.attach_current_thread().unwrap_err(),
        AgentError::AlreadyAttached { tid }
    );
    drop(attached);
    // Detached: the thread may attach again.
    let again = agent.attach_current_thread().unwrap();
    drop(again);
    agent.stop();
    // Stopped: the next agent may start.
    Agent::start(&manager, AgentConfig::default())
        .unwrap()
        .stop();
}

extern "C" fn host_handler(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}

/// The kernel's flag for glibc's signal-return trampoline, which glibc adds to
/// every disposition it installs.
const SA_RESTORER: libc::c_int = 0x0400_0000;

fn disposition(signal: i32) -> (libc::sighandler_t, libc::c_int) {
    // SAFETY: all-zero is a valid sigaction to be overwritten.
    let mut current: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a query (null new action) into valid storage.
    assert_eq!(
        unsafe { libc::sigaction(signal, std::ptr::null(), &mut current) },
        0
    );
    (current.sa_sigaction, current.sa_flags & !SA_RESTORER)
}

#[test]
fn stop_restores_the_previous_disposition() {
    let _one = one_agent();
    let manager = manager();
    let signal = libc::SIGRTMIN() + 5;
    // The host's own handler, with flags of its own.
    // SAFETY: all-zero is a valid sigaction; the handler does nothing.
    let mut host: libc::sigaction = unsafe { std::mem::zeroed() };
    host.sa_sigaction = host_handler as *const () as libc::sighandler_t;
    host.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
    // SAFETY: installs a valid, async-signal-safe (empty) handler.
    assert_eq!(
        unsafe { libc::sigaction(signal, &host, std::ptr::null_mut()) },
        0
    );
    let before = disposition(signal);
    assert_eq!(before, (host.sa_sigaction, host.sa_flags));
    let config = AgentConfig {
        signal,
        hz: 5000,
        clock: Clock::Wall,
        ..AgentConfig::default()
    };
    let agent = Agent::start(&manager, config).unwrap();
    assert_ne!(
        disposition(signal).0,
        before.0,
        "the agent's handler is installed"
    );
    let attached = agent.attach_current_thread().unwrap();
    let until = Instant::now() + Duration::from_millis(100);
    while Instant::now() < until {
        std::hint::spin_loop();
    }
    // Stopped while the thread is still attached and its timer was firing.
    let profile = agent.stop();
    assert_eq!(disposition(signal), before);
    assert!(profile.taken > 0);
    assert_eq!(profile.samples + profile.dropped, profile.taken);
    drop(attached);
    assert_eq!(disposition(signal), before);
    // SIG_DFL, the usual case, comes back as SIG_DFL.
    let dfl = libc::SIGRTMIN() + 6;
    let agent = Agent::start(
        &manager,
        AgentConfig {
            signal: dfl,
            ..AgentConfig::default()
        },
    )
    .unwrap();
    agent.stop();
    assert_eq!(disposition(dfl).0, libc::SIG_DFL);
}

#[test]
fn the_call_counter_crosses_exactly_once_under_contention() {
    let counters = CallCounters::new(3, 1000).unwrap();
    let cell = counters.cell(1).unwrap() as usize;
    let crossings = AtomicU32::new(0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..20_000 {
                    // SAFETY: the cell belongs to `counters`, alive for the scope.
                    let r = unsafe { jitmap_probe_count(cell as *const _) };
                    // Relaxed: a sum read after the threads are joined.
                    crossings.fetch_add(r, Ordering::Relaxed);
                }
            });
        }
    });
    // Relaxed: the scope joined every thread.
    assert_eq!(crossings.load(Ordering::Relaxed), 1);
    assert_eq!(counters.remaining(1), Some(0));
    assert_eq!(counters.remaining(0), Some(1000));
    assert_eq!(counters.take_crossed(), [1]);
    assert_eq!(counters.take_crossed(), Vec::<u32>::new());
    // Re-armed, it crosses once more.
    counters.rearm(1, 2).unwrap();
    // SAFETY: as above.
    let calls: Vec<u32> = (0..4)
        .map(|_| unsafe { jitmap_probe_count(cell as *const _) })
        .collect();
    assert_eq!(calls, [0, 1, 0, 0]);
    assert_eq!(counters.take_crossed(), [1]);
    // Misuse is typed.
    assert_eq!(
        CallCounters::new(0, 5).err(),
        Some(CounterError::BadCounters {
            methods: 0,
            threshold: 5
        })
    );
    assert_eq!(
        CallCounters::new(5, 0).err(),
        Some(CounterError::BadCounters {
            methods: 5,
            threshold: 0
        })
    );
    assert_eq!(
        counters.rearm(3, 1),
        Err(CounterError::NoSuchCounter { index: 3 })
    );
    assert_eq!(
        counters.rearm(0, 1),
        Err(CounterError::NotCrossed { index: 0 })
    );
    assert!(counters.cell(3).is_none());
    // SAFETY: a null cell is allowed and ignored.
    assert_eq!(unsafe { jitmap_probe_count(std::ptr::null()) }, 0);
}

#[test]
fn entry_and_value_probes_land_in_the_thread_ring_in_order() {
    let _one = one_agent();
    let manager = manager();
    let config = AgentConfig {
        hz: 1,
        probe_capacity: 8,
        keep_samples: true,
        // No pass on a timer; the doorbell's are held off below.
        collect_every: Duration::from_secs(60),
        ..AgentConfig::default()
    };
    let agent = Agent::start(&manager, config).unwrap();
    let attached = agent.attach_current_thread().unwrap();
    let context = attached.probe_context();
    // No pass drains the ring while this is held: the ring of 8 fills.
    let held = jitmap::agent::testing::hold_collector(&agent);
    // Called through plain function pointers, as JIT code calls them.
    let enter: unsafe extern "C" fn(*const _, u64) = jitmap_probe_enter;
    let value: unsafe extern "C" fn(*const _, u64, u64) = jitmap_probe_value;
    let start = jitmap::events::monotonic_ns();
    // SAFETY: this thread's own context, attached.
    unsafe {
        enter(context, 7);
        value(context, 7, 0xdead_beef);
        enter(context, 8);
        enter(std::ptr::null(), 9); // ignored
    }
    // 7 more fill the ring of 8; the last 2 are dropped.
    for i in 0..7 {
        // SAFETY: as above.
        unsafe { value(context, 100, i) };
    }
    let end = jitmap::events::monotonic_ns();
    drop(held);
    drop(attached);
    let profile = agent.stop();
    assert_eq!(profile.probes.enters, 2);
    assert_eq!(profile.probes.values, 6);
    assert_eq!(profile.probes.dropped, 2);
    let tid = jitmap::events::current_tid();
    let seen: Vec<(u32, u64, Option<u64>)> = profile
        .kept_probes
        .iter()
        .map(|p: &ProbeEvent| (p.tid, p.method_id, p.value))
        .collect();
    let mut expected = vec![(tid, 7, None), (tid, 7, Some(0xdead_beef)), (tid, 8, None)];
    expected.extend((0..5).map(|i| (tid, 100, Some(i))));
    assert_eq!(seen, expected);
    // Cycle counts converted to the monotonic clock, within a generous margin.
    for p in &profile.kept_probes {
        assert!(
            p.time_ns + 50_000_000 >= start && p.time_ns <= end + 50_000_000,
            "{} not in [{start}, {end}]",
            p.time_ns
        );
    }
}

/// A ring that passes half full rings the collector's doorbell: it is
/// drained long before the collector's minute-long wait ends, so a thread
/// sampled at 1 kHz into a ring of 64 loses (next to) nothing. Without the
/// doorbell, everything past the first 64 samples was dropped.
#[test]
fn a_ring_half_full_wakes_the_collector_before_its_interval() {
    // A second of this thread's CPU: about 1,000 samples, 32 to a doorbell
    // (a collector that takes up to 32 ms to answer one loses nothing).
    let profile = rung_by_its_ring(64, Duration::from_secs(1));
    println!(
        "taken {}, dropped {}, collector CPU {:?}",
        profile.taken, profile.dropped, profile.collector_cpu
    );
    assert!(profile.taken >= 500, "{}", profile.taken);
    assert_eq!(profile.samples + profile.dropped, profile.taken);
    assert!(
        profile.dropped * 10 <= profile.taken,
        "{} of {} dropped",
        profile.dropped,
        profile.taken
    );
    // The doorbell, not the minute-long timer, made the passes: one per
    // 32 samples (the ring's half), and one more as the agent stopped.
    assert!(
        profile.passes >= profile.taken / 64,
        "{} passes for {} samples",
        profile.passes,
        profile.taken
    );
}

/// The profile of this thread sampled at 1 kHz on the wall clock into a
/// sample ring of `ring_capacity` for `cpu` of its CPU time, with a
/// collector whose own wait (a minute) never ends first: every pass but
/// `stop`'s is the doorbell's.
fn rung_by_its_ring(ring_capacity: usize, cpu: Duration) -> Profile {
    let _one = one_agent();
    let manager = manager();
    let config = AgentConfig {
        hz: 1000,
        clock: Clock::Wall,
        ring_capacity,
        collect_every: Duration::from_secs(60),
        ..AgentConfig::default()
    };
    let agent = Agent::start(&manager, config).unwrap();
    let attached = agent.attach_current_thread().unwrap();
    let end = thread_cpu() + cpu;
    let mut spins = 0u64;
    while thread_cpu() < end {
        spins = std::hint::black_box(spins + 1);
    }
    drop(attached);
    agent.stop()
}

/// At a low rate a sample ring rings at three quarters full, not half: at
/// 1 kHz a ring of 256 rings at 192 samples (leaving 64 ms), so the
/// doorbell's passes are one per 192 samples or fewer (one per 128 with
/// the bell at half), and (next to) no sample is lost to a full ring.
#[test]
fn a_sample_ring_at_a_low_rate_rings_at_three_quarters_full() {
    // Two seconds of this thread's CPU: about 2,000 samples.
    let profile = rung_by_its_ring(256, Duration::from_secs(2));
    println!(
        "taken {}, dropped {}, passes {}",
        profile.taken, profile.dropped, profile.passes
    );
    assert!(profile.taken >= 1000, "{}", profile.taken);
    assert_eq!(profile.samples + profile.dropped, profile.taken);
    assert!(
        profile.dropped * 10 <= profile.taken,
        "{} of {} dropped",
        profile.dropped,
        profile.taken
    );
    // A pass drains at most the ring; the doorbell's passes come at 192
    // samples (or later, on a loaded machine), and `stop` adds its own.
    assert!(
        profile.passes * 256 >= profile.samples,
        "{} passes for {} samples",
        profile.passes,
        profile.samples
    );
    assert!(
        profile.passes <= profile.taken / 180 + 3,
        "{} passes for {} samples: a bell earlier than 192",
        profile.passes,
        profile.taken
    );
}

/// A ring of one record rings the doorbell at every record; the collector
/// still makes at most a pass a millisecond (`MIN_RUNG_INTERVAL`), not one
/// per record.
#[test]
fn a_ring_of_one_costs_at_most_a_pass_a_millisecond() {
    let _one = one_agent();
    let manager = manager();
    let config = AgentConfig {
        hz: 1,
        probe_capacity: 1,
        collect_every: Duration::from_secs(60),
        ..AgentConfig::default()
    };
    let agent = Agent::start(&manager, config).unwrap();
    let attached = agent.attach_current_thread().unwrap();
    let context = attached.probe_context();
    let enter: unsafe extern "C" fn(*const _, u64) = jitmap_probe_enter;
    let started = Instant::now();
    let mut calls = 0u64;
    while started.elapsed() < Duration::from_millis(300) {
        // SAFETY: this thread's own context, attached.
        unsafe { enter(context, calls) };
        calls += 1;
    }
    let elapsed = started.elapsed();
    drop(attached);
    let profile = agent.stop();
    println!(
        "{calls} probe calls, {} passes in {elapsed:?}",
        profile.passes
    );
    // At most one a millisecond of the loop, one before it, and stop's.
    assert!(
        profile.passes <= elapsed.as_millis() as u64 + 2,
        "{} passes in {elapsed:?}",
        profile.passes
    );
    assert_eq!(
        profile.probes.enters + profile.probes.dropped,
        calls,
        "every call kept or counted"
    );
}

/// A version the churn thread published: when, where, and when it was freed.
#[derive(Clone, Debug)]
struct Version {
    name: String,
    start: usize,
    size: u64,
    published_ns: u64,
    freed_ns: u64,
}

/// Machine code for a function that counts down and returns `id`.
fn function_code(id: u32) -> Vec<u8> {
    jitmap_testkit::spin::function_code(id)
}

#[test]
fn samples_name_the_right_version_while_methods_are_rejitted() {
    if !cfg!(target_arch = "x86_64") {
        println!("skipped: the functions are x86-64 code");
        return;
    }
    let _one = one_agent();
    let manager = manager();
    let heap = manager
        .create_heap(HeapConfig {
            span: 1 << 20,
            ..HeapConfig::default()
        })
        .unwrap();
    const SLOTS: usize = 4;
    let shadow: Mutex<HashMap<u64, Version>> = Mutex::new(HashMap::new());
    let publish = |slot: usize, generation: u32| -> (CodeRef, u64) {
        let id = (slot as u32) << 24 | generation;
        let code = function_code(id);
        let mut r = heap.reserve(code.len() as u64).unwrap();
        r.code_mut().copy_from_slice(&code);
        let name = format!("m{slot}_g{generation}");
        let published_ns = jitmap::events::monotonic_ns();
        let info = CodeInfo::new(u64::from(id), name.clone(), JitKind::Optimized);
        let code = r.publish(info).unwrap();
        shadow.lock().unwrap().insert(
            u64::from(id),
            Version {
                name,
                start: code.start(),
                size: code.size(),
                published_ns,
                freed_ns: u64::MAX,
            },
        );
        (code, u64::from(id))
    };
    let mut current: Vec<(CodeRef, u64)> = (0..SLOTS).map(|slot| publish(slot, 0)).collect();
    let cells: Vec<AtomicUsize> = current
        .iter()
        .map(|(code, _)| AtomicUsize::new(code.start()))
        .collect();
    let agent = Agent::start(
        &manager,
        AgentConfig {
            hz: 5000,
            clock: Clock::Wall,
            keep_samples: true,
            ..AgentConfig::default()
        },
    )
    .unwrap();
    let stop = AtomicBool::new(false);
    let rejitted = AtomicU64::new(0);
    let (calls, wrong, rejits) = std::thread::scope(|s| {
        let churn = s.spawn(|| {
            let mut rejits = 0u32;
            let mut generation = 1;
            // Relaxed: a stop flag; the scope's join orders everything else.
            while !stop.load(Ordering::Relaxed) {
                let slot = generation as usize % SLOTS;
                let new = publish(slot, generation);
                // Release: callers that load the new address see its code.
                cells[slot].store(new.0.start(), Ordering::Release);
                let (old, old_id) = std::mem::replace(&mut current[slot], new);
                heap.free(old).unwrap();
                shadow.lock().unwrap().get_mut(&old_id).unwrap().freed_ns =
                    jitmap::events::monotonic_ns();
                heap.try_reclaim();
                generation += 1;
                rejits += 1;
                // Relaxed: a progress counter the caller polls.
                rejitted.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_micros(200));
            }
            rejits
        });
        let executor = manager.register_executor().unwrap();
        let attached = agent.attach_current_thread().unwrap();
        let (mut calls, mut wrong) = (0u64, 0u64);
        // Two seconds, and on until the churn has re-JITted 100 versions and
        // this thread has made 1,000 calls (a loaded machine runs either
        // late), within a generous cap.
        let until = Instant::now() + Duration::from_secs(2);
        let cap = Instant::now() + Duration::from_secs(120);
        // Relaxed: as above.
        let enough = |calls: u64| calls > 1000 && rejitted.load(Ordering::Relaxed) > 100;
        while (Instant::now() < until || !enough(calls)) && Instant::now() < cap {
            for cell in &cells {
                // Acquire: the code behind the address is published.
                let start = cell.load(Ordering::Acquire);
                // SAFETY: a published function with the C ABI; this thread is an
                // online executor, so the bytes stay until its next quiescent point.
                let f: extern "C" fn() -> u32 = unsafe { std::mem::transmute(start) };
                let got = u64::from(f());
                // The function returns its own id: the version behind the cell ran.
                let right = shadow
                    .lock()
                    .unwrap()
                    .get(&got)
                    .is_some_and(|v| v.start == start);
                wrong += u64::from(!right);
                calls += 1;
                executor.quiescent();
            }
        }
        drop(attached);
        // Relaxed: see the churn loop.
        stop.store(true, Ordering::Relaxed);
        (calls, wrong, churn.join().unwrap())
    });
    let profile = agent.stop();
    let shadow = shadow.into_inner().unwrap();
    assert_eq!(wrong, 0);
    assert!(
        calls > 1000 && rejits > 100,
        "calls {calls} rejits {rejits}"
    );
    assert_eq!(profile.unattributed, 0);
    let mut checked = 0;
    let mut freed_later = 0;
    let mut ran_after_free = 0;
    for sample in &profile.kept_samples {
        let Some(&SampleFrame::Jit {
            addr,
            method,
            offset,
        }) = sample.frames.first()
        else {
            continue;
        };
        let m = &profile.methods[method];
        let v = shadow
            .get(&m.method_id)
            .unwrap_or_else(|| panic!("sampled method {} was never published", m.method_id));
        assert_eq!(m.name, v.name);
        assert_eq!(addr - v.start, offset as usize, "{m:?} {v:?}");
        assert!((offset as u64) < v.size);
        // The version whose bytes were at the address then: the latest one
        // covering it that was published before the sample ended. (A freed
        // version keeps running until the executor leaves it, and its bytes
        // are reused only after the executor's next quiescent point, which
        // comes after the handler returns.)
        let occupant = shadow
            .iter()
            .filter(|(_, o)| {
                addr >= o.start
                    && ((addr - o.start) as u64) < o.size
                    && o.published_ns <= sample.end_ns
            })
            .max_by_key(|(_, o)| o.published_ns)
            .map(|(id, _)| *id);
        assert_eq!(occupant, Some(m.method_id), "sample {sample:?} named {m:?}");
        ran_after_free += u32::from(sample.begin_ns > v.freed_ns);
        freed_later += u32::from(m.freed);
        checked += 1;
    }
    assert!(checked >= 1000, "only {checked} samples in JIT code");
    assert!(freed_later > 0, "no sampled version was freed later");
    println!("{checked} JIT samples checked; {ran_after_free} in code freed while it ran");
    // Versions of one slot share no name, so every label is its name.
    assert!(profile.methods.iter().all(|m| m.label == m.name));
}

/// A sample in native code is named by the function that ran, with the
/// helpers the compiler inlined at the pc above it, each marked inlined:
/// `inlined::spin` spends its time in an inlined `mix` and the loop's range
/// iteration. The helpers never stand alone as the frame
/// (`jitmap_testkit::inlined::check_profile`, which the eBPF profiler's test
/// applies too).
#[test]
fn a_native_frame_is_its_function_with_its_inlined_helpers() {
    let _one = one_agent();
    let manager = manager();
    let agent = Agent::start(
        &manager,
        AgentConfig {
            clock: Clock::Wall,
            ..AgentConfig::default()
        },
    )
    .unwrap();
    let attached = agent.attach_current_thread().unwrap();
    let until = Instant::now() + Duration::from_millis(500);
    while Instant::now() < until {
        std::hint::black_box(jitmap_testkit::inlined::spin(std::hint::black_box(200_000)));
    }
    drop(attached);
    let profile = agent.stop();
    let chains = jitmap_testkit::inlined::check_profile(
        profile
            .stacks
            .iter()
            .map(|s| (s.frames.iter().map(String::as_str).collect(), s.count)),
        profile.counted(),
    );
    println!("{chains:#?}");
}

/// This thread's CPU time.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is writable.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The profile says how much CPU time its threads had while attached, which
/// is what CPU-clock timers sample: bracketed by this thread's own readings.
#[test]
fn the_profile_reports_the_cpu_time_of_its_threads() {
    let _one = one_agent();
    let manager = manager();
    let agent = Agent::start(
        &manager,
        AgentConfig {
            hz: 100,
            ..AgentConfig::default()
        },
    )
    .unwrap();
    let before_attach = thread_cpu();
    let attached = agent.attach_current_thread().unwrap();
    let attached_at = thread_cpu();
    let mut x = 0u64;
    while thread_cpu() - attached_at < Duration::from_millis(200) {
        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
    }
    let worked_until = thread_cpu();
    drop(attached);
    let after_detach = thread_cpu();
    let p = agent.stop();
    assert!(
        p.cpu >= worked_until - attached_at && p.cpu <= after_detach - before_attach,
        "{:?} not within [{:?}, {:?}]",
        p.cpu,
        worked_until - attached_at,
        after_detach - before_attach
    );
    let report = p.report(3);
    let line = report.lines().find(|l| l.starts_with("cpu: ")).unwrap();
    assert!(
        line.contains(&format!(
            "{:.2} s used by the attached threads",
            p.cpu.as_secs_f64()
        )),
        "{line}"
    );
}

/// A window's profile says what the agent cost while it was open: its
/// samples' handler time and the passes' CPU, within the whole profile's,
/// so that an agent's cost in steady state can be read without its start
/// and its stop. (Before, both were zero in a window's profile.)
#[test]
fn a_window_reports_what_the_agent_cost_while_it_was_open() {
    let _one = one_agent();
    let manager = manager();
    let agent = Agent::start(
        &manager,
        AgentConfig {
            hz: 1000,
            clock: Clock::Wall,
            collect_every: Duration::from_millis(10),
            ..AgentConfig::default()
        },
    )
    .unwrap();
    let attached = agent.attach_current_thread().unwrap();
    let window = std::thread::scope(|s| {
        let window = s.spawn(|| agent.profile_window(Duration::from_millis(300)));
        let mut x = 0u64;
        while !window.is_finished() {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
        }
        window.join().unwrap().unwrap()
    });
    drop(attached);
    let whole = agent.stop();
    println!(
        "window: {} samples, handlers {:?}, passes {:?}; whole: {} samples, handlers {:?}, passes {:?}",
        window.samples,
        window.handler_time,
        window.collector_cpu,
        whole.samples,
        whole.handler_time,
        whole.collector_cpu
    );
    assert!(window.samples > 0 && window.samples <= whole.samples);
    assert!(window.handler_time > Duration::ZERO && window.handler_time <= whole.handler_time);
    // One thread's handlers fit in the window's time.
    assert!(window.handler_time <= window.duration);
    // The collector thread's passes while it was open (about 30, one each
    // 10 ms); the window's own closing pass is not counted, so only the
    // collector thread's published CPU can make this non-zero.
    assert!(window.collector_cpu > Duration::ZERO && window.collector_cpu <= whole.collector_cpu);
}
