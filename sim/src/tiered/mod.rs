//! `run`: a small tiered JIT whose compiled code really runs, under the agent,
//! with every result, lookup and sample checked against a shadow model.
//!
//! Threads:
//! - **executors** (`--threads`, attached to the agent, registered as
//!   [`jitmap::Executor`]s) call random root methods through their
//!   indirection cells and check each result;
//! - the **compiler** publishes tier-0 code, tiers methods up when their call
//!   counters cross, swaps cells, retires old code, aborts a share of its
//!   compilations, de-optimizes methods back to tier 0, and loads and unloads
//!   whole groups of methods, each in its own heap;
//! - **readers** look up random addresses and judge every answer.

mod codegen;
mod group;
mod report;
mod scenario;
pub mod shadow;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use iced_x86::code_asm::CodeAssembler;
use jitmap::agent::{Agent, AgentConfig, Clock, HANDLER_V1_WORDS, SampleFrame};
use jitmap::events::monotonic_ns;
use jitmap::{CodeInfo, CodeRef, ExecutionManager, JitKind, MapVersion};
use parking_lot::{Mutex, RwLock};

use codegen::MethodShape;
use group::Group;
use jitmap_testkit::demo::DemoError;
use jitmap_testkit::rng::Rng;
pub use report::Report;
use scenario::Params;
pub use scenario::{RunConfig, RunError, SCENARIOS, Scenario};
use shadow::{Shadow, Version};

/// Lookups a reader makes between two visits to the shadow model.
const READER_BATCH: usize = 64;

/// One lookup a reader made, kept until it is judged.
struct Answer {
    addr: usize,
    /// CLOCK_MONOTONIC ns before and after the lookup.
    t0: u64,
    t1: u64,
    /// What it found: version id and block start.
    found: Option<(u64, usize)>,
    /// The version the address was picked inside, if it was.
    expected: Option<u64>,
}

/// Counters shared by the threads.
#[derive(Default)]
struct Counters {
    tier0: AtomicU64,
    tier_ups: AtomicU64,
    deopts: AtomicU64,
    publishes: AtomicU64,
    aborts: AtomicU64,
    frees: AtomicU64,
    unloads: AtomicU64,
    live_bytes: AtomicU64,
    peak_bytes: AtomicU64,
    lookups: AtomicU64,
    results: AtomicU64,
    crossings: AtomicU64,
    wrong: AtomicU64,
}

/// The state every thread shares.
struct Sim {
    manager: ExecutionManager,
    config: RunConfig,
    params: Params,
    groups: RwLock<Vec<Arc<Group>>>,
    shadow: RwLock<Shadow>,
    next_version: AtomicU64,
    counts: Counters,
    wrong_details: Mutex<Vec<String>>,
    latencies: Mutex<Vec<u64>>,
    stop: AtomicBool,
}

impl Sim {
    fn wrong(&self, what: String) {
        // Relaxed: a counter read after the threads are joined.
        self.counts.wrong.fetch_add(1, Ordering::Relaxed);
        let mut d = self.wrong_details.lock();
        if d.len() < 10 {
            d.push(what);
        }
    }

    fn stopping(&self) -> bool {
        // Relaxed: a stop flag; the joins order everything else.
        self.stop.load(Ordering::Relaxed)
    }

    /// Compiles method `m` of `group` at `tier`; `None` if the compilation
    /// aborted (the scenario's share).
    fn compile(
        &self,
        group: &Group,
        m: usize,
        tier: u8,
        rng: &mut Rng,
    ) -> Result<Option<(CodeRef, u64)>, RunError> {
        let method = group.methods[m];
        let version = self.next_version.fetch_add(1, Ordering::Relaxed); // Relaxed: unique ids only
        let shape = MethodShape {
            index: m as u32,
            work: method.work,
            callee_cell: method.callee.map(|c| group.cells[c].address() as u64),
            counter_cell: group.counters.cell(m as u32).map_or(0, |c| c as u64),
            probe_id: version,
            filler: if tier == 0 { method.filler } else { 0 },
        };
        let assemble = |ip: u64| -> Result<Vec<u8>, RunError> {
            let mut a = CodeAssembler::new(64).map_err(DemoError::from)?;
            match tier {
                0 => codegen::tier0(&mut a, &shape),
                _ => codegen::tier1(&mut a, &shape),
            }
            .map_err(DemoError::from)?;
            Ok(a.assemble(ip).map_err(DemoError::from)?)
        };
        let size = assemble(0)?.len() as u64;
        let heap_guard = group.heap.lock();
        let Some(heap) = heap_guard.as_ref() else {
            return Ok(None);
        };
        let mut r = heap.reserve(size)?;
        let bytes = assemble(r.address() as u64)?;
        r.code_mut().copy_from_slice(&bytes);
        if rng.chance(self.params.abort_percent) {
            r.abort();
            // Relaxed: statistics.
            self.counts.aborts.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        }
        let name = format!("g{}_m{m}_t{tier}", group.id);
        let start = r.address();
        self.shadow.write().publishing(
            version,
            Version {
                name: name.clone(),
                start,
                size,
                publish_begin: monotonic_ns(),
                publish_end: u64::MAX,
                free_begin: u64::MAX,
                free_end: u64::MAX,
            },
        );
        let kind = if tier == 0 {
            JitKind::Baseline
        } else {
            JitKind::Optimized
        };
        let code = match r.publish(CodeInfo::new(version, name, kind)) {
            Ok(code) => code,
            Err(e) => {
                self.shadow.write().unpublished(version);
                return Err(e.into());
            }
        };
        self.shadow.write().published(version, monotonic_ns());
        // Relaxed: statistics.
        self.counts.publishes.fetch_add(1, Ordering::Relaxed);
        let live = self.counts.live_bytes.fetch_add(size, Ordering::Relaxed) + size;
        self.counts.peak_bytes.fetch_max(live, Ordering::Relaxed);
        Ok(Some((code, version)))
    }

    /// Compiles `m` at `tier` (retrying aborted compilations), swaps its cell
    /// and frees the code it replaces. Returns false if the group is gone.
    fn install(&self, group: &Group, m: usize, tier: u8, rng: &mut Rng) -> Result<bool, RunError> {
        let (code, version) = loop {
            if !group.alive.load(Ordering::Acquire) {
                // Acquire: pairs with the unload's Release; nothing to install.
                return Ok(false);
            }
            if let Some(done) = self.compile(group, m, tier, rng)? {
                break done;
            }
        };
        // SAFETY: `codegen` emits every method with the `Entry` signature.
        group.cells[m].set(unsafe { code.entry() });
        let old = group.current.lock()[m].replace((code, version, tier));
        if let Some((old, old_version, _)) = old {
            self.free(group, old, old_version)?;
        }
        Ok(true)
    }

    fn free(&self, group: &Group, code: CodeRef, version: u64) -> Result<(), RunError> {
        self.shadow.write().freeing(version, monotonic_ns());
        if let Some(heap) = group.heap.lock().as_ref() {
            heap.free(code)?;
        }
        self.shadow.write().freed(version, monotonic_ns());
        // Relaxed: statistics.
        self.counts.frees.fetch_add(1, Ordering::Relaxed);
        self.counts
            .live_bytes
            .fetch_sub(code.size(), Ordering::Relaxed);
        Ok(())
    }

    /// Publishes tier 0 of every method of `group`, callees first.
    fn load(&self, group: &Group, rng: &mut Rng) -> Result<(), RunError> {
        for m in (0..group.methods.len()).rev() {
            if self.stopping() || !self.install(group, m, 0, rng)? {
                break;
            }
            // Relaxed: statistics.
            self.counts.tier0.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Drops `group`'s heap with all its code, after taking it out of use.
    fn unload(&self, group: &Group) {
        // Release: executors that see the group dead stop picking it.
        group.alive.store(false, Ordering::Release);
        let now = monotonic_ns();
        let versions: Vec<(u64, u64)> = group
            .current
            .lock()
            .iter()
            .flatten()
            .map(|(code, v, _)| (*v, code.size()))
            .collect();
        {
            let mut shadow = self.shadow.write();
            for (v, _) in &versions {
                shadow.freeing(*v, now);
            }
        }
        drop(group.heap.lock().take());
        let now = monotonic_ns();
        let mut shadow = self.shadow.write();
        for (v, size) in versions {
            shadow.freed(v, now);
            // Relaxed: statistics.
            self.counts.live_bytes.fetch_sub(size, Ordering::Relaxed);
        }
        // Relaxed: statistics.
        self.counts.unloads.fetch_add(1, Ordering::Relaxed);
    }

    /// Every 100 ms (when the scenario unloads): loads a new group of 64
    /// methods in its own heap, and unloads the oldest extra group once there
    /// are more than three.
    fn cycle_groups(
        &self,
        last_load: &mut Instant,
        next_group: &mut u32,
        rng: &mut Rng,
    ) -> Result<(), RunError> {
        if !self.params.unload || last_load.elapsed() <= Duration::from_millis(100) {
            return Ok(());
        }
        *last_load = Instant::now();
        let group = Arc::new(Group::new(
            *next_group,
            &self.manager,
            &self.config,
            64,
            0,
            self.params.threshold,
            rng,
        )?);
        *next_group += 1;
        self.load(&group, rng)?;
        let retired = {
            let mut groups = self.groups.write();
            groups.push(group);
            (groups.len() > 3).then(|| groups.remove(1))
        };
        if let Some(old) = retired {
            self.unload(&old);
        }
        Ok(())
    }

    /// One compiler step in twenty (when the scenario churns): de-optimizes
    /// one of the main group's tier-1 methods, picked uniformly among them.
    ///
    /// The rate then does not hang on how many methods have tiered up yet (a
    /// slow machine tiers up few in a short run, and a pick among all methods
    /// mostly missed them). A step is a tier-up or an idle pass of the
    /// compiler loop. The main group's methods cross their thresholds while
    /// it loads, so its tier-ups come as one burst, worked through in one
    /// pass; a run whose time ends during it still de-optimizes. Only the
    /// compiler thread installs code, so the method is still at tier 1 when it
    /// is replaced.
    fn maybe_deopt(&self, main: &Group, rng: &mut Rng) -> Result<(), RunError> {
        if !self.params.churn || !rng.chance(5) {
            return Ok(());
        }
        let tier1 = |c: &Option<(CodeRef, u64, u8)>| matches!(c, Some((_, _, 1)));
        let picked = {
            let current = main.current.lock();
            let count = current.iter().filter(|c| tier1(c)).count() as u64;
            (count > 0)
                .then(|| rng.below(count) as usize)
                .and_then(|k| current.iter().enumerate().filter(|(_, c)| tier1(c)).nth(k))
                .map(|(m, _)| m)
        };
        if let Some(m) = picked
            && self.install(main, m, 0, rng)?
        {
            main.counters.rearm(m as u32, self.params.threshold)?;
            // Relaxed: statistics.
            self.counts.deopts.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// The compiler thread.
    fn compiler(&self) -> Result<(), RunError> {
        let mut rng = Rng::new(self.config.seed ^ 0xC0DE);
        let main = Arc::clone(&self.groups.read()[0]);
        self.load(&main, &mut rng)?;
        let mut last_load = Instant::now();
        let mut next_group = 1;
        while !self.stopping() {
            let groups: Vec<Arc<Group>> = self.groups.read().clone();
            for group in &groups {
                for m in group.counters.take_crossed() {
                    let seen = monotonic_ns();
                    // Relaxed: statistics.
                    self.counts.crossings.fetch_add(1, Ordering::Relaxed);
                    if self.install(group, m as usize, 1, &mut rng)? {
                        self.counts.tier_ups.fetch_add(1, Ordering::Relaxed);
                        self.latencies.lock().push(monotonic_ns() - seen);
                    }
                    // A long burst of tier-ups does not hold back the loads,
                    // unloads and de-optimizations that are due.
                    self.maybe_deopt(&main, &mut rng)?;
                    self.cycle_groups(&mut last_load, &mut next_group, &mut rng)?;
                }
            }
            self.maybe_deopt(&main, &mut rng)?;
            self.cycle_groups(&mut last_load, &mut next_group, &mut rng)?;
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(())
    }

    /// An executor thread: calls roots, checks results.
    fn executor(&self, agent: &Agent, seed: u64) -> Result<(), RunError> {
        let executor = self.manager.register_executor()?;
        let attached = agent.attach_current_thread()?;
        let context = attached.probe_context() as u64;
        let mut rng = Rng::new(seed);
        while !self.stopping() {
            let group = {
                let groups = self.groups.read();
                Arc::clone(&groups[rng.below(groups.len() as u64) as usize])
            };
            // Acquire: pairs with the unload's Release.
            if !group.alive.load(Ordering::Acquire) {
                continue;
            }
            let root = group.roots[rng.below(group.roots.len() as u64) as usize];
            if !chain_ready(&group, root) {
                std::thread::yield_now();
                executor.quiescent();
                continue;
            }
            // This thread is an online executor, so the code it enters, and
            // any code it returns into, stays intact until its quiescent point
            // after the call.
            let got = (group.cells[root].get())(context);
            let expected = group.methods[root].value;
            // Relaxed: statistics.
            self.counts.results.fetch_add(1, Ordering::Relaxed);
            if got != expected {
                self.wrong(format!(
                    "g{}_m{root} returned {got}, expected {expected}",
                    group.id
                ));
            }
            executor.quiescent();
        }
        Ok(())
    }

    /// A reader thread: looks up addresses inside live versions and anywhere
    /// in the heaps, and judges each answer.
    ///
    /// It works in batches of [`READER_BATCH`]: picks the addresses under one
    /// read lock of the shadow model, looks them all up holding no lock, then
    /// judges them under one more. Taking the lock twice per lookup starved
    /// the compiler, whose every publish and free takes it to write, in an
    /// unoptimized build: its lock operations are slow there, and two readers
    /// held the lock much of the time. With one core taken by another
    /// process, such a build compiled as few as 657 of the startup scenario's
    /// 4,000 methods in 3 s; batched, all of them in each of 17 runs. In an
    /// optimized build the batches made no difference that could be measured
    /// (steady scenario, six alternated 3 s runs of each: a median of 799
    /// publishes batched against 810 unbatched, 0.99). Judging after the fact
    /// is as strict: versions stay in the model after their free, and their
    /// times only ever move from unknown to known.
    fn reader(&self, seed: u64) -> Result<(), RunError> {
        let reader = self.manager.register_reader()?;
        let mut rng = Rng::new(seed);
        let mut spans: Vec<(usize, u64)> = Vec::new();
        let mut picked: Vec<(usize, Option<u64>)> = Vec::with_capacity(READER_BATCH);
        let mut answers: Vec<Answer> = Vec::with_capacity(READER_BATCH);
        let mut wrong: Vec<String> = Vec::new();
        let mut batches = 0u64;
        while !self.stopping() {
            // The heaps' spans, anew every 4,096 lookups.
            if batches.is_multiple_of(4096 / READER_BATCH as u64) {
                spans = self
                    .manager
                    .heaps()
                    .iter()
                    .map(|h| (h.base(), h.span()))
                    .collect();
            }
            batches += 1;
            {
                let shadow = self.shadow.read();
                for _ in 0..READER_BATCH {
                    if rng.chance(75) {
                        if let Some((id, v)) = shadow.pick(rng.next_u64()) {
                            picked.push((v.start + rng.below(v.size) as usize, Some(id)));
                        }
                    } else if let Some(&(base, span)) =
                        spans.get(rng.below(spans.len().max(1) as u64) as usize)
                    {
                        picked.push((base + rng.below(span) as usize, None));
                    }
                }
            }
            for (addr, expected) in picked.drain(..) {
                let t0 = monotonic_ns();
                let found = {
                    let guard = self.manager.pin(&reader)?;
                    guard.find(addr).map(|b| (b.method_id(), b.start()))
                };
                let t1 = monotonic_ns();
                answers.push(Answer {
                    addr,
                    t0,
                    t1,
                    found,
                    expected,
                });
            }
            // Relaxed: statistics.
            self.counts
                .lookups
                .fetch_add(answers.len() as u64, Ordering::Relaxed);
            {
                let shadow = self.shadow.read();
                for a in answers.drain(..) {
                    if let Err(what) = shadow.judge_lookup(a.addr, a.t0, a.t1, a.found, a.expected)
                    {
                        wrong.push(what);
                    }
                }
            }
            for what in wrong.drain(..) {
                self.wrong(what);
            }
        }
        Ok(())
    }
}

/// Whether every method on `root`'s chain is compiled.
fn chain_ready(group: &Group, root: usize) -> bool {
    let mut m = Some(root);
    while let Some(i) = m {
        if !group::compiled(&group.cells[i]) {
            return false;
        }
        m = group.methods[i].callee;
    }
    true
}

/// Runs `config`; `progress` is told the elapsed fraction now and then.
/// `out`, if given, receives the agent's outputs.
pub fn run(
    config: RunConfig,
    out: Option<&std::path::Path>,
    progress: &(dyn Fn(f64) + Sync),
) -> Result<Report, RunError> {
    config.validate().map_err(RunError)?;
    let params = config.scenario.params();
    let manager = ExecutionManager::new(128);
    let mut rng = Rng::new(config.seed);
    let main = Group::new(
        0,
        &manager,
        &config,
        params.methods,
        params.large,
        params.threshold,
        &mut rng,
    )?;
    let sim = Sim {
        manager: manager.clone(),
        config,
        params,
        groups: RwLock::new(vec![Arc::new(main)]),
        shadow: RwLock::new(Shadow::default()),
        next_version: AtomicU64::new(1),
        counts: Counters::default(),
        wrong_details: Mutex::new(Vec::new()),
        latencies: Mutex::new(Vec::new()),
        stop: AtomicBool::new(false),
    };
    let agent = Agent::start(
        &manager,
        AgentConfig {
            hz: config.hz,
            clock: Clock::Wall,
            keep_samples: true,
            ..AgentConfig::default()
        },
    )?;
    if let Some(address) = config.serve {
        let bound = agent.serve(address)?;
        eprintln!("jitmap-sim run: serving profiles at http://{bound}/debug/pprof/profile");
    }
    let started = Instant::now();
    let errors: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let record = |r: Result<(), RunError>| {
        if let Err(e) = r {
            errors.lock().push(e.0);
            // Relaxed: a stop flag.
            sim.stop.store(true, Ordering::Relaxed);
        }
    };
    std::thread::scope(|s| {
        s.spawn(|| record(sim.compiler()));
        for t in 0..config.threads {
            let (sim, agent, record) = (&sim, &agent, &record);
            s.spawn(move || record(sim.executor(agent, config.seed + 1 + t as u64)));
        }
        for t in 0..2 {
            let (sim, record) = (&sim, &record);
            s.spawn(move || record(sim.reader(config.seed + 100 + t)));
        }
        while started.elapsed() < config.duration && !sim.stopping() {
            progress(started.elapsed().as_secs_f64() / config.duration.as_secs_f64());
            std::thread::sleep(Duration::from_millis(100));
        }
        progress(1.0);
        // Relaxed: a stop flag; the scope's joins order the rest.
        sim.stop.store(true, Ordering::Relaxed);
    });
    let seconds = started.elapsed().as_secs_f64();
    let profile = agent.stop();
    if let Some(e) = errors.into_inner().into_iter().next() {
        return Err(RunError(e));
    }
    if let Some(dir) = out {
        let run = jitmap_testkit::profile::ProfileRun {
            profile: profile.clone(),
            calls: 0,
            wrong: 0,
            period_ns: 1_000_000_000 / u64::from(config.hz),
        };
        jitmap_testkit::profile::write_outputs(&run, dir)?;
    }
    // Every sample's JIT frames, judged against the shadow model; a leaf left
    // unattributed must be one the handler's capped v1 walk cannot reach.
    let mut frames_checked = 0;
    {
        let shadow = sim.shadow.read();
        let v1_words = (config.version == MapVersion::V1).then_some(HANDLER_V1_WORDS);
        for sample in &profile.kept_samples {
            for (depth, frame) in sample.frames.iter().enumerate() {
                let judged = match *frame {
                    SampleFrame::Jit { addr, method, .. } => {
                        let m = &profile.methods[method];
                        let at = if depth == 0 { addr } else { addr - 1 };
                        shadow.judge_sample(at, sample.end_ns, m.method_id, &m.name)
                    }
                    SampleFrame::Unattributed { addr } if depth == 0 => {
                        shadow.judge_unattributed(addr, sample.end_ns, v1_words)
                    }
                    _ => continue,
                };
                frames_checked += 1;
                if let Err(what) = judged {
                    sim.wrong(what);
                }
            }
        }
    }
    let groups = sim.groups.read();
    let main_stats = groups[0].heap.lock().as_ref().map(|h| h.stats());
    let map_resident_bytes = groups
        .iter()
        .filter_map(|g| {
            g.heap
                .lock()
                .as_ref()
                .and_then(|h| h.map().words().resident_bytes().ok())
        })
        .sum::<usize>() as u64;
    let mut latencies = sim.latencies.lock().clone();
    latencies.sort_unstable();
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
            .map_or(0.0, |&ns| ns as f64 / 1000.0)
    };
    let c = &sim.counts;
    // Relaxed (all loads below): the threads are joined.
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    Ok(Report {
        scenario: config.scenario.to_string(),
        seconds,
        tier0: load(&c.tier0),
        tier_ups: load(&c.tier_ups),
        deopts: load(&c.deopts),
        tier_up_p50_us: pct(0.5),
        tier_up_p99_us: pct(0.99),
        publishes: load(&c.publishes),
        aborts: load(&c.aborts),
        frees: load(&c.frees),
        unloads: load(&c.unloads),
        live_bytes: load(&c.live_bytes),
        peak_bytes: load(&c.peak_bytes),
        fragmentation: main_stats.map_or(0.0, |s| {
            if s.free == 0 {
                0.0
            } else {
                1.0 - s.largest_free as f64 / s.free as f64
            }
        }),
        map_resident_bytes,
        lookups: load(&c.lookups),
        results_checked: load(&c.results),
        samples: profile.samples,
        samples_taken: profile.taken,
        samples_dropped: profile.dropped,
        frames_checked,
        probe_enters: profile.probes.enters,
        crossings: load(&c.crossings),
        top: profile
            .summary()
            .into_iter()
            .take(10)
            .map(|m| (m.name, m.self_samples, m.self_share))
            .collect(),
        wrong: load(&c.wrong),
        wrong_details: sim.wrong_details.lock().clone(),
    })
}
