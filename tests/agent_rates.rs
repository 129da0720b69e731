//! The agent at rates its handler cannot keep up with: it never starves the
//! process. A handler made slow on purpose (`agent::testing::slow_handler`,
//! twice the period) stands for a debug build's or a loaded machine's; each
//! test waits for the calls it makes with a cap, and fails instead of
//! hanging when a call does not come back.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Barrier, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use jitmap::ExecutionManager;
use jitmap::agent::{Agent, AgentConfig, AgentError, Clock, MAX_HZ, MIN_PERIOD, testing};

/// One agent per process, and one handler delay: the tests take turns.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The handler delay for one test, undone when it ends (passed or failed).
struct SlowHandler;

impl SlowHandler {
    fn new(delay: Duration) -> Self {
        testing::slow_handler(delay);
        Self
    }
}

impl Drop for SlowHandler {
    fn drop(&mut self) {
        testing::slow_handler(Duration::ZERO);
    }
}

/// The fastest configuration the agent accepts, on the wall clock.
fn fastest() -> AgentConfig {
    AgentConfig {
        clock: Clock::Wall,
        hz: MAX_HZ,
        ..AgentConfig::default()
    }
}

/// A cap, not a timing: `x86_64` seconds natively; under qemu-user, where
/// every signal costs tens of times more, more.
fn cap(x86_64: u64) -> Duration {
    Duration::from_secs(if cfg!(target_arch = "x86_64") {
        x86_64
    } else {
        x86_64 * 10
    })
}

/// Runs `f` on a thread of its own and returns its result, or panics if it
/// has not returned within `cap` (the thread is left behind).
fn within<R: Send + 'static>(
    cap: Duration,
    what: &str,
    f: impl FnOnce() -> R + Send + 'static,
) -> R {
    let (done, result) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(f());
    });
    result
        .recv_timeout(cap)
        .unwrap_or_else(|_| panic!("{what} did not return within {cap:?}"))
}

/// Burns CPU until `stop` is set.
fn spin_until(stop: &AtomicBool) {
    let mut x = 0u64;
    while !stop.load(Ordering::Relaxed) {
        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
    }
}

#[test]
fn a_period_under_100_microseconds_is_refused_with_its_reason() {
    assert_eq!(MIN_PERIOD, Duration::from_micros(100));
    assert_eq!(u64::from(MAX_HZ), 1_000_000 / 100);
    for clock in [Clock::Wall, Clock::Cpu] {
        let config = AgentConfig {
            clock,
            hz: 100_000,
            ..AgentConfig::default()
        };
        let error = config.validate().unwrap_err();
        assert_eq!(error, AgentError::FrequencyTooHigh { hz: 100_000 });
        assert_eq!(
            error.to_string(),
            "100000 Hz is over the agent's limit of 10000 Hz: a timer period under 100 µs \
             keeps a thread in its signal handler"
        );
        let config = AgentConfig {
            hz: MAX_HZ + 1,
            ..config
        };
        assert_eq!(
            config.validate(),
            Err(AgentError::FrequencyTooHigh { hz: MAX_HZ + 1 })
        );
        assert_eq!(
            AgentConfig {
                hz: MAX_HZ,
                ..config
            }
            .validate(),
            Ok(())
        );
    }
}

/// A thread attaches while another takes a window. Before, attach armed
/// its timer holding the agent's thread list: the new thread's handler
/// outlasting the period kept it in its handler with the lock held, and the
/// window's collection waited on it for good.
#[test]
fn attach_and_a_window_both_return_when_the_handler_outlasts_the_period() {
    let _one = one_at_a_time();
    let _slow = SlowHandler::new(2 * MIN_PERIOD);
    let manager = ExecutionManager::new(4);
    let agent = Arc::new(Agent::start(&manager, fastest()).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let attached_ok = {
        let (tx, rx) = mpsc::channel();
        let (attaching, about_to) = mpsc::channel();
        let worker = {
            let (agent, stop) = (Arc::clone(&agent), Arc::clone(&stop));
            std::thread::spawn(move || {
                let _ = attaching.send(());
                let attached = agent.attach_current_thread();
                let _ = tx.send(attached.is_ok());
                spin_until(&stop);
                drop(attached);
            })
        };
        // The window begins once the attach does (and, on the old code,
        // its collection then waited on the list the attach held).
        about_to.recv().unwrap();
        let window = {
            let agent = Arc::clone(&agent);
            within(cap(5), "profile_window", move || {
                agent.profile_window(Duration::ZERO).map(|p| p.duration)
            })
        };
        assert!(window.is_ok(), "{window:?}");
        let attached = rx
            .recv_timeout(cap(5))
            .expect("attach_current_thread did not return within 5 s");
        stop.store(true, Ordering::Relaxed);
        worker.join().unwrap();
        attached
    };
    assert!(attached_ok);
    let agent = Arc::into_inner(agent).unwrap();
    let profile = within(cap(5), "stop", move || agent.stop());
    assert_eq!(profile.period, MIN_PERIOD);
}

/// Four threads stay in their slow handlers most of the time; a fifth
/// attaches and detaches. Before, detaching waited until no handler of any
/// thread was running, which under four such threads could take seconds.
#[test]
fn a_detach_waits_only_for_its_own_handlers() {
    let _one = one_at_a_time();
    let _slow = SlowHandler::new(2 * MIN_PERIOD);
    let manager = ExecutionManager::new(8);
    let agent = Arc::new(Agent::start(&manager, fastest()).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let ready = Arc::new(Barrier::new(5));
    let busy: Vec<_> = (0..4)
        .map(|_| {
            let (agent, stop, ready) = (Arc::clone(&agent), Arc::clone(&stop), Arc::clone(&ready));
            std::thread::spawn(move || {
                let attached = agent.attach_current_thread().unwrap();
                ready.wait();
                spin_until(&stop);
                drop(attached);
            })
        })
        .collect();
    ready.wait();
    let fifth = {
        let agent = Arc::clone(&agent);
        within(cap(5), "the fifth thread", move || {
            let attached = agent.attach_current_thread().unwrap();
            // Its own timer's samples, so that its handlers ran too.
            while attached.samples_taken() < 3 {
                std::hint::black_box((0..1000u64).sum::<u64>());
            }
            let began = Instant::now();
            drop(attached);
            began.elapsed()
        })
    };
    stop.store(true, Ordering::Relaxed);
    for thread in busy {
        thread.join().unwrap();
    }
    // A cap, not a timing: the old detach waited for seconds.
    assert!(fifth < cap(1), "the fifth thread's detach took {fifth:?}");
    let agent = Arc::into_inner(agent).unwrap();
    let profile = within(cap(5), "stop", move || agent.stop());
    assert_eq!(profile.threads, 5);
}

/// `stop` called on a thread that is still attached, its handler slower
/// than its period. Before, `stop` deleted the timers holding the thread
/// list without blocking the signal, and the caller re-entered its handler
/// after each deletion until its own timer was gone.
#[test]
fn stop_on_an_attached_thread_returns_and_reports_the_back_off() {
    let _one = one_at_a_time();
    let _slow = SlowHandler::new(2 * MIN_PERIOD);
    let profile = within(cap(5), "stop on an attached thread", || {
        let manager = ExecutionManager::new(4);
        let agent = Agent::start(&manager, fastest()).unwrap();
        let attached = agent.attach_current_thread().unwrap();
        while attached.samples_taken() < 20 {
            std::hint::black_box((0..1000u64).sum::<u64>());
        }
        let profile = agent.stop();
        drop(attached);
        profile
    });
    // The handler took twice the period: the thread backed off until a
    // walk took at most a quarter of it, 8 periods, or further.
    assert!(profile.backed_off == 1, "{profile:?}");
    assert!(
        profile.slowest_period >= 8 * MIN_PERIOD,
        "{:?}",
        profile.slowest_period
    );
    let rate = profile.rate_line().unwrap();
    assert!(
        rate.starts_with("rate: 10000 Hz asked; 1 of 1 thread(s) backed off, the slowest to "),
        "{rate}"
    );
    // Each sample weighs the configured periods it stands for.
    assert!(
        profile.counted() >= 8 * profile.samples.saturating_sub(4),
        "{profile:?}"
    );
}

/// The wall time a profile's rate is measured over is each thread's own
/// attached time, not the agent's run: between what the test measured just
/// inside and just outside its attach and detach. (Before, the rate line
/// divided by the run's length for every thread: a thread attached for a
/// fraction of it read as signals that came slower than asked.)
#[test]
fn a_threads_attached_time_is_its_own() {
    let _one = one_at_a_time();
    let manager = ExecutionManager::new(4);
    let config = AgentConfig {
        clock: Clock::Wall,
        hz: 1000,
        ..AgentConfig::default()
    };
    let agent = Agent::start(&manager, config).unwrap();
    let outer = Instant::now();
    let attached = agent.attach_current_thread().unwrap();
    let inner = Instant::now();
    while attached.samples_taken() < 20 {
        std::hint::black_box((0..1000u64).sum::<u64>());
    }
    let inner = inner.elapsed();
    drop(attached);
    let outer = outer.elapsed();
    let profile = agent.stop();
    assert!(
        inner <= profile.attached && profile.attached <= outer,
        "{inner:?} <= {:?} <= {outer:?}",
        profile.attached
    );
}

/// A handler that takes twice the configured period, on the wall clock: the
/// samples' periods, kept and dropped, add up to the thread's attached time
/// less what its handlers took, not to the whole of it. (On the old code
/// each sample also stood for the expirations that came while the previous
/// handler ran: about the whole second.)
#[test]
fn a_slow_handlers_own_time_is_not_billed_to_the_thread() {
    let _one = one_at_a_time();
    let delay = 2 * MIN_PERIOD;
    let _slow = SlowHandler::new(delay);
    let profile = within(cap(5), "a second of slow handlers", move || {
        let manager = ExecutionManager::new(4);
        let agent = Agent::start(&manager, fastest()).unwrap();
        let attached = agent.attach_current_thread().unwrap();
        let began = Instant::now();
        while began.elapsed() < Duration::from_secs(1) {
            std::hint::black_box((0..1000u64).sum::<u64>());
        }
        drop(attached);
        agent.stop()
    });
    let sampled = (profile.counted() + profile.dropped_periods) as u128 * MIN_PERIOD.as_nanos();
    // Every handler after the first took the delay at least.
    let handlers = profile.taken.saturating_sub(1) as u128 * delay.as_nanos();
    let own = profile.attached.as_nanos().saturating_sub(handlers);
    assert!(
        sampled <= own + profile.attached.as_nanos() / 20,
        "{sampled} ns sampled, {own} ns of the thread's own: {profile:?}"
    );
    // Nor less than most of it: each sample still counts the thread's own
    // periods (a handler slower than the delay, as under qemu or on a busy
    // machine, takes more of them).
    assert!(
        sampled * 10 >= own * 7,
        "{sampled} ns sampled, {own} ns of the thread's own: {profile:?}"
    );
}
