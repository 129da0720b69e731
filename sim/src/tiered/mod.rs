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
//!
//! Two backends compile the methods: Cranelift through `jitmap-cranelift`
//! (the default: one module per group, tier-ups and de-optimizations through
//! its `redefine_function`), or iced-x86 code assembled by hand (see
//! [`Backend`]).

mod clif;
mod group;
mod iced;
mod judge;
mod report;
mod scenario;
pub mod shadow;
mod shape;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cranelift_codegen::CodegenError;
use cranelift_module::{Module, ModuleError};
use iced_x86::code_asm::CodeAssembler;
use jitmap::agent::{Agent, AgentConfig, Clock, HANDLER_V1_WORDS, Kept};
use jitmap::events::monotonic_ns;
use jitmap::{CodeInfo, CodeRef, ExecutionManager, JitKind, MapVersion, OwnedHeap};
use jitmap_cranelift::{JitError, TRAMPOLINE_BYTES};
use parking_lot::{Mutex, RwLock};

use clif::{ClifGroup, Inject};
use group::{Code, Entry, Group};
use jitmap_testkit::demo::DemoError;
use jitmap_testkit::rng::Rng;
use report::{Compiles, Durations};
pub use report::{Progress, Report, TierCompile, TimelinePoint};
use scenario::Params;
pub use scenario::{BACKENDS, Backend, EVENT_WAIT, RunConfig, RunError, SCENARIOS, Scenario};
use shadow::{Shadow, Version};
use shape::CodeShape;

/// Lookups a reader makes between two visits to the shadow model.
const READER_BATCH: usize = 64;

/// How often the run takes the agent's kept samples and judges them, so that
/// neither the agent nor the run holds more than this much of them.
const JUDGE_EVERY: Duration = Duration::from_secs(1);

/// How long after its free a version stays in the shadow model. Far beyond
/// the time any lookup or sample that can name it takes to be judged (a
/// reader judges its answers every [`READER_BATCH`] lookups, the agent's
/// samples are taken every [`JUDGE_EVERY`]).
const FORGET_AFTER: Duration = Duration::from_secs(30);

/// How often the report's timeline records the run's memory.
const TIMELINE_EVERY: Duration = Duration::from_secs(60);

/// This process's resident set, in bytes (0 if `/proc` says nothing).
pub(crate) fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf reads a constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * page.max(0) as u64
}

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
    /// Kept samples that named a version still being placed, for the next
    /// pass to judge.
    deferred: Mutex<Vec<Kept>>,
    /// Tier-up latencies.
    latencies: Mutex<Durations>,
    /// Per tier: the published compilations' compile times and sizes.
    compiles: [Mutex<Compiles>; 2],
    stop: AtomicBool,
    /// Set once the main group is compiled at tier 0.
    main_loaded: AtomicBool,
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

    /// Whether every event the scenario makes has happened at least once
    /// (see [`RunConfig::until_events`]).
    fn events_done(&self) -> bool {
        let p = &self.params;
        let c = &self.counts;
        // Relaxed: statistics polled by the run's loop.
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        self.main_loaded.load(Ordering::Relaxed)
            && n(&c.tier_ups) > 0
            && (p.abort_percent == 0 || n(&c.aborts) > 0)
            && (!p.unload || n(&c.unloads) > 0)
            && (!p.churn || n(&c.deopts) > 0)
    }

    /// Takes the samples the agent kept since the last take, judges them,
    /// and forgets the versions freed [`FORGET_AFTER`] ago.
    fn judge_taken(&self, agent: &Agent, frames_checked: &mut u64) -> Result<(), RunError> {
        let kept = agent.take_kept()?;
        *frames_checked += self.judge_samples(&kept, false);
        let horizon = monotonic_ns().saturating_sub(FORGET_AFTER.as_nanos() as u64);
        self.shadow.write().forget_freed_before(horizon);
        Ok(())
    }

    /// Judges the samples the last passes set aside, then `kept`'s
    /// ([`judge::judge`]); returns how many frames it judged. Each batch
    /// is judged with its own versions (the agent renumbers them between
    /// takes). With `last`, every publish has returned: nothing is set aside.
    fn judge_samples(&self, kept: &Kept, last: bool) -> u64 {
        let v1_words = (self.config.version == MapVersion::V1).then_some(HANDLER_V1_WORDS);
        let mut batches = std::mem::take(&mut *self.deferred.lock());
        batches.push(kept.clone());
        let shadow = self.shadow.read();
        let mut frames = 0;
        let mut deferred = Vec::new();
        for batch in &batches {
            let judged = judge::judge(&shadow, batch, v1_words, !last);
            frames += judged.frames;
            for what in judged.wrong {
                self.wrong(what);
            }
            if !judged.deferred.samples.is_empty() {
                deferred.push(judged.deferred);
            }
        }
        *self.deferred.lock() = deferred;
        frames
    }

    /// How far the run got, `elapsed` after its start.
    fn progress(&self, elapsed: Duration, duration: Duration) -> Progress {
        // Relaxed: statistics.
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Progress {
            fraction: (elapsed.as_secs_f64() / duration.as_secs_f64().max(1e-9)).min(1.0),
            elapsed,
            publishes: load(&self.counts.publishes),
            tier_ups: load(&self.counts.tier_ups),
            lookups: load(&self.counts.lookups),
            wrong: load(&self.counts.wrong),
        }
    }

    /// The run's memory and progress now, `elapsed` after its start.
    fn timeline_point(&self, elapsed: Duration) -> TimelinePoint {
        let committed = self
            .groups
            .read()
            .iter()
            .filter_map(|g| g.code.lock().as_ref().map(|c| c.heap().stats().committed))
            .sum();
        // Relaxed: statistics.
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        TimelinePoint {
            seconds: elapsed.as_secs_f64(),
            rss_bytes: resident_bytes(),
            code_committed_bytes: committed,
            shadow_versions: self.shadow.read().len() as u64,
            lookups: load(&self.counts.lookups),
            wrong: load(&self.counts.wrong),
        }
    }

    fn stopping(&self) -> bool {
        // Relaxed: a stop flag; the joins order everything else.
        self.stop.load(Ordering::Relaxed)
    }

    /// Counts a publish of `size` bytes.
    fn published(&self, size: u64) {
        // Relaxed: statistics.
        self.counts.publishes.fetch_add(1, Ordering::Relaxed);
        let live = self.counts.live_bytes.fetch_add(size, Ordering::Relaxed) + size;
        self.counts.peak_bytes.fetch_max(live, Ordering::Relaxed);
    }

    /// Counts an aborted compilation.
    fn aborted(&self) {
        // Relaxed: statistics.
        self.counts.aborts.fetch_add(1, Ordering::Relaxed);
    }

    /// Compiles method `m` of `group` at `tier` into `heap` with iced-x86;
    /// `None` if the compilation aborted (the scenario's share).
    fn compile_iced(
        &self,
        group: &Group,
        heap: &OwnedHeap,
        m: usize,
        tier: u8,
        rng: &mut Rng,
    ) -> Result<Option<(CodeRef, u64)>, RunError> {
        let method = group.methods[m];
        let version = self.next_version.fetch_add(1, Ordering::Relaxed); // Relaxed: unique ids only
        let shape = CodeShape {
            index: m as u32,
            counter_cell: group.counters.cell(m as u32).map_or(0, |c| c as u64),
            probe_id: version,
        };
        let callee_cell = method.callee.map(|c| group.cells[c].address() as u64);
        let assemble = |ip: u64| -> Result<Vec<u8>, RunError> {
            let mut a = CodeAssembler::new(64).map_err(DemoError::from)?;
            match tier {
                0 => iced::tier0(&mut a, &method, &shape, callee_cell),
                _ => iced::tier1(&mut a, &method, &shape, callee_cell),
            }
            .map_err(DemoError::from)?;
            Ok(a.assemble(ip).map_err(DemoError::from)?)
        };
        let t0 = monotonic_ns();
        let size = assemble(0)?.len() as u64;
        let mut r = heap.reserve(size)?;
        let bytes = assemble(r.address() as u64)?;
        let compile_ns = monotonic_ns() - t0;
        r.code_mut().copy_from_slice(&bytes);
        if rng.chance(self.params.abort_percent) {
            r.abort();
            self.aborted();
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
                stub: false,
                reserved_in_publish: false,
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
        self.published(size);
        self.compiles[usize::from(tier)]
            .lock()
            .record(compile_ns, size);
        // SAFETY: `iced` emits every method with the `Entry` signature.
        group.set_entry(m, unsafe { code.entry() });
        Ok(Some((code, version)))
    }

    /// Compiles method `m` of `group` at `tier` with Cranelift: defines it,
    /// or redefines it when it has code, and finalizes, which publishes the
    /// new version, switches the function's call cell and frees the old one.
    /// `None` if the compilation aborted: an injected verifier error, or an
    /// injected unknown symbol that makes finalize abort its reservation.
    fn compile_clif(
        &self,
        group: &Group,
        clif: &mut ClifGroup,
        m: usize,
        tier: u8,
        rng: &mut Rng,
    ) -> Result<Option<(CodeRef, u64)>, RunError> {
        let version = self.next_version.fetch_add(1, Ordering::Relaxed); // Relaxed: unique ids only
        let inject = rng.chance(self.params.abort_percent).then(|| {
            if rng.chance(50) {
                Inject::Verifier
            } else {
                Inject::Unresolved
            }
        });
        let shape = CodeShape {
            index: m as u32,
            counter_cell: group.counters.cell(m as u32).map_or(0, |c| c as u64),
            probe_id: version,
        };
        let func = clif.func(m);
        let old = group.current.lock()[m];
        let t0 = monotonic_ns();
        clif.select_tier(tier)?;
        let mut ctx = clif.body(&group.methods, &shape, tier, inject);
        let defined = match old {
            Some(_) => clif.module.redefine_function(func, &mut ctx),
            None => clif
                .module
                .define_function(func, &mut ctx)
                .map_err(JitError::from),
        };
        let compile_ns = monotonic_ns() - t0;
        match (defined, inject) {
            (Err(JitError::Module(e)), Some(Inject::Verifier))
                if matches!(*e, ModuleError::Compilation(CodegenError::Verifier(_))) =>
            {
                self.aborted();
                return Ok(None);
            }
            (Err(e), _) => return Err(e.into()),
            (Ok(()), Some(Inject::Verifier)) => {
                clif.module.cancel_definition(func)?;
                self.wrong(format!(
                    "the verifier passed g{}_m{m}'s type error",
                    group.id
                ));
                return Ok(None);
            }
            (Ok(()), _) => {}
        }
        clif.module.set_method_id(func, version)?;
        let publish_begin = monotonic_ns();
        {
            let mut shadow = self.shadow.write();
            shadow.placing(version);
            if let (Some((_, old_version, _)), None) = (old, inject) {
                shadow.freeing(old_version, publish_begin);
            }
        }
        match (clif.module.finalize_jit(), inject) {
            (Err(JitError::UnknownSymbol(name)), Some(Inject::Unresolved))
                if name == clif::MISSING_SYMBOL =>
            {
                clif.module.cancel_definition(func)?;
                self.shadow.write().unpublished(version);
                self.aborted();
                return Ok(None);
            }
            (Err(e), _) => {
                self.shadow.write().unpublished(version);
                return Err(e.into());
            }
            (Ok(()), Some(injected)) => {
                return Err(RunError(format!(
                    "g{}_m{m} finalized despite its injected {injected:?} failure",
                    group.id
                )));
            }
            (Ok(()), None) => {}
        }
        let code = clif
            .module
            .function_code(func)
            .ok_or_else(|| RunError(format!("g{}_m{m} has no code after finalize", group.id)))?;
        let now = monotonic_ns();
        {
            let mut shadow = self.shadow.write();
            shadow.placed(
                version,
                Version {
                    name: clif::name(group.id, m),
                    start: code.start(),
                    size: code.size(),
                    publish_begin,
                    publish_end: now,
                    free_begin: u64::MAX,
                    free_end: u64::MAX,
                    stub: false,
                    reserved_in_publish: true,
                },
            );
            if let Some((_, old_version, _)) = old {
                shadow.freed(old_version, now);
            }
        }
        if let Some((old_code, _, _)) = old {
            // Relaxed: statistics.
            self.counts.frees.fetch_add(1, Ordering::Relaxed);
            self.counts
                .live_bytes
                .fetch_sub(old_code.size(), Ordering::Relaxed);
        }
        self.published(code.size());
        self.compiles[usize::from(tier)]
            .lock()
            .record(compile_ns, code.size());
        if !group.is_compiled(m) {
            // SAFETY: the trampoline jumps to the function's live version,
            // and every method has the `Entry` signature.
            let entry: Entry = unsafe { std::mem::transmute(clif.trampoline(m)) };
            group.set_entry(m, entry);
        }
        Ok(Some((code, version)))
    }

    /// Compiles `m` at `tier` (retrying aborted compilations) and makes it
    /// the method's code; the code it replaces is freed. Returns false if
    /// the group is gone.
    fn install(&self, group: &Group, m: usize, tier: u8, rng: &mut Rng) -> Result<bool, RunError> {
        loop {
            // Acquire: pairs with the unload's Release; nothing to install.
            if !group.alive.load(Ordering::Acquire) {
                return Ok(false);
            }
            let mut code = group.code.lock();
            let installed = match code.as_mut() {
                None => return Ok(false),
                Some(Code::Iced(heap)) => self.compile_iced(group, heap, m, tier, rng)?,
                Some(Code::Cranelift(clif)) => self.compile_clif(group, clif, m, tier, rng)?,
            };
            let Some((new, version)) = installed else {
                continue;
            };
            let old = group.current.lock()[m].replace((new, version, tier));
            // A Cranelift module freed the old version in its finalize.
            if let (Some(Code::Iced(heap)), Some((old, old_version, _))) = (code.as_ref(), old) {
                self.free(heap, old, old_version)?;
            }
            return Ok(true);
        }
    }

    fn free(&self, heap: &OwnedHeap, code: CodeRef, version: u64) -> Result<(), RunError> {
        self.shadow.write().freeing(version, monotonic_ns());
        heap.free(code)?;
        self.shadow.write().freed(version, monotonic_ns());
        // Relaxed: statistics.
        self.counts.frees.fetch_add(1, Ordering::Relaxed);
        self.counts
            .live_bytes
            .fetch_sub(code.size(), Ordering::Relaxed);
        Ok(())
    }

    /// Records a new group's trampolines (Cranelift) as stubs, published
    /// since `since`.
    fn record_stubs(&self, group: &Group, since: u64) {
        let code = group.code.lock();
        let Some(Code::Cranelift(clif)) = code.as_ref() else {
            return;
        };
        let now = monotonic_ns();
        let mut shadow = self.shadow.write();
        let mut ids = group.stubs.lock();
        for m in 0..group.methods.len() {
            let id = self.next_version.fetch_add(1, Ordering::Relaxed); // Relaxed: unique ids only
            shadow.stub(
                id,
                Version {
                    name: format!("{}_trampoline", clif::name(group.id, m)),
                    start: clif.trampoline(m),
                    size: TRAMPOLINE_BYTES as u64,
                    publish_begin: since,
                    publish_end: now,
                    free_begin: u64::MAX,
                    free_end: u64::MAX,
                    stub: true,
                    reserved_in_publish: true,
                },
            );
            ids.push(id);
        }
    }

    /// Publishes tier 0 of every method of `group`, callees first.
    ///
    /// Methods that run hot meanwhile are tiered up between two loads, as a
    /// runtime's compile queue would: a large method takes Cranelift a few
    /// hundred milliseconds, and the methods already loaded do not wait for it.
    fn load(&self, group: &Group, rng: &mut Rng) -> Result<(), RunError> {
        for m in (0..group.methods.len()).rev() {
            if self.stopping() || !self.install(group, m, 0, rng)? {
                break;
            }
            // Relaxed: statistics.
            self.counts.tier0.fetch_add(1, Ordering::Relaxed);
            for hot in group.counters.take_crossed() {
                self.tier_up(group, hot as usize, rng)?;
            }
        }
        Ok(())
    }

    /// Tiers up method `m` of `group`, whose call counter crossed.
    fn tier_up(&self, group: &Group, m: usize, rng: &mut Rng) -> Result<(), RunError> {
        let seen = monotonic_ns();
        // Relaxed: statistics.
        self.counts.crossings.fetch_add(1, Ordering::Relaxed);
        if self.install(group, m, 1, rng)? {
            // Relaxed: statistics.
            self.counts.tier_ups.fetch_add(1, Ordering::Relaxed);
            self.latencies.lock().record(monotonic_ns() - seen);
        }
        Ok(())
    }

    /// Drops `group`'s heap (or module) with all its code, after taking it
    /// out of use.
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
        let stubs = group.stubs.lock().clone();
        {
            let mut shadow = self.shadow.write();
            for v in versions.iter().map(|(v, _)| v).chain(&stubs) {
                shadow.freeing(*v, now);
            }
        }
        drop(group.code.lock().take());
        let now = monotonic_ns();
        let mut shadow = self.shadow.write();
        for v in versions.iter().map(|(v, _)| v).chain(&stubs) {
            shadow.freed(*v, now);
        }
        for (_, size) in versions {
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
        let since = monotonic_ns();
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
        self.record_stubs(&group, since);
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
    /// compiler loop. Most of the main group's methods tier up while it
    /// loads; those that cross later come in bursts, and every tier-up of a
    /// burst is a step, so a run whose time ends during one still
    /// de-optimizes. Only the compiler thread installs code, so the method is
    /// still at tier 1 when it is replaced.
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
        // Relaxed: a flag the run's loop polls; it orders nothing.
        self.main_loaded.store(true, Ordering::Relaxed);
        let mut last_load = Instant::now();
        let mut next_group = 1;
        while !self.stopping() {
            let groups: Vec<Arc<Group>> = self.groups.read().clone();
            for group in &groups {
                for m in group.counters.take_crossed() {
                    self.tier_up(group, m as usize, &mut rng)?;
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

    /// A root to call, from a random group and root on: the first whose
    /// whole chain is compiled, in a live group. (Executors used to draw
    /// one root and yield when it was not ready: with Cranelift's slower
    /// compiles, 44 % of a profile was `sched_yield`.)
    fn ready_root(&self, rng: &mut Rng) -> Option<(Arc<Group>, usize)> {
        let groups = self.groups.read();
        let first = rng.below(groups.len() as u64) as usize;
        let skip = rng.next_u64() as usize;
        (0..groups.len())
            .map(|i| &groups[(first + i) % groups.len()])
            // Acquire: pairs with the unload's Release.
            .filter(|group| group.alive.load(Ordering::Acquire))
            .find_map(|group| {
                let roots = group.roots.len();
                (0..roots)
                    .map(|j| group.roots[(skip + j) % roots])
                    .find(|&root| group.ready(root))
                    .map(|root| (Arc::clone(group), root))
            })
    }

    /// An executor thread: calls roots, checks results.
    fn executor(&self, agent: &Agent, seed: u64) -> Result<(), RunError> {
        let executor = self.manager.register_executor()?;
        let attached = agent.attach_current_thread()?;
        let context = attached.probe_context() as u64;
        let mut rng = Rng::new(seed);
        while !self.stopping() {
            let Some((group, root)) = self.ready_root(&mut rng) else {
                // Nothing is compiled yet (the run's first milliseconds).
                std::thread::yield_now();
                executor.quiescent();
                continue;
            };
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
    /// times only ever move from unknown to known. An answer that names a
    /// version still being placed (a Cranelift finalize in progress, whose
    /// address the model learns when it returns) waits for a later batch.
    fn reader(&self, seed: u64) -> Result<(), RunError> {
        let reader = self.manager.register_reader()?;
        let mut rng = Rng::new(seed);
        let mut spans: Vec<(usize, u64)> = Vec::new();
        let mut picked: Vec<(usize, Option<u64>)> = Vec::with_capacity(READER_BATCH);
        let mut answers: Vec<Answer> = Vec::with_capacity(READER_BATCH);
        let mut waiting: Vec<Answer> = Vec::new();
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
            answers.append(&mut waiting);
            self.judge(&mut answers, &mut waiting, &mut wrong);
        }
        // The compiler has returned from its last finalize: every answer
        // still waiting names a placed version, or one that was withdrawn.
        while !waiting.is_empty() {
            let mut left = std::mem::take(&mut waiting);
            self.judge(&mut left, &mut waiting, &mut wrong);
            if !waiting.is_empty() {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        Ok(())
    }

    /// Judges `answers`, moving those that name a version being placed to
    /// `waiting`.
    fn judge(&self, answers: &mut Vec<Answer>, waiting: &mut Vec<Answer>, wrong: &mut Vec<String>) {
        {
            let shadow = self.shadow.read();
            for a in answers.drain(..) {
                if a.found.is_some_and(|(id, _)| shadow.is_placing(id)) {
                    waiting.push(a);
                } else if let Err(what) =
                    shadow.judge_lookup(a.addr, a.t0, a.t1, a.found, a.expected)
                {
                    wrong.push(what);
                }
            }
        }
        for what in wrong.drain(..) {
            self.wrong(what);
        }
    }
}

/// Runs `config`; `progress` is told how far it got, about ten times a
/// second.
/// `out`, if given, receives the agent's outputs.
pub fn run(
    config: RunConfig,
    out: Option<&std::path::Path>,
    progress: &(dyn Fn(&Progress) + Sync),
) -> Result<Report, RunError> {
    config.validate().map_err(RunError)?;
    let params = config.scenario.params();
    let manager = ExecutionManager::new(128);
    let mut rng = Rng::new(config.seed);
    let since = monotonic_ns();
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
        deferred: Mutex::new(Vec::new()),
        latencies: Mutex::new(Durations::default()),
        compiles: [
            Mutex::new(Compiles::default()),
            Mutex::new(Compiles::default()),
        ],
        stop: AtomicBool::new(false),
        main_loaded: AtomicBool::new(false),
    };
    sim.record_stubs(&sim.groups.read()[0], since);
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
    let mut frames_checked = 0;
    let mut timeline = Vec::new();
    let errors: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let record = |r: Result<(), RunError>| {
        if let Err(e) = r {
            errors.lock().push(e.0);
            // Relaxed: a stop flag.
            sim.stop.store(true, Ordering::Relaxed);
        }
    };
    // The executor threads register themselves as they start and leave as
    // they end, while the compiler may be replacing versions: this offline
    // executor keeps the manager's count up across those moments, so the
    // Cranelift module's refusal to free with no executor registered (a
    // host that forgot its threads) does not stop the run. It runs no code.
    let bracket = sim.manager.register_executor()?;
    bracket.offline();
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
        let cap = config.duration + scenario::EVENT_WAIT;
        let mut last_judged = Instant::now();
        loop {
            let elapsed = started.elapsed();
            let done = elapsed >= config.duration && (!config.until_events || sim.events_done());
            if done || elapsed >= cap || sim.stopping() {
                break;
            }
            progress(&sim.progress(elapsed, config.duration));
            std::thread::sleep(Duration::from_millis(100));
            if last_judged.elapsed() >= JUDGE_EVERY {
                last_judged = Instant::now();
                record(sim.judge_taken(&agent, &mut frames_checked));
            }
            if elapsed.as_secs() >= TIMELINE_EVERY.as_secs() * (timeline.len() as u64 + 1) {
                timeline.push(sim.timeline_point(elapsed));
            }
        }
        progress(&Progress {
            fraction: 1.0,
            ..sim.progress(started.elapsed(), config.duration)
        });
        // Relaxed: a stop flag; the scope's joins order the rest.
        sim.stop.store(true, Ordering::Relaxed);
    });
    drop(bracket);
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
    // The samples kept since the last take, judged like the others.
    let last = Kept {
        samples: profile.kept_samples.clone(),
        methods: profile.methods.iter().cloned().enumerate().collect(),
        ..Kept::default()
    };
    frames_checked += sim.judge_samples(&last, true);
    timeline.push(sim.timeline_point(started.elapsed()));
    let groups = sim.groups.read();
    let main_stats = groups[0].code.lock().as_ref().map(|c| c.heap().stats());
    let map_resident_bytes = groups
        .iter()
        .filter_map(|g| {
            g.code
                .lock()
                .as_ref()
                .and_then(|c| c.heap().map().words().resident_bytes().ok())
        })
        .sum::<usize>() as u64;
    let latencies = sim.latencies.lock().clone();
    let pct = |q| latencies.quantile_us(q);
    let compile = sim.compiles.each_ref().map(|c| c.lock().summary());
    // Frames named as JIT method versions, and the rest.
    let labels: std::collections::HashSet<&str> =
        profile.methods.iter().map(|m| m.label.as_str()).collect();
    let (jit, other): (Vec<_>, Vec<_>) = profile
        .summary()
        .into_iter()
        .filter(|m| m.self_samples > 0)
        .map(|m| (m.name, m.self_samples, m.self_share))
        .partition(|(name, _, _)| labels.contains(name.as_str()));
    let jit_self: u64 = jit.iter().map(|&(_, samples, _)| samples).sum();
    let c = &sim.counts;
    // Relaxed (all loads below): the threads are joined.
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    Ok(Report {
        scenario: config.scenario.to_string(),
        backend: config.backend.to_string(),
        seconds,
        tier0: load(&c.tier0),
        tier_ups: load(&c.tier_ups),
        deopts: load(&c.deopts),
        tier_up_p50_us: pct(0.5),
        tier_up_p99_us: pct(0.99),
        compile,
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
        samples: profile.counted(),
        signals_taken: profile.taken,
        signals_dropped: profile.dropped,
        frames_checked,
        probe_enters: profile.probes.enters,
        crossings: load(&c.crossings),
        jit_share: jit_self as f64 / profile.counted().max(1) as f64,
        top: jit.into_iter().take(10).collect(),
        top_other: other.into_iter().take(3).collect(),
        wrong: load(&c.wrong),
        wrong_details: sim.wrong_details.lock().clone(),
        timeline,
    })
}
