//! A host that compiles, registers, instantiates, calls and drops 1,000
//! small modules while the agent samples its thread at 10 kHz. Each
//! module's functions return the module's own number, and each sample is
//! checked against the module the host was calling when it was taken.

use std::collections::HashMap;

use jitmap::ExecutionManager;
use jitmap::agent::{Agent, AgentConfig, Clock, SampleFrame};
use jitmap::events::monotonic_ns;
use jitmap_testkit::signal_alloc::{self, SignalCounting};
use wasmtime::{Engine, Instance, Module, Store};

#[global_allocator]
static GLOBAL: SignalCounting = SignalCounting;

const MODULES: u32 = 1000;

/// Module `id`: `outer` calls `inner`, which spins, and both return `id`.
fn wat(id: u32) -> String {
    format!(
        r#"(module $m{id}
  (func $inner (result i32)
    (local $i i32)
    (loop $again
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $again (i32.lt_u (local.get $i) (i32.const 3000000))))
    (i32.const {id}))
  (func $outer (export "outer") (result i32)
    (i32.xor (call $inner) (i32.const 0))))"#
    )
}

#[test]
fn a_thousand_modules_come_and_go_and_every_sample_names_its_own() {
    let manager = ExecutionManager::new(4);
    let engine = Engine::default();
    let images_before = manager.images().len();
    let agent = Agent::start(
        &manager,
        AgentConfig {
            hz: 10_000,
            // A thread's CPU-time timer fires on the kernel's ticks; the
            // wall clock's keeps the rate.
            clock: Clock::Wall,
            keep_samples: true,
            ..AgentConfig::default()
        },
    )
    .unwrap();
    // The detector sees a heap call made with SIGPROF blocked.
    signal_alloc::check_mask(true);
    signal_alloc::with_sigprof_blocked(|| drop(std::hint::black_box(vec![1u8; 64])));
    assert_eq!(
        signal_alloc::take_while_blocked(),
        2,
        "an allocation and its free"
    );
    let attached = agent.attach_current_thread().unwrap();
    // Per module: the interval of its call, and its methods' names by id.
    let mut calls = Vec::new();
    let mut names: HashMap<u64, (u32, String)> = HashMap::new();
    for id in 0..MODULES {
        let module = Module::new(&engine, wat(id)).unwrap();
        let registration = jitmap_wasmtime::register(&manager, &module).unwrap();
        for m in registration.methods() {
            names.insert(m.method_id, (id, m.name.clone()));
        }
        let mut store = Store::new(&engine, ());
        let instance = Instance::new(&mut store, &module, &[]).unwrap();
        let outer = instance
            .get_typed_func::<(), i32>(&mut store, "outer")
            .unwrap();
        let t0 = monotonic_ns();
        assert_eq!(outer.call(&mut store, ()).unwrap(), id as i32);
        calls.push((t0, monotonic_ns(), id));
        drop((instance, store, registration, module));
    }
    drop(attached);
    let profile = agent.stop();
    signal_alloc::check_mask(false);
    assert_eq!(signal_alloc::take_while_blocked(), 0);
    manager.try_reclaim_sections();
    assert_eq!(manager.images().len(), images_before);

    // Every guest frame names a method of the module being called when
    // the sample began, and the profile names it as that module does.
    let (mut guest, mut wrong) = (0u64, Vec::new());
    let mut by_name: HashMap<String, u64> = HashMap::new();
    for s in &profile.kept_samples {
        let call = calls
            .iter()
            .find(|(t0, t1, _)| (*t0..=*t1).contains(&s.begin_ns));
        for (depth, f) in s.frames.iter().enumerate() {
            let SampleFrame::Image { method_id, .. } = *f else {
                continue;
            };
            guest += 1;
            let (module, name) = &names[&method_id];
            if call.map(|c| c.2) != Some(*module) {
                wrong.push((s.begin_ns, name.clone(), call));
            }
            if depth == 0 {
                // The profile counts each sample's periods (1 + the
                // overrun of its signal).
                *by_name.entry(name.clone()).or_default() += u64::from(s.weight);
            }
        }
    }
    assert_eq!(wrong, Vec::new());
    assert!(guest >= 2 * u64::from(MODULES), "{guest} guest frames");
    // The profile's leaf names are the registrations' names, period for
    // period.
    let mut leaves: HashMap<String, u64> = HashMap::new();
    for st in &profile.stacks {
        if names.values().any(|(_, n)| *n == st.frames[0]) {
            *leaves.entry(st.frames[0].clone()).or_default() += st.count;
        }
    }
    let mut differ: Vec<_> = by_name
        .iter()
        .filter(|(name, n)| leaves.get(*name) != Some(n))
        .map(|(name, n)| (name.clone(), *n, leaves.get(name).copied()))
        .collect();
    differ.sort();
    differ.truncate(10);
    assert_eq!(differ, Vec::new(), "name, samples, in the profile");
    assert_eq!(leaves.len(), by_name.len());
}
