//! The 1:2:4 guest, for checking a profiler: a WebAssembly module whose
//! three leaves do 1, 2 and 4 units of the same work under `middle` and
//! `top`, called in a loop by its host. A profiler that is right gives the
//! leaves 1:2:4 of their self samples. The `guest_profile` example runs it
//! under the agent; the tests compare the agent, perf and eBPF on it.
//!
//! ```
//! use jitmap_wasmtime::demo::{Guest, ROUNDS, engine};
//!
//! let mut guest = Guest::new(&engine(false)?)?;
//! assert_eq!(guest.call(ROUNDS)?, Guest::expected(ROUNDS));
//! # Ok::<(), wasmtime::Error>(())
//! ```

use std::time::{Duration, Instant};

use jitmap::ExecutionManager;
use jitmap::agent::{Agent, AgentConfig, Profile};
use wasmtime::{Config, Engine, Instance, Module, ProfilingStrategy, Store, TypedFunc};

/// The guest, in the text format. Each leaf runs `n * k` rounds of a
/// linear congruential step from seed `k` (the same loop in all three);
/// `middle` mixes their results.
pub fn wat() -> String {
    let leaf = |k: u32| {
        format!(
            r#"
  (func $leaf_{k}x (param $n i32) (result i32)
    (local $i i32) (local $seed i32)
    (local.set $seed (i32.const {k}))
    (local.set $n (i32.mul (local.get $n) (i32.const {k})))
    (loop $again
      (local.set $seed
        (i32.add (i32.mul (local.get $seed) (i32.const 1664525))
                 (i32.add (i32.const 1013904223) (local.get $i))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $again (i32.lt_u (local.get $i) (local.get $n))))
    (local.get $seed))"#
        )
    };
    format!(
        r#"(module $guest{}{}{}
  (func $middle (param $n i32) (result i32)
    (i32.xor (call $leaf_1x (local.get $n))
      (i32.xor (call $leaf_2x (local.get $n)) (call $leaf_4x (local.get $n)))))
  (func $top (export "top") (param $n i32) (result i32)
    (call $middle (local.get $n))))"#,
        leaf(1),
        leaf(2),
        leaf(4)
    )
}

/// The leaves' names as the agent gives them, in units of work 1, 2, 4.
pub const LEAVES: [&str; 3] = ["guest::leaf_1x", "guest::leaf_2x", "guest::leaf_4x"];

/// Rounds of the 1x leaf per call of `top`, on average ([`run`] varies it
/// from half to one and a half times this).
pub const ROUNDS: i32 = 20_000;

/// An engine for the guest; with `jitdump`, wasmtime writes its own
/// jitdump (`jit-<pid>.dump` in the working directory) for `perf inject`.
pub fn engine(jitdump: bool) -> wasmtime::Result<Engine> {
    let mut config = Config::new();
    if jitdump {
        config.profiler(ProfilingStrategy::JitDump);
    }
    Engine::new(&config)
}

/// When a [`run`] ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Until {
    /// After this much wall time.
    Elapsed(Duration),
    /// Once the running thread's handler has taken this many samples, or
    /// after the given time, whichever comes first.
    Samples(u64, Duration),
}

/// A profiled run of the guest.
#[derive(Debug)]
pub struct DemoRun {
    /// The agent's profile.
    pub profile: Profile,
    /// Calls of `top` made.
    pub calls: u64,
    /// Calls whose result was not [`Guest::expected`].
    pub wrong: u64,
}

/// Compiles the guest on `engine`, registers it with `manager`, and calls
/// `top` on this thread under an agent started with `config` until `until`;
/// `started` is given the agent once it runs (to serve its profiles).
pub fn run(
    manager: &ExecutionManager,
    engine: &Engine,
    config: AgentConfig,
    until: Until,
    started: impl FnOnce(&Agent) -> Result<(), Box<dyn std::error::Error>>,
) -> Result<DemoRun, Box<dyn std::error::Error>> {
    let mut guest = Guest::new(engine)?;
    let registration = crate::register(manager, &guest.module)?;
    let agent = Agent::start(manager, config)?;
    started(&agent)?;
    // Calls of 16 lengths around ROUNDS, in a pseudo-random order: a call
    // of one fixed length repeats with a period that a sampling timer's can
    // lock to, and then the samples fall at the same few points of every
    // call (the 4x leaf's share moved from 49 to 68 % run to run).
    let lengths: Vec<(i32, i32)> = (0..16)
        .map(|i| {
            let n = ROUNDS / 2 + i * (ROUNDS / 16);
            (n, Guest::expected(n))
        })
        .collect();
    let mut pick = 0x2545_f491_u32;
    let attached = agent.attach_current_thread()?;
    let (mut calls, mut wrong) = (0, 0);
    let began = Instant::now();
    let done = |taken: u64| match until {
        Until::Elapsed(d) => began.elapsed() >= d,
        Until::Samples(n, cap) => taken >= n || began.elapsed() >= cap,
    };
    while !done(attached.samples_taken()) {
        pick ^= pick << 13;
        pick ^= pick >> 17;
        pick ^= pick << 5;
        let (n, expected) = lengths[(pick % 16) as usize];
        calls += 1;
        wrong += u64::from(guest.call(n)? != expected);
    }
    drop(attached);
    let profile = agent.stop();
    drop(registration);
    Ok(DemoRun {
        profile,
        calls,
        wrong,
    })
}

/// One instance of the guest and its `top`.
pub struct Guest {
    /// The compiled module (what a registration loads).
    pub module: Module,
    store: Store<()>,
    top: TypedFunc<i32, i32>,
}

impl Guest {
    /// Compiles and instantiates the guest on `engine`.
    pub fn new(engine: &Engine) -> wasmtime::Result<Self> {
        let module = Module::new(engine, wat())?;
        let mut store = Store::new(engine, ());
        let instance = Instance::new(&mut store, &module, &[])?;
        let top = instance.get_typed_func::<i32, i32>(&mut store, "top")?;
        Ok(Self { module, store, top })
    }

    /// Calls `top(n)`.
    pub fn call(&mut self, n: i32) -> wasmtime::Result<i32> {
        self.top.call(&mut self.store, n)
    }

    /// What `top(n)` returns.
    pub fn expected(n: i32) -> i32 {
        let work = |rounds: i32, mut seed: i32| {
            let mut i = 0i32;
            loop {
                seed = seed
                    .wrapping_mul(1_664_525)
                    .wrapping_add(1_013_904_223i32.wrapping_add(i));
                i += 1;
                if (i as u32) >= (rounds as u32) {
                    return seed;
                }
            }
        };
        work(n, 1) ^ work(n.wrapping_mul(2), 2) ^ work(n.wrapping_mul(4), 4)
    }
}
