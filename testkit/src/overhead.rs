//! The agent's cost, measured so that 1 % can be seen: the process's CPU
//! time (`CLOCK_PROCESS_CPUTIME_ID`, so the collector's thread is charged
//! too) over a fixed count of demo calls, not throughput in a time window.
//! Each round runs the same calls under four configurations in a shuffled
//! order: no agent, an empty handler on a timer at the same rate and clock
//! (the floor: what delivering signals costs this machine, which on a VM
//! includes the hypervisor's timer interrupts), and the agent walking frame
//! pointers or with its mixed unwinder. A configuration's figure is the
//! median over rounds of its cost over no agent's in the same round, with a
//! 95 % bootstrap interval; the agent's own cost is the mixed walk's ratio
//! minus the empty handler's, per round, so that the floor is not charged
//! to the agent. Each measurement starts after an untimed warm-up of a
//! quarter of its calls, so that an agent is measured in its steady state.

use std::time::{Duration, Instant};

use jitmap::ExecutionManager;
use jitmap::agent::{Agent, AgentConfig, Clock, Unwind};

use crate::demo::Demo;
use crate::rng::Rng;
use jitmap_demo::output::BASE_ITERATIONS;

/// A median and its 95 % bootstrap interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Interval {
    /// The median of the values.
    pub median: f64,
    /// The interval's lower end (2.5th percentile of resampled medians).
    pub low: f64,
    /// Its upper end (97.5th percentile).
    pub high: f64,
}

impl Interval {
    /// The median of `values` and the 2.5th and 97.5th percentiles of the
    /// medians of 2,000 resamples (with replacement, seeded).
    ///
    /// ```
    /// use jitmap_testkit::overhead::Interval;
    /// let i = Interval::bootstrap(&[1.0, 1.0, 1.0, 1.0]);
    /// assert_eq!((i.median, i.low, i.high), (1.0, 1.0, 1.0));
    /// ```
    pub fn bootstrap(values: &[f64]) -> Interval {
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            let n = v.len();
            if n % 2 == 1 {
                v[n / 2]
            } else {
                (v[n / 2 - 1] + v[n / 2]) / 2.0
            }
        };
        if values.is_empty() {
            return Interval {
                median: f64::NAN,
                low: f64::NAN,
                high: f64::NAN,
            };
        }
        let mut rng = Rng::new(0xb007);
        let mut medians: Vec<f64> = (0..2000)
            .map(|_| {
                let mut sample: Vec<f64> = (0..values.len())
                    .map(|_| values[rng.below(values.len() as u64) as usize])
                    .collect();
                median(&mut sample)
            })
            .collect();
        medians.sort_by(f64::total_cmp);
        Interval {
            median: median(&mut values.to_vec()),
            low: medians[medians.len() * 25 / 1000],
            high: medians[medians.len() * 975 / 1000 - 1],
        }
    }
}

/// What runs beside the calls in one measurement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Config {
    Bare,
    EmptyHandler,
    FramePointers,
    Mixed,
}

/// The cost at one rate on one clock: each configuration's CPU time over
/// no agent's.
#[derive(Clone, Debug, PartialEq)]
pub struct Cost {
    /// The timers' clock.
    pub clock: Clock,
    /// The sampling rate.
    pub hz: u32,
    /// Rounds measured.
    pub rounds: usize,
    /// An empty handler on a timer at the same rate and clock.
    pub empty: Interval,
    /// The agent, walking frame pointers.
    pub frame_pointers: Interval,
    /// The agent with its default, mixed unwinder.
    pub mixed: Interval,
    /// The mixed agent's ratio minus the empty handler's, per round: the
    /// agent's own cost beyond delivering signals.
    pub beyond_empty: Interval,
    /// The mixed agent's process CPU time beyond the empty handler's, per
    /// sample it took, in µs: a difference of two measurements, so as noisy
    /// as the machine.
    pub per_sample_us: Interval,
    /// The mixed agent's own CPU a sample, in µs, as it measured it: its
    /// handlers' time and its collector thread's CPU clock
    /// ([`jitmap::agent::Profile::agent_cpu_line`]), over the whole run:
    /// its first pass and `stop`'s included (not `stop`'s naming,
    /// [`jitmap::agent::Profile::naming_cpu`]), which a short run divides
    /// among few samples.
    pub agent_cpu_us: Interval,
    /// The same in steady state, as the agent counts it: over a window
    /// ([`jitmap::agent::Agent::profile_window`]) of a second of more
    /// calls after the timed ones, its samples' handler time and the
    /// collector's passes while it was open. Not in it: the kernel's
    /// delivery of the signals, the handler's steps before and after its
    /// walk, the event thread; `per_sample_us` counts those, noisily.
    pub steady_cpu_us: Interval,
}

/// The process's CPU time, in ns.
fn process_cpu_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// The process CPU time `calls` demo calls take, their bases drawn from
/// `seed` (the same work in every configuration of a round).
fn cpu_of(demo: &Demo, calls: u64, seed: u64) -> u64 {
    let mut rng = Rng::new(seed);
    let before = process_cpu_ns();
    for _ in 0..calls {
        let base = BASE_ITERATIONS / 2 + rng.below(u64::from(BASE_ITERATIONS)) as u32;
        std::hint::black_box(demo.run(1, base));
    }
    process_cpu_ns() - before
}

extern "C" fn empty_handler(_: libc::c_int) {}

/// Runs `f` with a timer on this thread (`clock`, `hz`) sending SIGPROF to
/// a handler that does nothing; the previous disposition is restored after.
fn with_empty_timer<R>(clock: Clock, hz: u32, f: impl FnOnce() -> R) -> std::io::Result<R> {
    let clock_id = match clock {
        Clock::Cpu => libc::CLOCK_THREAD_CPUTIME_ID,
        Clock::Wall => libc::CLOCK_MONOTONIC,
    };
    // SAFETY: zeroed sigaction/sigevent are valid; the fields used are set; the
    // handler is empty, so async-signal-safe; the timer is deleted before the
    // previous disposition returns, and a pending signal is flushed by SIG_IGN.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = empty_handler as *const () as libc::sighandler_t;
        action.sa_flags = libc::SA_RESTART;
        let mut previous: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGPROF, &action, &mut previous) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut event: libc::sigevent = std::mem::zeroed();
        event.sigev_notify = libc::SIGEV_THREAD_ID;
        event.sigev_signo = libc::SIGPROF;
        event.sigev_notify_thread_id = libc::gettid();
        let mut timer: libc::timer_t = std::ptr::null_mut();
        if libc::timer_create(clock_id, &mut event, &mut timer) != 0 {
            let e = std::io::Error::last_os_error();
            libc::sigaction(libc::SIGPROF, &previous, std::ptr::null_mut());
            return Err(e);
        }
        let period = libc::timespec {
            tv_sec: 0,
            tv_nsec: (1_000_000_000 / hz.max(1)) as libc::c_long,
        };
        let spec = libc::itimerspec {
            it_interval: period,
            it_value: period,
        };
        libc::timer_settime(timer, 0, &spec, std::ptr::null_mut());
        let result = f();
        libc::timer_delete(timer);
        let mut ignore: libc::sigaction = std::mem::zeroed();
        ignore.sa_sigaction = libc::SIG_IGN;
        libc::sigaction(libc::SIGPROF, &ignore, std::ptr::null_mut());
        libc::sigaction(libc::SIGPROF, &previous, std::ptr::null_mut());
        Ok(result)
    }
}

/// One measurement under `config`.
struct Measured {
    /// The CPU time of the timed calls.
    cpu_ns: u64,
    /// The samples the agent took in that time (0 without an agent).
    samples: u64,
    /// The agent's own CPU a sample over its whole run, in µs.
    agent_cpu_us: f64,
    /// The same over a window in the timed calls' first half.
    steady_cpu_us: f64,
}

/// How long the mixed agent's steady state is measured for, after each of
/// its timed runs: four of the collector's default 250 ms periods, more
/// at rates whose rings ring sooner.
const STEADY_WINDOW: Duration = Duration::from_secs(1);

/// One measurement: `calls` calls under `config` with timers `(clock, hz)`.
fn measure_one(
    manager: &ExecutionManager,
    demo: &Demo,
    config: Config,
    (clock, hz): (Clock, u32),
    calls: u64,
    seed: u64,
) -> Result<Measured, Box<dyn std::error::Error>> {
    // Every configuration first makes a quarter of the calls untimed: the
    // agent's steady state, in which its collector has already named this
    // process's native frames once (addr2line inflates and parses the debug
    // info the first time, a cost an agent pays once, not per sample).
    let warm_up = calls / 4;
    let unwind = match config {
        Config::Bare => {
            cpu_of(demo, warm_up, seed ^ 1);
            return Ok(Measured {
                cpu_ns: cpu_of(demo, calls, seed),
                samples: 0,
                agent_cpu_us: 0.0,
                steady_cpu_us: 0.0,
            });
        }
        Config::EmptyHandler => {
            let cpu = with_empty_timer(clock, hz, || {
                cpu_of(demo, warm_up, seed ^ 1);
                cpu_of(demo, calls, seed)
            })?;
            return Ok(Measured {
                cpu_ns: cpu,
                samples: 0,
                agent_cpu_us: 0.0,
                steady_cpu_us: 0.0,
            });
        }
        Config::FramePointers => Unwind::FramePointer,
        Config::Mixed => Unwind::Mixed,
    };
    let agent = Agent::start(
        manager,
        AgentConfig {
            hz,
            clock,
            unwind,
            ..AgentConfig::default()
        },
    )?;
    let attached = agent.attach_current_thread()?;
    cpu_of(demo, warm_up, seed ^ 1);
    // A collection now: the warm-up's samples drained and named.
    agent.profile_window(Duration::ZERO)?;
    let before = attached.samples_taken();
    let cpu = cpu_of(demo, calls, seed);
    let samples = attached.samples_taken() - before;
    let per_sample = |p: &jitmap::agent::Profile| {
        (p.handler_time + p.collector_cpu).as_secs_f64() * 1e6 / p.samples.max(1) as f64
    };
    // The steady state, after the timed calls and outside them: a window
    // (on a thread of its own, not attached) over [`STEADY_WINDOW`] of
    // more calls, so that it holds about ten of the collector's passes
    // whatever its phase.
    let steady_cpu_us = if config == Config::Mixed {
        let window = std::thread::scope(|s| {
            let window = s.spawn(|| agent.profile_window(STEADY_WINDOW));
            let mut round = 0;
            while !window.is_finished() {
                cpu_of(demo, calls / 16 + 1, seed ^ (2 + round));
                round += 1;
            }
            window.join()
        });
        per_sample(&window.map_err(|_| "the window's thread panicked")??)
    } else {
        0.0
    };
    drop(attached);
    let profile = agent.stop();
    Ok(Measured {
        cpu_ns: cpu,
        samples,
        agent_cpu_us: per_sample(&profile),
        steady_cpu_us,
    })
}

/// Measures the agent's cost on the iced demo (x86-64) at each rate of
/// `rates` on each clock of `clocks`: `rounds` rounds of the four
/// configurations in a shuffled order, each over the calls no agent makes
/// in about `per_measurement`.
pub fn measure(
    manager: &ExecutionManager,
    clocks: &[Clock],
    rates: &[u32],
    per_measurement: Duration,
    rounds: usize,
) -> Result<Vec<Cost>, Box<dyn std::error::Error>> {
    let demo = Demo::publish(manager)?;
    // The calls no agent makes in about `per_measurement`: the fixed work.
    let mut calls = 0u64;
    let began = Instant::now();
    let mut rng = Rng::new(1);
    while began.elapsed() < per_measurement {
        let base = BASE_ITERATIONS / 2 + rng.below(u64::from(BASE_ITERATIONS)) as u32;
        std::hint::black_box(demo.run(1, base));
        calls += 1;
    }
    let mut order_rng = Rng::new(0x0de5 + rounds as u64);
    let mut out = Vec::new();
    for &clock in clocks {
        for &hz in rates {
            let mut ratios: [Vec<f64>; 3] = Default::default();
            let mut beyond = Vec::with_capacity(rounds);
            let mut per_sample = Vec::with_capacity(rounds);
            let mut agent_cpu = Vec::with_capacity(rounds);
            let mut steady_cpu = Vec::with_capacity(rounds);
            for round in 0..rounds {
                let mut order = [
                    Config::Bare,
                    Config::EmptyHandler,
                    Config::FramePointers,
                    Config::Mixed,
                ];
                // Fisher-Yates, seeded: no configuration always runs first
                // (warm) or last.
                for i in (1..order.len()).rev() {
                    order.swap(i, order_rng.below(i as u64 + 1) as usize);
                }
                let seed = 0x5eed + round as u64;
                let mut cpu = [0u64; 4];
                let mut samples = [0u64; 4];
                for config in order {
                    let m = measure_one(manager, &demo, config, (clock, hz), calls, seed)?;
                    (cpu[config as usize], samples[config as usize]) = (m.cpu_ns, m.samples);
                    if config == Config::Mixed {
                        agent_cpu.push(m.agent_cpu_us);
                        steady_cpu.push(m.steady_cpu_us);
                    }
                }
                let ratio = |c: Config| cpu[c as usize] as f64 / cpu[Config::Bare as usize] as f64;
                ratios[0].push(ratio(Config::EmptyHandler));
                ratios[1].push(ratio(Config::FramePointers));
                ratios[2].push(ratio(Config::Mixed));
                beyond.push(ratio(Config::Mixed) - ratio(Config::EmptyHandler));
                let extra_ns =
                    cpu[Config::Mixed as usize] as f64 - cpu[Config::EmptyHandler as usize] as f64;
                per_sample.push(extra_ns / 1e3 / samples[Config::Mixed as usize].max(1) as f64);
            }
            out.push(Cost {
                clock,
                hz,
                rounds,
                empty: Interval::bootstrap(&ratios[0]),
                frame_pointers: Interval::bootstrap(&ratios[1]),
                mixed: Interval::bootstrap(&ratios[2]),
                beyond_empty: Interval::bootstrap(&beyond),
                per_sample_us: Interval::bootstrap(&per_sample),
                agent_cpu_us: Interval::bootstrap(&agent_cpu),
                steady_cpu_us: Interval::bootstrap(&steady_cpu),
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The interval holds the median and narrows with agreement; an odd
    /// count's median is its middle value, an even count's the mean of its
    /// middle two.
    #[test]
    fn the_bootstrap_interval_brackets_the_median() {
        let spread: Vec<f64> = (0..21).map(|i| 1.0 + f64::from(i) / 100.0).collect();
        let i = Interval::bootstrap(&spread);
        assert_eq!(i.median, 1.10);
        assert!(i.low < 1.10 && i.high > 1.10, "{i:?}");
        assert!(i.low >= 1.0 && i.high <= 1.20, "{i:?}");
        let even = Interval::bootstrap(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(even.median, 2.5);
        let tight: Vec<f64> = (0..21).map(|i| 1.0 + f64::from(i) / 10_000.0).collect();
        let t = Interval::bootstrap(&tight);
        assert!(t.high - t.low < i.high - i.low, "{t:?} {i:?}");
    }
}
