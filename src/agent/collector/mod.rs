//! The collector: drains the rings, names what the handlers recorded from the
//! heaps' code events, and aggregates the profile. It runs on its own thread
//! (and once more when the agent stops), never in a handler.

use std::collections::{BTreeMap, VecDeque};

use rustc_hash::{FxHashMap, FxHashSet};
use std::sync::Arc;

use crate::events::BlockId;
use crate::heap::{MAX_STUB_KIND, StubKind};
use crate::image::ImageSection;
use crate::manager::stub_names::{Names as StubNames, slot};
use crate::{CodeInfo, ExecutionManager};

use super::profile::{Kept, MethodVersion, ProbeCounts, ProbeEvent, Profile, Sample, SampleFrame};
use super::record::{FrameKind, ProbeKind, RawFrame, ThreadRecord};
use super::symbols::NativeNames;

mod events;
mod naming;
mod pending;
mod placements;
#[cfg(test)]
mod tests;

pub(crate) use events::{EventListener, EventLog};
use naming::{FrameKey, label_versions, named_stacks};
use pending::{NativeRows, Pending};
use placements::{Known, KnownImage, Placement};

/// The collector's state.
pub(crate) struct Collector {
    /// The loader's counts after the previous pass's drain, and when.
    loader_seen: Option<((u64, u64), u64)>,
    keep: bool,
    /// Versions the profile names one by one before it merges retired ones
    /// ([`super::AgentConfig::profile_versions`]).
    max_versions: usize,
    /// The profile size past which the next merge is tried: the cap, or
    /// half a cap past a merge that could not reach half the cap (every
    /// version still held), so that a host whose live versions exceed the
    /// cap is not scanned on every pass.
    merge_at: usize,
    /// Versions by the block each was first known in.
    known: FxHashMap<BlockId, Known>,
    /// A moved version's current block → the block it is known by.
    aliases: FxHashMap<BlockId, BlockId>,
    /// Loaded images, and unloaded ones a handler may still have found.
    images: Vec<KnownImage>,
    /// The names of the image methods samples named, by method id (empty:
    /// none), kept for the profile after their image is forgotten.
    image_names: FxHashMap<u64, String>,
    /// The manager's names of its stub kinds, slot k for kind k, read at
    /// the first pass after a sample met the kind, and at each later one
    /// until the kind has one (a kind is named once).
    stub_names: StubNames,
    /// Bit k: a drained sample had a frame in a stub of kind k.
    stubs_seen: u16,
    /// Where versions are and were, by start, oldest first: the current
    /// placement of every known version, and each one it left (freed or
    /// moved away) until its grace period ends and no waiting sample holds
    /// its bytes.
    occupants: BTreeMap<usize, Vec<Placement>>,
    /// The largest placement's size: how far below an address a placement
    /// that holds it can start.
    max_size: u64,
    /// Placements left, in the order their events came: start, key, tag.
    /// The tags mostly grow; a move's, taken by the heap, may be below a
    /// free's queued before it, which only delays forgetting (`forget`
    /// stops at the first tag not yet safe).
    leaving: VecDeque<(usize, BlockId, u64)>,
    methods: Vec<MethodVersion>,
    stacks: FxHashMap<Vec<FrameKey>, u64>,
    pending: Vec<Pending>,
    samples: u64,
    /// Timer expirations the samples stand for (each 1 + its overrun).
    periods: u64,
    unattributed: u64,
    /// Samples that gave up waiting for a JIT version the collector never
    /// heard of ([`RETRIES`](pending::RETRIES)): a frame in them counts as unattributed.
    gave_up: u64,
    probes: ProbeCounts,
    /// The handlers' time in the samples drained: each walk's end less its
    /// signal's arrival, in ns.
    handler_ns: u64,
    kept_samples: Vec<Sample>,
    kept_probes: Vec<ProbeEvent>,
    /// (ticks, ns) at the start, for converting probe times.
    clock_origin: (u64, u64),
    ns_per_tick: f64,
    /// The window being profiled on demand, if any (see [`Window`]).
    window: Option<Window>,
    /// Native frames' names, resolved as samples are drained.
    names: NativeNames,
    /// The frame keys of the sample being added, kept between samples.
    scratch: Vec<FrameKey>,
    /// The last native frame's address and name id at each depth, this pass
    /// (ids hold within a pass: the names follow the loader only at its
    /// start).
    same_native: Vec<Option<(usize, usize)>>,
    /// Frame buffers of samples already counted, reused by the next drain:
    /// a pass allocates nothing a sample in the steady state
    /// ([`pending::SPARE_FRAME_BUFFERS`] at most).
    spare_frames: Vec<Vec<RawFrame>>,
    /// The drain's list of samples, kept between passes for its room.
    drained: Vec<Pending>,
}

/// The cycle counter's ns a tick until a million ticks measure it: from the
/// rate the architecture reports (aarch64's `CNTFRQ_EL0`), or 1 where none
/// does. A probe's time used to be off by the counter's rate for its first
/// million ticks: 40 ms on a 25 MHz counter.
fn ns_per_tick(rate: Option<u64>) -> f64 {
    rate.map_or(1.0, |hz| 1e9 / hz as f64)
}

/// A window of the profile taken on demand (the pprof endpoint): the stacks
/// of the samples that ended in `[begin_ns, end_ns]`, beside the whole run's.
struct Window {
    begin_ns: u64,
    /// Set when the window closes; samples that end later are not its own.
    end_ns: u64,
    stacks: FxHashMap<Vec<FrameKey>, u64>,
    samples: u64,
    periods: u64,
    unattributed: u64,
    gave_up: u64,
    /// The handlers' time on its samples (`end_ns - begin_ns`), in ns.
    handler_ns: u64,
}

impl Collector {
    /// A collector that knows `live` (the code published before it listened).
    pub(crate) fn new(
        keep: bool,
        max_versions: usize,
        live: impl IntoIterator<Item = (Arc<CodeInfo>, BlockId, usize, u64)>,
        images: Vec<Arc<ImageSection>>,
    ) -> Self {
        let mut occupants: BTreeMap<usize, Vec<Placement>> = BTreeMap::new();
        let mut max_size = 0;
        let known = live
            .into_iter()
            .map(|(info, key, start, size)| {
                occupants.entry(start).or_default().push(Placement {
                    size,
                    placed_ns: 0,
                    key,
                    left: None,
                    unpublished_ns: None,
                });
                max_size = max_size.max(size);
                (key, Known::new(info, start, size))
            })
            .collect();
        Self {
            loader_seen: None,
            keep,
            max_versions,
            merge_at: max_versions,
            known,
            aliases: FxHashMap::default(),
            images: images
                .into_iter()
                .map(|image| KnownImage {
                    image,
                    unloaded: None,
                })
                .collect(),
            image_names: FxHashMap::default(),
            stub_names: StubNames::default(),
            stubs_seen: 0,
            occupants,
            max_size,
            leaving: VecDeque::new(),
            methods: Vec::new(),
            stacks: FxHashMap::default(),
            pending: Vec::new(),
            samples: 0,
            periods: 0,
            unattributed: 0,
            gave_up: 0,
            probes: ProbeCounts::default(),
            handler_ns: 0,
            kept_samples: Vec::new(),
            kept_probes: Vec::new(),
            clock_origin: (super::probes::ticks(), crate::events::monotonic_ns()),
            ns_per_tick: ns_per_tick(crate::arch::tick_rate()),
            window: None,
            names: NativeNames::default(),
            scratch: Vec::new(),
            same_native: Vec::new(),
            spare_frames: Vec::new(),
            drained: Vec::new(),
        }
    }

    /// One collection pass over `records`: drains every ring, then applies the
    /// code events sent so far, names what it can, and forgets freed versions
    /// no handler can still be recording. `loader` is the loader's counts now
    /// (for native names). Only one pass runs at a time (the caller holds
    /// the collector's lock, which makes it each ring's one consumer).
    pub(crate) fn collect(
        &mut self,
        manager: &ExecutionManager,
        log: &EventLog,
        records: &[&ThreadRecord],
        loader: (u64, u64),
    ) {
        // Every handler pinned before this point has finished its sample by
        // the time `safe` says so; computed before the drain, it covers them.
        let safe = manager.domain().safe_before();
        self.calibrate();
        self.names.follow_loader(loader);
        self.same_native.clear();
        let waiting: usize = records.iter().map(|r| r.samples.len()).sum();
        let mut drained = std::mem::take(&mut self.drained);
        drained.reserve(waiting);
        for (index, record) in records.iter().enumerate() {
            // SAFETY: the caller holds the collector lock: the one consumer.
            unsafe {
                record.samples.drain(|h, frames| {
                    self.handler_ns += h.end_ns.saturating_sub(h.begin_ns);
                    let mut owned = self.spare_frames.pop().unwrap_or_default();
                    // Copied, and the stub kinds met noted on the way.
                    owned.extend(frames[..h.depth as usize].iter().map(|f| {
                        self.stubs_seen |= u16::from(f.kind == FrameKind::Stub) << (f.key & 15);
                        *f
                    }));
                    drained.push(Pending {
                        attempts: 0,
                        native: (h.native_from < h.depth).then_some(NativeRows {
                            from: h.native_from,
                            loader: h.rows_loader,
                            end: h.end,
                            record: index,
                        }),
                        tid: record.tid,
                        begin_ns: h.begin_ns,
                        end_ns: h.end_ns,
                        weight: h.weight.max(1),
                        frames: owned,
                    })
                })
            };
            // SAFETY: as above.
            unsafe {
                record.probes.drain(|p, _| {
                    match p.kind {
                        ProbeKind::Enter => self.probes.enters += 1,
                        ProbeKind::Value => self.probes.values += 1,
                    }
                    if self.keep {
                        let time_ns = self.ticks_to_ns(p.ticks);
                        self.kept_probes.push(ProbeEvent {
                            tid: record.tid,
                            time_ns,
                            method_id: p.method_id,
                            value: (p.kind == ProbeKind::Value).then_some(p.value),
                        });
                    }
                })
            };
        }
        self.name_stub_kinds(manager);
        self.check_native_rows(records, &mut drained);
        // Then the events: a version's load was sent before any handler could
        // find it, so waiting for the events sent so far covers every frame
        // drained above, but for a moved method's new copy found in the
        // moment before its move's event was sent (it waits for the next
        // pass: `placed_at`).
        manager.listeners().flush();
        for entry in std::mem::take(&mut *log.events.lock()) {
            self.apply(entry);
        }
        self.settle(&mut drained, safe);
        self.drained = drained;
    }

    /// Refreshes the cycle-counter rate from the time since the start.
    fn calibrate(&mut self) {
        let (t0, n0) = self.clock_origin;
        let (t, n) = (super::probes::ticks(), crate::events::monotonic_ns());
        if t > t0 + 1_000_000 && n > n0 {
            self.ns_per_tick = (n - n0) as f64 / (t - t0) as f64;
        }
    }

    pub(super) fn ticks_to_ns(&self, ticks: u64) -> u64 {
        let (t0, n0) = self.clock_origin;
        let delta = (ticks as f64 - t0 as f64) * self.ns_per_tick;
        (n0 as f64 + delta).max(0.0) as u64
    }

    /// Reads the manager's stub-kind names, in one lock, when samples met a
    /// kind that has none yet: nothing for a host whose samples meet no
    /// stub, or only named ones. (A kind is named once, so a later read
    /// holds every name an earlier one did.)
    fn name_stub_kinds(&mut self, manager: &ExecutionManager) {
        let unnamed = (1..=MAX_STUB_KIND).filter_map(StubKind::new).any(|kind| {
            self.stubs_seen & (1 << kind.get()) != 0 && self.stub_names[slot(kind)].is_none()
        });
        if unnamed {
            self.stub_names = manager.stub_kind_names();
        }
    }

    /// The finished profile. Samples still waiting for their events are
    /// taken as they are: a frame whose version never came unattributed
    /// (the sample counted as one that gave up), the others named; native
    /// frames are symbolized here.
    pub(crate) fn finish(mut self, base: Profile) -> Profile {
        for sample in std::mem::take(&mut self.pending) {
            self.aggregate(&sample, false);
        }
        let live: FxHashSet<usize> = self
            .known
            .values()
            .filter_map(|k| k.method.filter(|_| k.freed.is_none()))
            .collect();
        for (index, m) in self.methods.iter_mut().enumerate() {
            m.freed = !live.contains(&index);
        }
        label_versions(&mut self.methods);
        self.names.resolve_waiting();
        let stacks = named_stacks(
            &self.methods,
            &self.image_names,
            &self.stub_names,
            &self.names,
            &self.stacks,
        );
        Profile {
            samples: self.samples,
            periods: self.periods,
            unattributed: self.unattributed,
            gave_up: self.gave_up,
            stacks,
            methods: self.methods,
            probes: ProbeCounts {
                dropped: base.probes.dropped,
                ..self.probes
            },
            kept_samples: self.kept_samples,
            kept_probes: self.kept_probes,
            handler_time: std::time::Duration::from_nanos(self.handler_ns),
            ..base
        }
    }
}

impl Collector {
    /// Moves out the samples and probe records kept so far, with the
    /// versions the samples name.
    pub(crate) fn take_kept(&mut self) -> Kept {
        let samples = std::mem::take(&mut self.kept_samples);
        let probes = std::mem::take(&mut self.kept_probes);
        let mut methods = std::collections::BTreeMap::new();
        for frame in samples.iter().flat_map(|s| &s.frames) {
            if let SampleFrame::Jit { method, .. } = *frame
                && let Some(m) = self.methods.get(method)
            {
                methods.entry(method).or_insert_with(|| m.clone());
            }
        }
        Kept {
            samples,
            probes,
            methods,
        }
    }
}

impl Collector {
    /// Opens a window at `begin_ns`: from the next collection on, samples
    /// that end from then are also counted in it. Replaces an open one.
    pub(crate) fn open_window(&mut self, begin_ns: u64) {
        self.window = Some(Window {
            begin_ns,
            end_ns: u64::MAX,
            stacks: FxHashMap::default(),
            samples: 0,
            periods: 0,
            unattributed: 0,
            gave_up: 0,
            handler_ns: 0,
        });
    }

    /// Sets the open window's end: samples that end later are not its own.
    pub(crate) fn end_window(&mut self, end_ns: u64) {
        if let Some(w) = &mut self.window {
            w.end_ns = end_ns;
        }
    }

    /// Closes the window and returns its profile (the run's methods, the
    /// window's stacks and counts and its samples' handler time, `duration`
    /// long), or `None` if none was open.
    pub(crate) fn take_window(&mut self, duration: std::time::Duration) -> Option<Profile> {
        let w = self.window.take()?;
        let mut methods = self.methods.clone();
        label_versions(&mut methods);
        self.names.resolve_waiting();
        let stacks = named_stacks(
            &methods,
            &self.image_names,
            &self.stub_names,
            &self.names,
            &w.stacks,
        );
        Some(Profile {
            duration,
            samples: w.samples,
            periods: w.periods,
            taken: w.samples,
            unattributed: w.unattributed,
            gave_up: w.gave_up,
            handler_time: std::time::Duration::from_nanos(w.handler_ns),
            stacks,
            methods,
            ..Profile::default()
        })
    }
}
