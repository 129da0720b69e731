//! The collector: drains the rings, names what the handlers recorded from the
//! heaps' code events, and aggregates the profile. It runs on its own thread
//! (and once more when the agent stops), never in a handler.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::events::{BlockId, CodeEvent, CodeListener};
use crate::image::ImageSection;
use crate::{CodeInfo, ExecutionManager, JitKind};

use super::profile::{
    Kept, MethodVersion, ProbeCounts, ProbeEvent, Profile, Sample, SampleFrame, Stack,
    version_labels,
};
use super::record::{FrameKind, ProbeKind, RawFrame, ThreadRecord};
use super::symbols::NativeNames;
use crate::unwind::StackEnd;

/// The code events the collector has not applied yet.
#[derive(Default)]
pub(crate) struct EventLog {
    events: Mutex<Vec<LogEntry>>,
}

enum LogEntry {
    Loaded {
        block: BlockId,
        info: Arc<CodeInfo>,
        start: usize,
        size: u64,
        at_ns: u64,
    },
    Moved {
        from: BlockId,
        to: BlockId,
        start: usize,
        at_ns: u64,
    },
    Freed {
        block: BlockId,
        tag: u64,
    },
    ImageLoaded(Arc<ImageSection>),
    ImageUnloaded {
        base: usize,
        tag: u64,
    },
}

/// Listens on the manager's code events for the collector.
pub(crate) struct EventListener {
    pub(crate) log: Arc<EventLog>,
    pub(crate) manager: ExecutionManager,
}

impl CodeListener for EventListener {
    fn on_event(&self, event: &CodeEvent) {
        let entry = match event {
            CodeEvent::Load(load) => LogEntry::Loaded {
                block: load.block,
                info: Arc::clone(&load.info),
                start: load.start,
                size: load.code.len() as u64,
                at_ns: load.timestamp,
            },
            // A move keeps the version, in a new block.
            CodeEvent::Move(moved) => LogEntry::Moved {
                from: moved.old_block,
                to: moved.new_block,
                start: moved.new_start,
                at_ns: moved.timestamp,
            },
            CodeEvent::Free(free) => LogEntry::Freed {
                block: free.block,
                // Every handler that could still find the freed block, and every
                // executor that could still run it, holds a slot older than this
                // tag; once it is safe, their samples are in the rings.
                tag: self.manager.domain().retire_tag(),
            },
            CodeEvent::ImageLoad(load) => LogEntry::ImageLoaded(Arc::clone(&load.image)),
            // As for a free: handlers that found the image are older.
            CodeEvent::ImageUnload(unload) => LogEntry::ImageUnloaded {
                base: unload.base,
                tag: self.manager.domain().retire_tag(),
            },
        };
        self.log.events.lock().push(entry);
    }
}

/// A method version the collector can name.
struct Known {
    info: Arc<CodeInfo>,
    start: usize,
    size: u64,
    /// CLOCK_MONOTONIC ns when it was published at `start` (0: before the
    /// agent started).
    placed_ns: u64,
    /// Its index in the profile's methods, once a sample named it.
    method: Option<usize>,
    /// The domain's retire tag, taken after its free.
    freed: Option<u64>,
}

/// An image the collector can name methods of.
struct KnownImage {
    image: Arc<ImageSection>,
    /// The domain's retire tag, taken after its unload.
    unloaded: Option<u64>,
}

impl KnownImage {
    /// The name of method `id` if this image has it at `addr`.
    fn name_at(&self, addr: usize, id: u64) -> Option<&str> {
        let rel = addr.checked_sub(self.image.base())?;
        let method = self.image.method_at(rel as u64)?;
        (method.method_id == id).then_some(method.name.as_str())
    }
}

/// A frame as aggregated: without offsets, native frames by address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum FrameKey {
    Jit(usize),
    Image(u64),
    Stub(u64),
    /// A native frame's chain of names ([`NativeNames`]).
    Native(usize),
    Unattributed,
}

/// A drained sample whose JIT versions are not all known yet (its load event
/// was still on its way).
struct Pending {
    /// Collection passes that could not name it yet.
    attempts: u32,
    /// Set when drained from a walk that stepped frames by native rows:
    /// what the stale-rows check needs ([`Collector::check_native_rows`]).
    native: Option<NativeRows>,
    tid: u32,
    begin_ns: u64,
    end_ns: u64,
    frames: Vec<RawFrame>,
}

/// A drained sample's native rows: the first frame they stepped, the
/// loader's counts they were made at, how its walk ended, and its thread.
#[derive(Clone, Copy)]
struct NativeRows {
    from: u32,
    loader: (u64, u64),
    end: u8,
    record: usize,
}

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
    known: HashMap<BlockId, Known>,
    /// A moved version's current block → the block it is known by.
    aliases: HashMap<BlockId, BlockId>,
    /// Loaded images, and unloaded ones a handler may still have found.
    images: Vec<KnownImage>,
    /// The names of the image methods samples named, by method id (empty:
    /// none), kept for the profile after their image is forgotten.
    image_names: HashMap<u64, String>,
    /// Every placement of a known version: start → (placed ns, version key).
    placements: HashMap<usize, Vec<(u64, BlockId)>>,
    methods: Vec<MethodVersion>,
    stacks: HashMap<Vec<FrameKey>, u64>,
    pending: Vec<Pending>,
    samples: u64,
    unattributed: u64,
    probes: ProbeCounts,
    kept_samples: Vec<Sample>,
    kept_probes: Vec<ProbeEvent>,
    /// (ticks, ns) at the start, for converting probe times.
    clock_origin: (u64, u64),
    ns_per_tick: f64,
    /// The window being profiled on demand, if any (see [`Window`]).
    window: Option<Window>,
    /// Native frames' names, resolved as samples are drained.
    names: NativeNames,
}

/// A window of the profile taken on demand (the pprof endpoint): the stacks
/// of the samples that ended in `[begin_ns, end_ns]`, beside the whole run's.
struct Window {
    begin_ns: u64,
    /// Set when the window closes; samples that end later are not its own.
    end_ns: u64,
    stacks: HashMap<Vec<FrameKey>, u64>,
    samples: u64,
    unattributed: u64,
}

impl Collector {
    /// A collector that knows `live` (the code published before it listened).
    pub(crate) fn new(
        keep: bool,
        max_versions: usize,
        live: impl IntoIterator<Item = (Arc<CodeInfo>, BlockId, usize, u64)>,
        images: Vec<Arc<ImageSection>>,
    ) -> Self {
        let mut placements: HashMap<usize, Vec<(u64, BlockId)>> = HashMap::new();
        let known = live
            .into_iter()
            .map(|(info, key, start, size)| {
                placements.entry(start).or_default().push((0, key));
                (
                    key,
                    Known {
                        info,
                        start,
                        size,
                        placed_ns: 0,
                        method: None,
                        freed: None,
                    },
                )
            })
            .collect();
        Self {
            loader_seen: None,
            keep,
            max_versions,
            merge_at: max_versions,
            known,
            aliases: HashMap::new(),
            images: images
                .into_iter()
                .map(|image| KnownImage {
                    image,
                    unloaded: None,
                })
                .collect(),
            image_names: HashMap::new(),
            placements,
            methods: Vec::new(),
            stacks: HashMap::new(),
            pending: Vec::new(),
            samples: 0,
            unattributed: 0,
            probes: ProbeCounts::default(),
            kept_samples: Vec::new(),
            kept_probes: Vec::new(),
            clock_origin: (super::probes::ticks(), crate::events::monotonic_ns()),
            ns_per_tick: 1.0,
            window: None,
            names: NativeNames::default(),
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
        let mut drained = Vec::new();
        for (index, record) in records.iter().enumerate() {
            // SAFETY: the caller holds the collector lock: the one consumer.
            unsafe {
                record.samples.drain(|h, frames| {
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
                        frames: frames[..h.depth as usize].to_vec(),
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
        self.check_native_rows(records, &mut drained);
        // Then the events: a version's load was sent before any handler could
        // find it, so waiting for the events sent so far covers every frame
        // drained above.
        manager.listeners().flush();
        for entry in std::mem::take(&mut *log.events.lock()) {
            self.apply(entry);
        }
        let mut waiting = std::mem::take(&mut self.pending);
        waiting.append(&mut drained);
        for mut sample in waiting {
            if !self.add(&sample) {
                sample.attempts += 1;
                self.pending.push(sample);
            }
        }
        // Freed versions whose grace period had passed before this pass: every
        // sample that named them, or ran in them, was drained above. (While a
        // sample still waits to be named, nothing is forgotten.)
        if self.pending.is_empty() {
            let before = self.known.len();
            self.known
                .retain(|_, k| k.freed.is_none_or(|tag| tag >= safe));
            self.images
                .retain(|k| k.unloaded.is_none_or(|tag| tag >= safe));
            if self.known.len() != before {
                let known = &self.known;
                self.placements.retain(|_, list| {
                    list.retain(|(_, key)| known.contains_key(key));
                    !list.is_empty()
                });
                self.aliases.retain(|_, key| known.contains_key(key));
            }
        }
        if self.methods.len() > self.merge_at {
            self.merge_retired();
            self.merge_at = self
                .max_versions
                .max(self.methods.len() + self.max_versions / 2);
        }
    }

    /// Merges versions the collector has forgotten, first sampled first,
    /// into one entry per tier, until the profile names half its cap of
    /// versions (or none is left to merge). A forgotten version can name no
    /// later sample, so only counts change hands. Versions still known, or
    /// named by a kept sample not yet taken, stay as they are.
    fn merge_retired(&mut self) {
        let mut held: HashSet<usize> = self.known.values().filter_map(|k| k.method).collect();
        for frame in self.kept_samples.iter().flat_map(|s| &s.frames) {
            if let SampleFrame::Jit { method, .. } = *frame {
                held.insert(method);
            }
        }
        let mut excess = self.methods.len().saturating_sub(self.max_versions / 2);
        let mut merge = vec![false; self.methods.len()];
        for (index, m) in self.methods.iter().enumerate() {
            if excess == 0 {
                break;
            }
            if m.merged == 0 && !held.contains(&index) {
                merge[index] = true;
                excess -= 1;
            }
        }
        if !merge.contains(&true) {
            return;
        }
        let mut remap = vec![usize::MAX; self.methods.len()];
        let mut entries: Vec<(JitKind, usize)> = Vec::new();
        let mut methods = Vec::with_capacity(self.methods.len());
        let mut gone = Vec::new();
        for (index, m) in std::mem::take(&mut self.methods).into_iter().enumerate() {
            if merge[index] {
                gone.push((index, m.kind));
                continue;
            }
            if m.merged > 0 {
                entries.push((m.kind, methods.len()));
            }
            remap[index] = methods.len();
            methods.push(m);
        }
        for (index, kind) in gone {
            let entry = match entries.iter().find(|(k, _)| *k == kind) {
                Some(&(_, entry)) => entry,
                None => {
                    entries.push((kind, methods.len()));
                    methods.push(merged_entry(kind));
                    methods.len() - 1
                }
            };
            methods[entry].merged += 1;
            remap[index] = entry;
        }
        self.methods = methods;
        let key = |k: FrameKey| match k {
            FrameKey::Jit(m) => FrameKey::Jit(remap[m]),
            other => other,
        };
        let rekey = |stacks: &mut HashMap<Vec<FrameKey>, u64>| {
            let mut merged: HashMap<Vec<FrameKey>, u64> = HashMap::with_capacity(stacks.len());
            for (keys, count) in stacks.drain() {
                *merged
                    .entry(keys.into_iter().map(key).collect())
                    .or_default() += count;
            }
            *stacks = merged;
        };
        rekey(&mut self.stacks);
        if let Some(w) = &mut self.window {
            rekey(&mut w.stacks);
        }
        for frame in self.kept_samples.iter_mut().flat_map(|s| &mut s.frames) {
            if let SampleFrame::Jit { method, .. } = frame {
                *method = remap[*method];
            }
        }
        for k in self.known.values_mut() {
            if let Some(m) = &mut k.method {
                *m = remap[*m];
            }
        }
    }

    /// Refreshes the cycle-counter rate from the time since the start.
    fn calibrate(&mut self) {
        let (t0, n0) = self.clock_origin;
        let (t, n) = (super::probes::ticks(), crate::events::monotonic_ns());
        if t > t0 + 1_000_000 && n > n0 {
            self.ns_per_tick = (n - n0) as f64 / (t - t0) as f64;
        }
    }

    fn ticks_to_ns(&self, ticks: u64) -> u64 {
        let (t0, n0) = self.clock_origin;
        let delta = (ticks as f64 - t0 as f64) * self.ns_per_tick;
        (n0 as f64 + delta).max(0.0) as u64
    }

    /// Applies one code event to the known versions. A version keeps the
    /// block it was first known in as its key; a move files its new block
    /// as an alias of that key, dropped when the version is freed.
    fn apply(&mut self, entry: LogEntry) {
        match entry {
            LogEntry::Loaded {
                block: key,
                info,
                start,
                size,
                at_ns,
            } => {
                self.placements.entry(start).or_default().push((at_ns, key));
                self.known.insert(
                    key,
                    Known {
                        info,
                        start,
                        size,
                        placed_ns: at_ns,
                        method: None,
                        freed: None,
                    },
                );
            }
            LogEntry::Moved {
                from,
                to,
                start,
                at_ns,
            } => {
                let key = self.aliases.remove(&from).unwrap_or(from);
                if let Some(k) = self.known.get_mut(&key) {
                    k.start = start;
                    k.placed_ns = at_ns;
                    self.placements.entry(start).or_default().push((at_ns, key));
                    self.aliases.insert(to, key);
                }
            }
            LogEntry::Freed { block, tag } => {
                let key = self.aliases.remove(&block).unwrap_or(block);
                if let Some(k) = self.known.get_mut(&key) {
                    k.freed = Some(tag);
                }
            }
            // One image may be both listed at the start and announced.
            LogEntry::ImageLoaded(image) => {
                if !self.images.iter().any(|k| Arc::ptr_eq(&k.image, &image)) {
                    self.images.push(KnownImage {
                        image,
                        unloaded: None,
                    });
                }
            }
            LogEntry::ImageUnloaded { base, tag } => {
                for k in &mut self.images {
                    if k.image.base() == base && k.unloaded.is_none() {
                        k.unloaded = Some(tag);
                    }
                }
            }
        }
    }

    /// The version a handler found at `start` in a sample that ended at
    /// `end_ns`: the one placed there last before then.
    fn placed_at(&self, start: usize, end_ns: u64) -> Option<BlockId> {
        self.placements
            .get(&start)?
            .iter()
            .filter(|(at, _)| *at <= end_ns)
            .max()
            .map(|&(_, key)| key)
    }

    /// The freed version whose bytes held `addr` when a sample that ended at
    /// `end_ns` saw nothing there. Freed code keeps running until its threads
    /// leave it (its bytes stay until their executors pass a quiescent point),
    /// but the maps no longer know it. The occupant is the version placed there
    /// last before the sample; `None` if none is known or if that one's free
    /// has not been seen yet.
    fn freed_at(&self, addr: usize, end_ns: u64) -> Option<BlockId> {
        let (_, key, freed) = self
            .known
            .iter()
            .filter_map(|(key, k)| {
                let inside = addr >= k.start && ((addr - k.start) as u64) < k.size;
                (inside && k.placed_ns <= end_ns).then_some((k.placed_ns, *key, k.freed.is_some()))
            })
            .max()?;
        freed.then_some(key)
    }

    /// Aggregates one sample; false if a JIT version in it is not known yet.
    /// An unattributed frame that may be in freed code is retried once before
    /// it counts as unattributed (its free event may still be on its way).
    fn add(&mut self, sample: &Pending) -> bool {
        let mut keys = Vec::with_capacity(sample.frames.len());
        let mut kept = Vec::new();
        for f in &sample.frames {
            let (key, frame) = match f.kind {
                FrameKind::Jit => {
                    let found = self.placed_at(f.key as usize, sample.end_ns);
                    let Some(method) = found.and_then(|key| self.method_of(key)) else {
                        return false;
                    };
                    (
                        FrameKey::Jit(method),
                        SampleFrame::Jit {
                            addr: f.addr,
                            method,
                            offset: f.offset,
                        },
                    )
                }
                FrameKind::Image => {
                    let at = if keys.is_empty() {
                        f.addr
                    } else {
                        f.addr.saturating_sub(1)
                    };
                    if !self.name_image_method(at, f.key, sample.attempts) {
                        return false;
                    }
                    (
                        FrameKey::Image(f.key),
                        SampleFrame::Image {
                            addr: f.addr,
                            method_id: f.key,
                            offset: f.offset,
                        },
                    )
                }
                FrameKind::Stub => (
                    FrameKey::Stub(f.key),
                    SampleFrame::Stub {
                        addr: f.addr,
                        kind: f.key as u8,
                    },
                ),
                FrameKind::Native => (
                    FrameKey::Native(self.names.id(f.addr, !keys.is_empty())),
                    SampleFrame::Native { addr: f.addr },
                ),
                FrameKind::Unattributed => {
                    let at = if keys.is_empty() {
                        f.addr
                    } else {
                        f.addr.saturating_sub(1)
                    };
                    match self.freed_at(at, sample.end_ns) {
                        Some(key) => {
                            let Some(method) = self.method_of(key) else {
                                return false;
                            };
                            let offset = (at - self.known[&key].start) as u32;
                            (
                                FrameKey::Jit(method),
                                SampleFrame::Jit {
                                    addr: f.addr,
                                    method,
                                    offset,
                                },
                            )
                        }
                        None if sample.attempts < 2 => return false,
                        None => (
                            FrameKey::Unattributed,
                            SampleFrame::Unattributed { addr: f.addr },
                        ),
                    }
                }
            };
            keys.push(key);
            if self.keep {
                kept.push(frame);
            }
        }
        self.samples += 1;
        let unattributed = keys.first() == Some(&FrameKey::Unattributed);
        self.unattributed += u64::from(unattributed);
        if let Some(w) = &mut self.window
            && (w.begin_ns..=w.end_ns).contains(&sample.end_ns)
        {
            w.samples += 1;
            w.unattributed += u64::from(unattributed);
            *w.stacks.entry(keys.clone()).or_default() += 1;
        }
        *self.stacks.entry(keys).or_default() += 1;
        if self.keep {
            self.kept_samples.push(Sample {
                tid: sample.tid,
                begin_ns: sample.begin_ns,
                end_ns: sample.end_ns,
                frames: kept,
            });
        }
        true
    }

    /// Learns the name of image method `id`, found at `at`, from the image
    /// that holds it (the newest first: an unloaded image may share its
    /// base). False while its image may not be known yet (its load event
    /// can follow the first samples in it by a pass); after two passes the
    /// method stays unnamed.
    fn name_image_method(&mut self, at: usize, id: u64, attempts: u32) -> bool {
        if self.image_names.contains_key(&id) {
            return true;
        }
        let name = self.images.iter().rev().find_map(|k| k.name_at(at, id));
        match name {
            Some(name) => {
                self.image_names.insert(id, name.to_owned());
                true
            }
            None => attempts >= 2,
        }
    }

    /// The profile index of a known version, assigned on first use.
    fn method_of(&mut self, key: BlockId) -> Option<usize> {
        let known = self.known.get_mut(&key)?;
        if let Some(m) = known.method {
            return Some(m);
        }
        let index = self.methods.len();
        self.methods.push(MethodVersion {
            method_id: known.info.method_id,
            name: known.info.name.clone(),
            label: known.info.name.clone(),
            kind: known.info.kind,
            start: known.start,
            freed: false,
            merged: 0,
        });
        known.method = Some(index);
        Some(index)
    }

    /// Cuts each drained sample whose native rows may be another object's
    /// at the first frame they stepped, and counts its walk as ended by
    /// [`StackEnd::NoUnwindInfo`]. The handler steps native frames by the
    /// table the collector made last, which may predate a `dlclose` and a
    /// `dlopen` that put another object at the same addresses. The loader's
    /// counts of loads and unloads only grow, so rows made at counts `c` are
    /// the loaded objects' at every moment the counts read `c`: at any
    /// sample before a moment they were read as `c`. They are read after
    /// every drain; a sample is kept whole if its rows' counts are those
    /// read now, or those read after the previous drain when it was taken
    /// before that. Only samples from the pass in which the loader changed
    /// can be cut.
    fn check_native_rows(&mut self, records: &[&ThreadRecord], drained: &mut [Pending]) {
        let now = (super::loader::counts(), crate::events::monotonic_ns());
        let before = self.loader_seen.replace(now);
        for sample in drained.iter_mut() {
            let Some(rows) = sample.native.take() else {
                continue;
            };
            let current = rows.loader == now.0
                || before.is_some_and(|(counts, at_ns)| {
                    rows.loader == counts && sample.begin_ns <= at_ns
                });
            if !current {
                sample.frames.truncate(rows.from as usize + 1);
                if let Some(record) = records.get(rows.record) {
                    record.recount_end(rows.end, StackEnd::NoUnwindInfo);
                }
            }
        }
    }

    /// The finished profile. Samples still waiting for their versions are
    /// counted as unattributed; native frames are symbolized here.
    pub(crate) fn finish(mut self, base: Profile) -> Profile {
        for sample in std::mem::take(&mut self.pending) {
            self.samples += 1;
            self.unattributed += 1;
            let keys = sample
                .frames
                .iter()
                .map(|_| FrameKey::Unattributed)
                .collect();
            *self.stacks.entry(keys).or_default() += 1;
        }
        let live: std::collections::HashSet<usize> = self
            .known
            .values()
            .filter_map(|k| k.method.filter(|_| k.freed.is_none()))
            .collect();
        for (index, m) in self.methods.iter_mut().enumerate() {
            m.freed = !live.contains(&index);
        }
        label_versions(&mut self.methods);
        self.names.resolve_waiting();
        let stacks = named_stacks(&self.methods, &self.image_names, &self.names, &self.stacks);
        Profile {
            samples: self.samples,
            unattributed: self.unattributed,
            stacks,
            methods: self.methods,
            probes: ProbeCounts {
                dropped: base.probes.dropped,
                ..self.probes
            },
            kept_samples: self.kept_samples,
            kept_probes: self.kept_probes,
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
            stacks: HashMap::new(),
            samples: 0,
            unattributed: 0,
        });
    }

    /// Sets the open window's end: samples that end later are not its own.
    pub(crate) fn end_window(&mut self, end_ns: u64) {
        if let Some(w) = &mut self.window {
            w.end_ns = end_ns;
        }
    }

    /// Closes the window and returns its profile (the run's methods, the
    /// window's stacks and counts, `duration` long), or `None` if none was
    /// open.
    pub(crate) fn take_window(&mut self, duration: std::time::Duration) -> Option<Profile> {
        let w = self.window.take()?;
        let mut methods = self.methods.clone();
        label_versions(&mut methods);
        self.names.resolve_waiting();
        let stacks = named_stacks(&methods, &self.image_names, &self.names, &w.stacks);
        Some(Profile {
            duration,
            samples: w.samples,
            taken: w.samples,
            unattributed: w.unattributed,
            stacks,
            methods,
            ..Profile::default()
        })
    }
}

/// The stacks of `keys` by name, most samples first: JIT frames by their
/// version's label, image methods by their name (`[image method <id>]` if
/// they have none), native frames by their chain of names (see
/// [`super::symbols`]).
fn named_stacks(
    methods: &[MethodVersion],
    image_names: &HashMap<u64, String>,
    names: &NativeNames,
    keys: &HashMap<Vec<FrameKey>, u64>,
) -> Vec<Stack> {
    let mut named: HashMap<Vec<String>, u64> = HashMap::new();
    for (keys, count) in keys {
        let mut frames = Vec::with_capacity(keys.len());
        for key in keys {
            match *key {
                FrameKey::Jit(m) => frames.push(methods[m].label.clone()),
                FrameKey::Image(id) => frames.push(match image_names.get(&id) {
                    Some(name) if !name.is_empty() => name.clone(),
                    _ => format!("[image method {id}]"),
                }),
                FrameKey::Stub(kind) => frames.push(format!("[stub {kind}]")),
                FrameKey::Unattributed => frames.push("[unattributed]".to_owned()),
                FrameKey::Native(id) => frames.extend(names.chain(id).iter().cloned()),
            }
        }
        *named.entry(frames).or_default() += count;
    }
    Stack::ranked(named)
}

/// The entry into which retired versions of `kind` are merged (none yet).
fn merged_entry(kind: JitKind) -> MethodVersion {
    let tier = match kind {
        JitKind::Baseline => "baseline",
        JitKind::Optimized => "optimized",
        JitKind::Instrumented => "instrumented",
        JitKind::Precompiled => "precompiled",
    };
    let name = format!("[retired {tier} versions]");
    MethodVersion {
        method_id: 0,
        label: name.clone(),
        name,
        kind,
        start: 0,
        freed: true,
        merged: 0,
    }
}

/// Gives versions that share a name distinct labels ([`version_labels`]).
fn label_versions(methods: &mut [MethodVersion]) {
    let labels = version_labels(methods.iter().map(|m| m.name.as_str()));
    for (m, label) in methods.iter_mut().zip(labels) {
        m.label = label;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ten versions, each sampled once into a stack of its own with `i + 1`
    /// samples; the first is optimized, the rest baseline.
    fn sampled(max_versions: usize) -> (Collector, Vec<BlockId>) {
        let infos: Vec<Arc<CodeInfo>> = (0..10u64)
            .map(|i| {
                let kind = if i == 0 {
                    JitKind::Optimized
                } else {
                    JitKind::Baseline
                };
                Arc::new(CodeInfo::new(i, format!("m{i}"), kind))
            })
            .collect();
        let keys: Vec<BlockId> = (1..=10)
            .map(|generation| BlockId {
                heap: 1,
                generation,
            })
            .collect();
        let live = infos
            .into_iter()
            .zip(&keys)
            .enumerate()
            .map(|(i, (info, &key))| (info, key, 0x1000 * (i + 1), 64));
        let mut c = Collector::new(false, max_versions, live, Vec::new());
        for (i, &key) in keys.iter().enumerate() {
            let m = c.method_of(key).unwrap();
            c.stacks
                .insert(vec![FrameKey::Native(0), FrameKey::Jit(m)], i as u64 + 1);
        }
        (c, keys)
    }

    /// A version is known by the block it was first known in: one listed
    /// before the agent listened, moved twice, then freed through its third
    /// block, is marked freed under its first, every placement names it,
    /// and no alias outlives the free. (Its info's `Arc` is no identity: a
    /// heap makes a fresh one for each event of a plain method.)
    #[test]
    fn moves_and_frees_reach_the_version_through_its_blocks() {
        let block = |generation| BlockId {
            heap: 7,
            generation,
        };
        let info = Arc::new(CodeInfo::new(42, "m", JitKind::Baseline));
        let mut c = Collector::new(false, 16, [(info, block(1), 0x1000, 64)], Vec::new());
        for (from, to, start, at_ns) in [(1, 2, 0x2000, 10), (2, 3, 0x3000, 20)] {
            c.apply(LogEntry::Moved {
                from: block(from),
                to: block(to),
                start,
                at_ns,
            });
        }
        assert_eq!(c.aliases.get(&block(3)), Some(&block(1)));
        assert_eq!(c.aliases.len(), 1);
        c.apply(LogEntry::Freed {
            block: block(3),
            tag: 99,
        });
        let known = &c.known[&block(1)];
        assert_eq!(
            (known.start, known.placed_ns, known.freed),
            (0x3000, 20, Some(99))
        );
        assert!(c.aliases.is_empty());
        for (start, at_ns) in [(0x1000, 5), (0x2000, 15), (0x3000, 25)] {
            assert_eq!(c.placed_at(start, at_ns), Some(block(1)), "{start:#x}");
        }
        assert_eq!(c.freed_at(0x3000 + 8, 25), Some(block(1)));
        let m = c.method_of(block(1)).unwrap();
        assert_eq!(
            (c.methods[m].method_id, c.methods[m].name.as_str()),
            (42, "m")
        );
        // A free of a block never known changes nothing.
        c.apply(LogEntry::Freed {
            block: block(8),
            tag: 100,
        });
        assert_eq!((c.known.len(), c.known[&block(1)].freed), (1, Some(99)));
    }

    fn counts(c: &Collector) -> Vec<(String, u64, u64)> {
        let mut by_stack: Vec<(String, u64, u64)> = c
            .stacks
            .iter()
            .map(|(keys, &n)| {
                let FrameKey::Jit(m) = keys[1] else {
                    unreachable!()
                };
                (c.methods[m].name.clone(), c.methods[m].merged, n)
            })
            .collect();
        by_stack.sort();
        by_stack
    }

    fn image(base: usize, id: u64, name: &str) -> Arc<ImageSection> {
        use crate::image::{ImageFunction, ImageInfo, ImageMethod};
        Arc::new(
            ImageSection::new(ImageInfo {
                base,
                size: 0x100,
                functions: vec![ImageFunction {
                    begin: 0x10,
                    end: 0x40,
                    unwind: Box::new([]),
                }],
                methods: vec![ImageMethod {
                    entry: 0x10,
                    method_id: id,
                    gc: None,
                    debug: vec![],
                    name: name.to_owned(),
                }],
                ..ImageInfo::default()
            })
            .unwrap(),
        )
    }

    /// A sample of image method `id`: its leaf at `leaf`, called from
    /// `caller` in the same method.
    fn image_sample(id: u64, leaf: usize, caller: usize) -> Pending {
        let frame = |addr| RawFrame {
            addr,
            key: id,
            offset: 0,
            kind: FrameKind::Image,
        };
        Pending {
            attempts: 0,
            native: None,
            tid: 1,
            begin_ns: 1,
            end_ns: 2,
            frames: vec![frame(leaf), frame(caller)],
        }
    }

    #[test]
    fn image_methods_are_named_by_the_image_that_holds_them_at_the_address() {
        let base = 0x7000_0000;
        // An unloaded image and the one loaded at its base after it: each
        // names only its own method id. A return address (the caller's
        // frame) is looked up one byte back: 0x40 is the end of the method.
        let mut c = Collector::new(false, 16, [], vec![image(base, 1, "a::f")]);
        c.images[0].unloaded = Some(5);
        c.images.push(KnownImage {
            image: image(base, 2, "b::f"),
            unloaded: None,
        });
        assert!(c.add(&image_sample(1, base + 0x10, base + 0x40)));
        assert!(c.add(&image_sample(2, base + 0x3f, base + 0x11)));
        // A method id no image has there waits two passes for its image,
        // then stays unnamed.
        let mut unknown = image_sample(3, base + 0x20, base + 0x20);
        assert!(!c.add(&unknown));
        unknown.attempts = 2;
        assert!(c.add(&unknown));
        let stacks = named_stacks(&c.methods, &c.image_names, &c.names, &c.stacks);
        let mut named: Vec<(Vec<String>, u64)> =
            stacks.into_iter().map(|s| (s.frames, s.count)).collect();
        named.sort();
        let v = |a: &str| vec![a.to_owned(), a.to_owned()];
        assert_eq!(
            named,
            [(v("[image method 3]"), 1), (v("a::f"), 1), (v("b::f"), 1)]
        );
    }

    #[test]
    fn forgotten_versions_merge_by_tier_keeping_their_counts_and_no_others() {
        let (mut c, keys) = sampled(4);
        c.known.retain(|key, _| *key == keys[3] || *key == keys[7]);
        c.merge_retired();
        let names: Vec<&str> = c.methods.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "m3",
                "m7",
                "[retired optimized versions]",
                "[retired baseline versions]"
            ]
        );
        assert_eq!(
            counts(&c),
            [
                (
                    "[retired baseline versions]".to_owned(),
                    7,
                    2 + 3 + 5 + 6 + 7 + 9 + 10
                ),
                ("[retired optimized versions]".to_owned(), 1, 1),
                ("m3".to_owned(), 0, 4),
                ("m7".to_owned(), 0, 8),
            ]
        );
        assert_eq!(c.known[&keys[3]].method, Some(0));
        assert_eq!(c.known[&keys[7]].method, Some(1));
    }

    #[test]
    fn a_second_merge_joins_the_first_entries_and_stops_at_half_the_cap() {
        let (mut c, keys) = sampled(4);
        c.known
            .retain(|key, _| keys[..3].contains(key) || keys[8..].contains(key));
        // m3..m7 are forgotten; merging stops once 4 / 2 entries would remain
        // over the cap: 10 - 2 = 8 to go, but only 5 can.
        c.merge_retired();
        let names: Vec<&str> = c.methods.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            names,
            ["m0", "m1", "m2", "m8", "m9", "[retired baseline versions]"]
        );
        assert_eq!(c.methods[5].merged, 5);
        // Then m0 and m1 are forgotten too: m0 starts the optimized entry, m1
        // joins the baseline one.
        c.known.retain(|key, _| *key != keys[0] && *key != keys[1]);
        c.merge_retired();
        assert_eq!(
            counts(&c),
            [
                (
                    "[retired baseline versions]".to_owned(),
                    6,
                    2 + 4 + 5 + 6 + 7 + 8
                ),
                ("[retired optimized versions]".to_owned(), 1, 1),
                ("m2".to_owned(), 0, 3),
                ("m8".to_owned(), 0, 9),
                ("m9".to_owned(), 0, 10),
            ]
        );
    }

    #[test]
    fn versions_named_by_kept_samples_are_not_merged() {
        let (mut c, _) = sampled(4);
        c.known.clear();
        c.kept_samples.push(Sample {
            tid: 1,
            begin_ns: 0,
            end_ns: 0,
            frames: vec![SampleFrame::Jit {
                addr: 0x5010,
                method: 4,
                offset: 16,
            }],
        });
        c.merge_retired();
        let names: Vec<&str> = c.methods.iter().map(|m| m.name.as_str()).collect();
        // Eight of the nine forgotten go (10 - 4 / 2), the first sampled first.
        assert_eq!(
            names,
            [
                "m4",
                "m9",
                "[retired optimized versions]",
                "[retired baseline versions]"
            ]
        );
        assert_eq!(
            c.kept_samples[0].frames,
            [SampleFrame::Jit {
                addr: 0x5010,
                method: 0,
                offset: 16
            }]
        );
    }
}
