//! Timer expirations are weighted, not lost: a signal the kernel coalesced
//! while it was pending (a thread waiting for a CPU under the wall clock, a
//! CPU timer faster than the scheduler's tick) counts 1 + its overrun. The
//! pprof's nanoseconds then add up to the time the threads were sampled
//! for: their wall time under the wall clock, their CPU time under the CPU
//! clock. Each figure is measured in the run (the threads' own lifetimes
//! and `getrusage`), never assumed from a time window.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use jitmap::ExecutionManager;
use jitmap::agent::{Agent, AgentConfig, Clock, Profile};
use jitmap_testkit::e2e::one_run;

/// This thread's CPU time so far (`getrusage(RUSAGE_THREAD)`), in ns.
fn thread_cpu_ns() -> u64 {
    // SAFETY: an all-zero rusage is valid; getrusage fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-pointer.
    assert_eq!(
        unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) },
        0
    );
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    ns(usage.ru_utime) + ns(usage.ru_stime)
}

/// What a run measured: the pprof's time in ns, the time the threads were
/// attached (wall or CPU, by the clock), and the profile.
struct Measured {
    pprof_ns: u64,
    attached_ns: u64,
    profile: Profile,
}

/// `threads` threads attached to an agent on `clock` at `hz`, each spinning
/// for `seconds` of wall time.
fn run(threads: usize, clock: Clock, hz: u32, seconds: f64) -> Measured {
    let manager = ExecutionManager::new(threads + 8);
    let agent = Arc::new(
        Agent::start(
            &manager,
            AgentConfig {
                hz,
                clock,
                ..AgentConfig::default()
            },
        )
        .unwrap(),
    );
    let start = Arc::new(Barrier::new(threads));
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (agent, start, stop) = (Arc::clone(&agent), Arc::clone(&start), Arc::clone(&stop));
            std::thread::spawn(move || {
                let attached = agent.attach_current_thread().unwrap();
                start.wait();
                let (wall, cpu) = (Instant::now(), thread_cpu_ns());
                let mut x = 1u64;
                // Relaxed: a stop flag; no data rides on it.
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..1000 {
                        x = std::hint::black_box(
                            x.wrapping_mul(6364136223846793005).wrapping_add(1),
                        );
                    }
                }
                let spent = match clock {
                    Clock::Wall => wall.elapsed().as_nanos() as u64,
                    Clock::Cpu => thread_cpu_ns() - cpu,
                };
                drop(attached);
                spent
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    // Relaxed: as above.
    stop.store(true, Ordering::Relaxed);
    let attached_ns: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    let profile = Arc::into_inner(agent).unwrap().stop();
    let period_ns = 1_000_000_000 / u64::from(hz);
    let pprof = profile.to_pprof(period_ns);
    let pprof_ns = pprof.sample.iter().map(|s| s.value[1] as u64).sum();
    Measured {
        pprof_ns,
        attached_ns,
        profile,
    }
}

/// The pprof's time is within 15 % of the time measured.
fn check(what: &str, m: &Measured, period_ns: u64) {
    let ratio = m.pprof_ns as f64 / m.attached_ns as f64;
    let unweighted = (m.profile.samples * period_ns) as f64 / m.attached_ns as f64;
    println!(
        "{what}: pprof {:.2} s of {:.2} s measured ({ratio:.3}); {} samples stand for {} periods, {} coalesced; one per signal would give {unweighted:.3}; dropped {}",
        m.pprof_ns as f64 / 1e9,
        m.attached_ns as f64 / 1e9,
        m.profile.samples,
        m.profile.periods,
        m.profile.coalesced(),
        m.profile.dropped,
    );
    assert!((0.85..=1.15).contains(&ratio), "{what}: {ratio:.3}");
    // The walks' ends count periods as the stacks do: they add up alike.
    assert_eq!(
        m.profile.stack_ends.total(),
        m.profile.periods,
        "{what}: {:?}",
        m.profile.stack_ends
    );
}

#[test]
fn wall_time_of_64_threads_on_two_cores_is_counted_whole() {
    if !cfg!(target_arch = "x86_64") {
        println!("skipped on aarch64: qemu-user keeps 32 POSIX timers, one per attached thread");
        return;
    }
    let _one = one_run();
    let m = run(64, Clock::Wall, 1000, 3.0);
    check("64 threads, wall clock, 1 kHz", &m, 1_000_000);
    // Sixty-four spinning threads on this machine's cores wait for a CPU
    // most of the time: most periods came from coalesced signals.
    assert!(
        m.profile.coalesced() > m.profile.samples,
        "{}",
        m.profile.report(3)
    );
}

#[test]
fn wall_time_of_8_threads_on_two_cores_is_counted_whole() {
    let _one = one_run();
    let m = run(8, Clock::Wall, 1000, 3.0);
    check("8 threads, wall clock, 1 kHz", &m, 1_000_000);
}

#[test]
fn wall_time_of_two_threads_is_not_over_weighted() {
    let _one = one_run();
    let m = run(2, Clock::Wall, 1000, 3.0);
    check("2 threads, wall clock, 1 kHz", &m, 1_000_000);
}

#[test]
fn cpu_time_at_10_khz_is_counted_past_the_scheduler_tick() {
    let _one = one_run();
    let m = run(2, Clock::Cpu, 10_000, 2.0);
    check("2 threads, CPU clock, 10 kHz", &m, 100_000);
}
