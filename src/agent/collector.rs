//! The collector: drains the rings, names what the handlers recorded from the
//! heaps' code events, and aggregates the profile. It runs on its own thread
//! (and once more when the agent stops), never in a handler.

use std::collections::{BTreeMap, VecDeque};

use rustc_hash::{FxHashMap, FxHashSet};
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
        /// The retire tag after the move: the old copy may still run, and be
        /// sampled, until it is safe.
        tag: u64,
    },
    Freed {
        block: BlockId,
        tag: u64,
        /// CLOCK_MONOTONIC ns, taken after the unpublish: a handler that
        /// began later cannot have found the block through the maps.
        at_ns: u64,
    },
    ImageLoaded(Arc<ImageSection>),
    ImageUnloaded {
        /// The unloaded image's [`ImageSection::id`].
        id: u64,
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
                // Taken by the heap after it unpublished the old copy: a
                // handler that pins later cannot find it, and one that
                // found it, or an executor still running it, holds an
                // older slot. (A tag taken here could precede the
                // unpublish, and the old copy be forgotten while a handler
                // still finds it.)
                tag: moved.retire_tag,
            },
            CodeEvent::Free(free) => LogEntry::Freed {
                block: free.block,
                // Every handler that could still find the freed block, and every
                // executor that could still run it, holds a slot older than this
                // tag; once it is safe, their samples are in the rings.
                tag: self.manager.domain().retire_tag(),
                at_ns: free.timestamp,
            },
            CodeEvent::ImageLoad(load) => LogEntry::ImageLoaded(Arc::clone(&load.image)),
            // As for a free: handlers that found the image are older.
            CodeEvent::ImageUnload(unload) => LogEntry::ImageUnloaded {
                id: unload.image_id,
                tag: self.manager.domain().retire_tag(),
            },
        };
        self.log.events.lock().push(entry);
    }
}

/// A method version the collector can name.
struct Known {
    info: Arc<CodeInfo>,
    /// Where it is now (its last placement).
    start: usize,
    size: u64,
    /// Its index in the profile's methods, once a sample named it.
    method: Option<usize>,
    /// The domain's retire tag, taken after its free.
    freed: Option<u64>,
    /// Its placements in `occupants`: a freed version is forgotten with
    /// its last one.
    placements: u32,
}

/// One place a version's bytes were: published there, or moved there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Placement {
    size: u64,
    /// CLOCK_MONOTONIC ns when it was placed (0: before the agent started).
    placed_ns: u64,
    key: BlockId,
    /// The retire tag taken when the version left (freed, or moved away):
    /// once it is safe, no sample can still be running in these bytes.
    left: Option<u64>,
    /// When a free unpublished it (CLOCK_MONOTONIC ns): a handler that
    /// began later found another block at this start, not this one. (A
    /// move's old copy has none: it stays findable until just after the
    /// move's timestamp.)
    freed_ns: Option<u64>,
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

/// Passes a drained sample is retried for while a frame in it names what
/// the collector does not know (a JIT version, an image method, code whose
/// free it has not seen): a load event can follow the first samples in its
/// code by a pass, and a move's event follows its new copy's first
/// samples. Past these passes and [`WAIT_NS`] after it ended, a sample
/// takes each such frame as it is (unattributed; an image method unnamed):
/// one that waited for an event that never comes would wait for good, and
/// hold with it the placements and the unloaded images its frames may name.
const RETRIES: u32 = 2;

/// How long after it ended a sample may wait for its events, whatever the
/// passes (two can run back to back: `profile_window(Duration::ZERO)`).
/// A heap sends an event within its publish, under its lock; a second
/// covers a heap thread that was preempted there on a loaded machine.
const WAIT_NS: u64 = 1_000_000_000;

/// A drained sample whose frames are not all named yet (an event that
/// names one may still be on its way; see [`RETRIES`]).
struct Pending {
    /// Collection passes that could not name it yet.
    attempts: u32,
    /// Set when drained from a walk that stepped frames by native rows:
    /// what the stale-rows check needs ([`Collector::check_native_rows`]).
    native: Option<NativeRows>,
    tid: u32,
    begin_ns: u64,
    end_ns: u64,
    /// The timer expirations it stands for (1 + the signal's overrun).
    weight: u32,
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
    known: FxHashMap<BlockId, Known>,
    /// A moved version's current block → the block it is known by.
    aliases: FxHashMap<BlockId, BlockId>,
    /// Loaded images, and unloaded ones a handler may still have found.
    images: Vec<KnownImage>,
    /// The names of the image methods samples named, by method id (empty:
    /// none), kept for the profile after their image is forgotten.
    image_names: FxHashMap<u64, String>,
    /// Where versions are and were, by start, oldest first: the current
    /// placement of every known version, and each one it left (freed or
    /// moved away) until its grace period ends and no waiting sample holds
    /// its bytes.
    occupants: BTreeMap<usize, Vec<Placement>>,
    /// The largest placement's size: how far below an address a placement
    /// that holds it can start.
    max_size: u64,
    /// Placements left, in tag order (the tags only grow): start, key, tag.
    leaving: VecDeque<(usize, BlockId, u64)>,
    methods: Vec<MethodVersion>,
    stacks: FxHashMap<Vec<FrameKey>, u64>,
    pending: Vec<Pending>,
    samples: u64,
    /// Timer expirations the samples stand for (each 1 + its overrun).
    periods: u64,
    unattributed: u64,
    /// Samples that gave up waiting for a JIT version the collector never
    /// heard of ([`RETRIES`]): a frame in them counts as unattributed.
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
                    freed_ns: None,
                });
                max_size = max_size.max(size);
                (
                    key,
                    Known {
                        info,
                        start,
                        size,
                        method: None,
                        freed: None,
                        placements: 1,
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
            aliases: FxHashMap::default(),
            images: images
                .into_iter()
                .map(|image| KnownImage {
                    image,
                    unloaded: None,
                })
                .collect(),
            image_names: FxHashMap::default(),
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
            ns_per_tick: 1.0,
            window: None,
            names: NativeNames::default(),
            scratch: Vec::new(),
            same_native: Vec::new(),
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
        let mut drained = Vec::with_capacity(waiting);
        for (index, record) in records.iter().enumerate() {
            // SAFETY: the caller holds the collector lock: the one consumer.
            unsafe {
                record.samples.drain(|h, frames| {
                    self.handler_ns += h.end_ns.saturating_sub(h.begin_ns);
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
        // drained above, but for a moved method's new copy found in the
        // moment before its move's event was sent (it waits for the next
        // pass: `placed_at`).
        manager.listeners().flush();
        for entry in std::mem::take(&mut *log.events.lock()) {
            self.apply(entry);
        }
        self.settle(drained, safe);
    }

    /// The rest of a pass, once the events sent so far are applied: names
    /// the samples `drained` and those still waiting (a sample that cannot
    /// be named yet waits for the next pass), forgets what no sample can
    /// name any more once `safe` ([`Collector::forget`]), and merges retired
    /// versions past the cap.
    fn settle(&mut self, drained: Vec<Pending>, safe: u64) {
        let mut waiting = std::mem::take(&mut self.pending);
        waiting.extend(drained);
        // Read once a pass: how long each waiting sample has waited.
        let now_ns = crate::events::monotonic_ns();
        for mut sample in waiting {
            if !self.add(&sample, now_ns) {
                sample.attempts += 1;
                self.pending.push(sample);
            }
        }
        self.forget(safe);
        if self.methods.len() > self.merge_at {
            self.merge_retired();
            self.merge_at = self
                .max_versions
                .max(self.methods.len() + self.max_versions / 2);
        }
    }

    /// Forgets what no sample can name any more: placements left before
    /// `safe` (every sample that ran in them was drained before this pass),
    /// unless a waiting sample has a frame in their bytes; then the freed
    /// versions with no placement left, their aliases, and unloaded images
    /// (when no sample waits: an image frame names no placement).
    fn forget(&mut self, safe: u64) {
        // The addresses waiting samples may still be named by.
        let mut held: Vec<usize> = self
            .pending
            .iter()
            .flat_map(|s| &s.frames)
            .filter_map(|f| match f.kind {
                FrameKind::Jit => Some(f.key as usize),
                FrameKind::Unattributed => Some(f.addr),
                _ => None,
            })
            .flat_map(|a| [a, a.saturating_sub(1)])
            .collect();
        held.sort_unstable();
        let holds = |start: usize, size: u64| {
            let i = held.partition_point(|&a| a < start);
            held.get(i)
                .is_some_and(|&a| ((a - start) as u64) < size.max(1))
        };
        let mut kept = VecDeque::new();
        while let Some(&(start, key, tag)) = self.leaving.front() {
            if tag >= safe {
                break;
            }
            self.leaving.pop_front();
            let Some(list) = self.occupants.get_mut(&start) else {
                continue;
            };
            let Some(at) = list
                .iter()
                .position(|p| p.key == key && p.left == Some(tag))
            else {
                continue;
            };
            if holds(start, list[at].size) {
                kept.push_back((start, key, tag));
                continue;
            }
            list.remove(at);
            if list.is_empty() {
                self.occupants.remove(&start);
            }
            // A freed version has no alias left (its free took it): it goes
            // with its last placement.
            if let Some(k) = self.known.get_mut(&key) {
                k.placements -= 1;
                if k.placements == 0 && k.freed.is_some() {
                    self.known.remove(&key);
                }
            }
        }
        // Held ones are looked at again next pass, first.
        while let Some(entry) = kept.pop_back() {
            self.leaving.push_front(entry);
        }
        if self.pending.is_empty() {
            self.images
                .retain(|k| k.unloaded.is_none_or(|tag| tag >= safe));
        }
    }

    /// Marks `key`'s placement at `start` as left at `tag` (and freed at
    /// `freed_ns`, for a free).
    fn leave(&mut self, start: usize, key: BlockId, tag: u64, freed_ns: Option<u64>) {
        let current = self.occupants.get_mut(&start).and_then(|list| {
            list.iter_mut()
                .rev()
                .find(|p| p.key == key && p.left.is_none())
        });
        if let Some(p) = current {
            p.left = Some(tag);
            p.freed_ns = freed_ns;
            self.leaving.push_back((start, key, tag));
        }
    }

    /// Files a new placement of `key`.
    fn place(&mut self, start: usize, size: u64, placed_ns: u64, key: BlockId) {
        self.occupants.entry(start).or_default().push(Placement {
            size,
            placed_ns,
            key,
            left: None,
            freed_ns: None,
        });
        self.max_size = self.max_size.max(size);
    }

    /// Merges versions the collector has forgotten, first sampled first,
    /// into one entry per tier, until the profile names half its cap of
    /// versions (or none is left to merge). A forgotten version can name no
    /// later sample, so only counts change hands. Versions still known, or
    /// named by a kept sample not yet taken, stay as they are.
    fn merge_retired(&mut self) {
        let mut held: FxHashSet<usize> = self.known.values().filter_map(|k| k.method).collect();
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
        let rekey = |stacks: &mut FxHashMap<Vec<FrameKey>, u64>| {
            let mut merged: FxHashMap<Vec<FrameKey>, u64> =
                FxHashMap::with_capacity_and_hasher(stacks.len(), Default::default());
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
            // A block published while the agent started is both listed and
            // announced: it is placed once (a block id is never reused, so
            // a known one is that block).
            LogEntry::Loaded { block: key, .. } if self.known.contains_key(&key) => {}
            LogEntry::Loaded {
                block: key,
                info,
                start,
                size,
                at_ns,
            } => {
                self.place(start, size, at_ns, key);
                self.known.insert(
                    key,
                    Known {
                        info,
                        start,
                        size,
                        method: None,
                        freed: None,
                        placements: 1,
                    },
                );
            }
            LogEntry::Moved {
                from,
                to,
                start,
                at_ns,
                tag,
            } => {
                let key = self.aliases.remove(&from).unwrap_or(from);
                if self.known.contains_key(&to) {
                    // Moved while the agent started: the listing already
                    // holds the new block, as the same version. The old
                    // copy leaves (and its entry goes with it once safe);
                    // the listed one stays, freed by its own block's event.
                    if let Some(k) = self.known.get_mut(&key) {
                        k.freed = Some(tag);
                        let old = k.start;
                        self.leave(old, key, tag, None);
                    }
                    return;
                }
                if let Some(k) = self.known.get_mut(&key) {
                    let (old, size) = (k.start, k.size);
                    k.start = start;
                    k.placements += 1;
                    // The old copy stays a placement of the version until
                    // the move's grace period ends: a thread may still run
                    // it, and its samples name the moved method.
                    self.leave(old, key, tag, None);
                    self.place(start, size, at_ns, key);
                    self.aliases.insert(to, key);
                }
            }
            LogEntry::Freed { block, tag, at_ns } => {
                let key = self.aliases.remove(&block).unwrap_or(block);
                if let Some(k) = self.known.get_mut(&key) {
                    k.freed = Some(tag);
                    let start = k.start;
                    self.leave(start, key, tag, Some(at_ns));
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
            // By identity, not base: a newer image may sit at the same base
            // (unloaded and loaded again while the agent started).
            LogEntry::ImageUnloaded { id, tag } => {
                for k in &mut self.images {
                    if k.image.id() == id && k.unloaded.is_none() {
                        k.unloaded = Some(tag);
                    }
                }
            }
        }
    }

    /// The version a handler found at `start` in a sample that began at
    /// `begin_ns` and ended at `end_ns`: the one placed there last before
    /// the end, but not one freed before the beginning (the handler found
    /// a block the maps still held). A move's event is sent just after its
    /// new copy became visible, so a sample may find the new copy before
    /// the collector knows it: then no placement answers (the sample waits
    /// for the event), rather than a freed one placed there earlier.
    fn placed_at(&self, start: usize, begin_ns: u64, end_ns: u64) -> Option<BlockId> {
        self.occupants
            .get(&start)?
            .iter()
            .filter(|p| p.placed_ns <= end_ns && p.freed_ns.is_none_or(|f| begin_ns < f))
            .max_by_key(|p| p.placed_ns)
            .map(|p| p.key)
    }

    /// The version whose bytes held `addr` when a sample that ended at
    /// `end_ns` ran there, where its handler named nothing, and where that
    /// version started: the one placed last before then over `addr`. The
    /// handler names nothing in a version freed or moved away (its bytes
    /// stay until its executors pass a quiescent point, but the maps no
    /// longer know them), and in a version-1 method deeper than its scan.
    /// The placements over `addr` start at most `max_size` below it.
    fn occupant_at(&self, addr: usize, end_ns: u64) -> Option<(BlockId, usize)> {
        let lowest = addr.saturating_sub(self.max_size as usize);
        self.occupants
            .range(lowest..=addr)
            .flat_map(|(&start, list)| list.iter().map(move |p| (start, p)))
            .filter(|(start, p)| ((addr - start) as u64) < p.size && p.placed_ns <= end_ns)
            .max_by_key(|(_, p)| p.placed_ns)
            .map(|(start, p)| (p.key, start))
    }

    /// Aggregates one sample; false if a frame in it cannot be named yet
    /// and it has retries left ([`RETRIES`]). Past them a JIT frame whose
    /// version the collector never heard of counts as unattributed (and the
    /// sample as one that gave up), an unattributed frame that may be in
    /// freed code stays unattributed, and an image method stays unnamed.
    /// `now_ns` is the pass's time, against which the sample's wait is
    /// measured ([`WAIT_NS`]).
    fn add(&mut self, sample: &Pending, now_ns: u64) -> bool {
        // The previous sample's buffer: a stack already counted costs no
        // allocation (a sample that must wait drops it, rarely).
        let mut keys = std::mem::take(&mut self.scratch);
        keys.clear();
        let mut kept = Vec::new();
        let mut gave_up = false;
        let may_wait = sample.attempts < RETRIES || now_ns.saturating_sub(sample.end_ns) < WAIT_NS;
        let unattributed_at = |addr| (FrameKey::Unattributed, SampleFrame::Unattributed { addr });
        for f in &sample.frames {
            let (key, frame) = match f.kind {
                FrameKind::Jit => {
                    let found = self.placed_at(f.key as usize, sample.begin_ns, sample.end_ns);
                    match found.and_then(|key| self.method_of(key)) {
                        Some(method) => (
                            FrameKey::Jit(method),
                            SampleFrame::Jit {
                                addr: f.addr,
                                method,
                                offset: f.offset,
                            },
                        ),
                        None if may_wait => return false,
                        None => {
                            gave_up = true;
                            unattributed_at(f.addr)
                        }
                    }
                }
                FrameKind::Image => {
                    let at = if keys.is_empty() {
                        f.addr
                    } else {
                        f.addr.saturating_sub(1)
                    };
                    if !self.name_image_method(at, f.key, may_wait) {
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
                    FrameKey::Native(self.native_id(keys.len(), f.addr)),
                    SampleFrame::Native { addr: f.addr },
                ),
                FrameKind::Unattributed => {
                    let at = if keys.is_empty() {
                        f.addr
                    } else {
                        f.addr.saturating_sub(1)
                    };
                    let found = self
                        .occupant_at(at, sample.end_ns)
                        .map(|(key, start)| (self.method_of(key), start));
                    match found {
                        Some((Some(method), start)) => (
                            FrameKey::Jit(method),
                            SampleFrame::Jit {
                                addr: f.addr,
                                method,
                                offset: (at - start) as u32,
                            },
                        ),
                        _ if may_wait => return false,
                        // A placement whose version is not known.
                        Some((None, _)) => {
                            gave_up = true;
                            unattributed_at(f.addr)
                        }
                        None => unattributed_at(f.addr),
                    }
                }
            };
            keys.push(key);
            if self.keep {
                kept.push(frame);
            }
        }
        let weight = u64::from(sample.weight);
        self.samples += 1;
        self.periods += weight;
        self.gave_up += u64::from(gave_up);
        let unattributed = keys.first() == Some(&FrameKey::Unattributed);
        self.unattributed += u64::from(unattributed);
        if let Some(w) = &mut self.window
            && (w.begin_ns..=w.end_ns).contains(&sample.end_ns)
        {
            w.samples += 1;
            w.periods += weight;
            w.unattributed += u64::from(unattributed);
            w.gave_up += u64::from(gave_up);
            count_stack(&mut w.stacks, &keys, weight);
        }
        count_stack(&mut self.stacks, &keys, weight);
        self.scratch = keys;
        if self.keep {
            self.kept_samples.push(Sample {
                tid: sample.tid,
                begin_ns: sample.begin_ns,
                end_ns: sample.end_ns,
                weight: sample.weight,
                frames: kept,
            });
        }
        true
    }

    /// The chain of names of native frame `addr` at depth `depth` (the
    /// leaf at 0; deeper frames are return addresses). Samples of one
    /// thread share most of their native frames, at the same depths, so the
    /// pass remembers the last address and id at each depth
    /// ([`Collector::same_native`]) and looks up only what differs.
    fn native_id(&mut self, depth: usize, addr: usize) -> usize {
        if let Some(&Some((seen, id))) = self.same_native.get(depth)
            && seen == addr
        {
            return id;
        }
        let id = self.names.id(addr, depth != 0);
        if depth >= self.same_native.len() {
            self.same_native.resize(depth + 1, None);
        }
        self.same_native[depth] = Some((addr, id));
        id
    }

    /// Learns the name of image method `id`, found at `at`, from the image
    /// that holds it (the newest first: an unloaded image may share its
    /// base). False while its image may not be known yet (its load event
    /// can follow the first samples in it by a pass); once the sample may
    /// wait no longer ([`RETRIES`]), the method stays unnamed.
    fn name_image_method(&mut self, at: usize, id: u64, may_wait: bool) -> bool {
        if self.image_names.contains_key(&id) {
            return true;
        }
        let name = self.images.iter().rev().find_map(|k| k.name_at(at, id));
        match name {
            Some(name) => {
                self.image_names.insert(id, name.to_owned());
                true
            }
            None => !may_wait,
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
                    record.recount_end(rows.end, StackEnd::NoUnwindInfo, sample.weight);
                }
            }
        }
    }

    /// The finished profile. Samples still waiting for their versions are
    /// counted as unattributed; native frames are symbolized here.
    pub(crate) fn finish(mut self, base: Profile) -> Profile {
        for sample in std::mem::take(&mut self.pending) {
            self.samples += 1;
            self.periods += u64::from(sample.weight);
            self.unattributed += 1;
            self.gave_up += 1;
            let keys = sample
                .frames
                .iter()
                .map(|_| FrameKey::Unattributed)
                .collect();
            *self.stacks.entry(keys).or_default() += u64::from(sample.weight);
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
        let stacks = named_stacks(&self.methods, &self.image_names, &self.names, &self.stacks);
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
            periods: w.periods,
            taken: w.samples,
            unattributed: w.unattributed,
            gave_up: w.gave_up,
            stacks,
            methods,
            ..Profile::default()
        })
    }
}

/// Adds `weight` to `keys`' count, copying the keys only for a new stack.
fn count_stack(stacks: &mut FxHashMap<Vec<FrameKey>, u64>, keys: &[FrameKey], weight: u64) {
    match stacks.get_mut(keys) {
        Some(count) => *count += weight,
        None => {
            stacks.insert(keys.to_vec(), weight);
        }
    }
}

/// The stacks of `keys` by name, most samples first: JIT frames by their
/// version's label, image methods by their name (`[image method <id>]` if
/// they have none), native frames by their chain of names (see
/// [`super::symbols`]).
fn named_stacks(
    methods: &[MethodVersion],
    image_names: &FxHashMap<u64, String>,
    names: &NativeNames,
    keys: &FxHashMap<Vec<FrameKey>, u64>,
) -> Vec<Stack> {
    let mut named: FxHashMap<Vec<String>, u64> = FxHashMap::default();
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
                tag: at_ns,
            });
        }
        assert_eq!(c.aliases.get(&block(3)), Some(&block(1)));
        assert_eq!(c.aliases.len(), 1);
        c.apply(LogEntry::Freed {
            block: block(3),
            tag: 99,
            at_ns: u64::MAX,
        });
        let known = &c.known[&block(1)];
        assert_eq!((known.start, known.freed), (0x3000, Some(99)));
        assert!(c.aliases.is_empty());
        for (start, at_ns) in [(0x1000, 5), (0x2000, 15), (0x3000, 25)] {
            assert_eq!(
                c.placed_at(start, at_ns, at_ns),
                Some(block(1)),
                "{start:#x}"
            );
            assert_eq!(
                c.occupant_at(start + 8, at_ns),
                Some((block(1), start)),
                "{start:#x}"
            );
        }
        let m = c.method_of(block(1)).unwrap();
        assert_eq!(
            (c.methods[m].method_id, c.methods[m].name.as_str()),
            (42, "m")
        );
        // Every placement left; once their tags are safe, all is forgotten.
        assert_eq!(c.leaving.len(), 3);
        c.forget(100);
        assert!(c.occupants.is_empty() && c.known.is_empty() && c.leaving.is_empty());
        // A free of a block never known changes nothing.
        c.apply(LogEntry::Freed {
            block: block(8),
            tag: 100,
            at_ns: u64::MAX,
        });
        assert!(c.known.is_empty() && c.occupants.is_empty());
    }

    /// A block published while the agent started is both in the listing and
    /// announced by its load event: it is placed once, and forgotten whole
    /// after its free. (On the old code the event placed it a second time,
    /// and that placement never left: `occupants` kept it for good.)
    #[test]
    fn a_block_listed_and_announced_is_placed_once() {
        let key = BlockId {
            heap: 2,
            generation: 1,
        };
        let info = Arc::new(CodeInfo::new(7, "k", JitKind::Baseline));
        let mut c = Collector::new(
            false,
            16,
            [(Arc::clone(&info), key, 0x1000, 64)],
            Vec::new(),
        );
        c.apply(LogEntry::Loaded {
            block: key,
            info,
            start: 0x1000,
            size: 64,
            at_ns: 5,
        });
        assert_eq!(c.occupants[&0x1000].len(), 1);
        assert_eq!(c.known[&key].placements, 1);
        c.apply(LogEntry::Freed {
            block: key,
            tag: 9,
            at_ns: u64::MAX,
        });
        c.forget(10);
        assert!(c.occupants.is_empty() && c.known.is_empty() && c.leaving.is_empty());
    }

    /// A block published and then moved while the agent started: the
    /// listing holds its new block, the log its load and its move. Each
    /// copy is placed once, and after the free everything is forgotten.
    /// (Before, the move placed the new block's bytes a second time, and
    /// the listed entry was never freed.)
    #[test]
    fn a_block_moved_while_the_agent_started_is_forgotten_after_its_free() {
        let block = |generation| BlockId {
            heap: 2,
            generation,
        };
        let info = Arc::new(CodeInfo::new(7, "k", JitKind::Baseline));
        let mut c = Collector::new(
            false,
            16,
            [(Arc::clone(&info), block(2), 0x2000, 64)],
            Vec::new(),
        );
        c.apply(LogEntry::Loaded {
            block: block(1),
            info,
            start: 0x1000,
            size: 64,
            at_ns: 5,
        });
        c.apply(LogEntry::Moved {
            from: block(1),
            to: block(2),
            start: 0x2000,
            at_ns: 6,
            tag: 7,
        });
        assert_eq!(
            (c.occupants[&0x1000].len(), c.occupants[&0x2000].len()),
            (1, 1)
        );
        c.apply(LogEntry::Freed {
            block: block(2),
            tag: 9,
            at_ns: u64::MAX,
        });
        c.forget(10);
        assert!(c.occupants.is_empty() && c.known.is_empty() && c.leaving.is_empty());
        assert!(c.aliases.is_empty());
    }

    /// A drained sample whose only frame is `kind` at `addr` (`key`: a JIT
    /// frame's start), ended at `end_ns`.
    fn one_frame(kind: FrameKind, addr: usize, key: u64, end_ns: u64) -> Pending {
        Pending {
            attempts: 0,
            native: None,
            tid: 1,
            begin_ns: end_ns,
            end_ns,
            weight: 1,
            frames: vec![RawFrame {
                kind,
                addr,
                key,
                offset: 0,
            }],
        }
    }

    /// A host that churns versions while a steady stream of samples waits
    /// to be named (frames nothing names yet): each freed version is
    /// forgotten once its grace period has passed, unless a waiting sample
    /// has a frame in its bytes. (On the old code nothing was forgotten
    /// while any sample waited: 1,000 versions stayed.)
    #[test]
    fn freed_versions_are_forgotten_while_other_samples_wait() {
        let block = |generation| BlockId {
            heap: 3,
            generation,
        };
        let mut c = Collector::new(false, 16, [], Vec::new());
        for g in 0..1000u64 {
            let start = 0x10_0000 + 0x100 * (g as usize % 4);
            c.apply(LogEntry::Loaded {
                block: block(g),
                info: Arc::new(CodeInfo::new(g, format!("v{g}"), JitKind::Baseline)),
                start,
                size: 64,
                at_ns: 10 * g,
            });
            c.apply(LogEntry::Freed {
                block: block(g),
                tag: g,
                at_ns: u64::MAX,
            });
            // Always one sample waiting, in a big method's bytes elsewhere
            // (a version-1 frame too deep for the handler's scan).
            c.pending = vec![one_frame(FrameKind::Unattributed, 0x90_0000, 0, 10 * g)];
            c.forget(g + 1);
        }
        assert_eq!((c.known.len(), c.occupants.len()), (0, 0));
        // A waiting sample in a freed version's bytes holds that version.
        c.apply(LogEntry::Loaded {
            block: block(5000),
            info: Arc::new(CodeInfo::new(9, "held", JitKind::Baseline)),
            start: 0x20_0000,
            size: 64,
            at_ns: 20_000,
        });
        c.apply(LogEntry::Freed {
            block: block(5000),
            tag: 2000,
            at_ns: u64::MAX,
        });
        c.pending = vec![one_frame(FrameKind::Unattributed, 0x20_0010, 0, 20_001)];
        c.forget(3000);
        assert_eq!(
            c.occupant_at(0x20_0010, 20_001),
            Some((block(5000), 0x20_0000))
        );
        c.pending.clear();
        c.forget(3000);
        assert_eq!((c.known.len(), c.occupants.len()), (0, 0));
    }

    /// A host that compacts 1,000 live methods 1,000 times: the collector
    /// keeps one placement and one alias per method once each move's grace
    /// period has passed. (On the old code each move left a placement
    /// behind for as long as the method lived: a million.)
    #[test]
    fn compacting_live_methods_keeps_one_placement_each() {
        let mut c = Collector::new(false, 16, [], Vec::new());
        let mut generation = 0u64;
        let mut block = || {
            generation += 1;
            BlockId {
                heap: 4,
                generation,
            }
        };
        let mut current: Vec<BlockId> = Vec::new();
        for m in 0..1000usize {
            let b = block();
            c.apply(LogEntry::Loaded {
                block: b,
                info: Arc::new(CodeInfo::new(m as u64, "m", JitKind::Optimized)),
                start: 0x100_0000 + 0x40 * m,
                size: 0x40,
                at_ns: 1,
            });
            current.push(b);
        }
        let mut tag = 0;
        for round in 1..=1000usize {
            for (m, from) in current.iter_mut().enumerate() {
                let to = block();
                tag += 1;
                c.apply(LogEntry::Moved {
                    from: *from,
                    to,
                    start: 0x100_0000 + 0x40 * m + (round % 2) * 0x10_0000,
                    at_ns: 1 + round as u64,
                    tag,
                });
                *from = to;
            }
            c.forget(tag + 1);
            let placements: usize = c.occupants.values().map(Vec::len).sum();
            assert_eq!(
                (placements, c.aliases.len(), c.known.len()),
                (1000, 1000, 1000)
            );
        }
    }

    /// A sample in the old copy of a moved method, taken after the move,
    /// names the moved method at the old copy's offset, until the move's
    /// grace period ends; never a version that held those bytes before.
    /// (On the old code only current starts were searched: the frame was
    /// unattributed, or named the earlier version.)
    #[test]
    fn a_sample_in_a_moved_methods_old_copy_names_it() {
        let block = |generation| BlockId {
            heap: 5,
            generation,
        };
        let mut c = Collector::new(false, 16, [], Vec::new());
        let load = |c: &mut Collector, g, name: &str, at_ns| {
            c.apply(LogEntry::Loaded {
                block: block(g),
                info: Arc::new(CodeInfo::new(g, name, JitKind::Optimized)),
                start: 0x4000,
                size: 0x80,
                at_ns,
            });
        };
        load(&mut c, 1, "earlier", 10);
        c.apply(LogEntry::Freed {
            block: block(1),
            tag: 1,
            at_ns: u64::MAX,
        });
        load(&mut c, 2, "moved", 20);
        c.apply(LogEntry::Moved {
            from: block(2),
            to: block(3),
            start: 0x8000,
            at_ns: 30,
            tag: 2,
        });
        // Held in the old copy at 40 ns, after the move.
        c.pending = vec![one_frame(FrameKind::Unattributed, 0x4010, 0, 40)];
        c.forget(2);
        let sample = std::mem::take(&mut c.pending).remove(0);
        assert!(c.add(&sample, u64::MAX));
        let (keys, _) = c.stacks.iter().next().unwrap();
        let FrameKey::Jit(m) = keys[0] else {
            panic!("{keys:?}")
        };
        assert_eq!(c.methods[m].name, "moved");
        // Past the move's grace period the old copy is forgotten; the
        // method, live at its new start, is not.
        c.forget(3);
        assert_eq!(c.occupant_at(0x4010, 40), None);
        assert_eq!(c.occupant_at(0x8010, 40), Some((block(2), 0x8000)));
    }

    /// A move's old copy leaves at the tag the heap took after unpublishing
    /// it (the event's), not at one the listener takes when the event
    /// reaches it, which may be before the unpublish (then a handler pinned
    /// later still finds the old copy, and the collector, having forgotten
    /// its placement once that earlier tag was safe, never names it).
    #[test]
    fn a_moves_old_copy_leaves_at_the_tag_the_heap_retired_it_at() {
        let manager = ExecutionManager::new(2);
        for _ in 0..5 {
            manager.domain().retire_tag();
        }
        let log = Arc::new(EventLog::default());
        let listener = EventListener {
            log: Arc::clone(&log),
            manager: manager.clone(),
        };
        let block = |generation| BlockId {
            heap: 1,
            generation,
        };
        listener.on_event(&CodeEvent::Move(crate::events::CodeMove {
            timestamp: 30,
            tid: 7,
            old_block: block(1),
            new_block: block(2),
            old_start: 0x4000,
            new_start: 0x8000,
            size: 0x80,
            info: Arc::new(CodeInfo::new(1, "moved", JitKind::Optimized)),
            retire_tag: 2,
        }));
        let events = std::mem::take(&mut *log.events.lock());
        let [
            LogEntry::Moved {
                from,
                to,
                start,
                at_ns,
                tag,
            },
        ] = events.as_slice()
        else {
            panic!("one move expected");
        };
        assert_eq!(
            (*from, *to, *start, *at_ns, *tag),
            (block(1), block(2), 0x8000, 30, 2)
        );
    }

    /// A sample whose signal the kernel coalesced with others counts each
    /// expiration: its stack, the periods and the coalesced count grow by
    /// its weight; the samples by one.
    #[test]
    fn a_coalesced_signal_counts_every_period_it_stands_for() {
        let mut c = Collector::new(true, 16, [], Vec::new());
        c.open_window(0);
        let plain = one_frame(FrameKind::Native, 0x10, 0, 5);
        let coalesced = Pending {
            weight: 4,
            ..one_frame(FrameKind::Native, 0x10, 0, 6)
        };
        assert!(c.add(&plain, u64::MAX) && c.add(&coalesced, u64::MAX));
        assert_eq!((c.samples, c.periods), (2, 5));
        assert_eq!(c.stacks.values().copied().collect::<Vec<_>>(), [5]);
        assert_eq!(
            c.kept_samples.iter().map(|s| s.weight).collect::<Vec<_>>(),
            [1, 4]
        );
        let window = c.take_window(std::time::Duration::from_secs(1)).unwrap();
        assert_eq!(
            (window.samples, window.periods, window.coalesced()),
            (2, 5, 3)
        );
        assert_eq!(window.stacks[0].count, 5);
        let profile = c.finish(Profile::default());
        assert_eq!(
            (profile.samples, profile.periods, profile.coalesced()),
            (2, 5, 3)
        );
        assert_eq!(profile.summary()[0].self_share, 1.0);
    }

    /// An image unloaded while the agent started, and another loaded at
    /// its base: the unload names the first by identity, so the second,
    /// listed at the start and announced again, stays known. (On the old
    /// code the unload, by base, marked the second unloaded.)
    #[test]
    fn an_unload_at_a_base_does_not_unload_the_newer_image_there() {
        let first = image(0x7000_0000, 1, "old");
        let second = image(0x7000_0000, 2, "new");
        let mut c = Collector::new(false, 16, [], vec![Arc::clone(&second)]);
        c.apply(LogEntry::ImageUnloaded {
            id: first.id(),
            tag: 1,
        });
        c.apply(LogEntry::ImageLoaded(Arc::clone(&second)));
        assert_eq!(c.images.len(), 1);
        assert_eq!(c.images[0].unloaded, None);
        c.forget(u64::MAX);
        assert!(c.name_image_method(0x7000_0010, 2, true));
        assert_eq!(c.image_names[&2], "new");
    }

    /// A sample whose JIT frame names a version the collector never heard
    /// of, beside an unloaded image: it waits two passes for the version's
    /// load event, then counts, its frame unattributed, as a sample that
    /// gave up; and then the image, no longer held by a waiting sample, is
    /// forgotten. (On the old code the sample waited for good, and the
    /// image was never forgotten.)
    #[test]
    fn a_sample_of_a_version_never_heard_of_gives_up_on_its_third_pass() {
        let unloaded = image(0x7000_0000, 1, "gone");
        let mut c = Collector::new(false, 16, [], vec![Arc::clone(&unloaded)]);
        c.apply(LogEntry::ImageUnloaded {
            id: unloaded.id(),
            tag: 1,
        });
        let unknown = one_frame(FrameKind::Jit, 0x50_0010, 0x50_0000, 5);
        c.settle(vec![unknown], u64::MAX);
        c.settle(Vec::new(), u64::MAX);
        // Still waiting after two passes, and holding the image.
        assert_eq!((c.pending.len(), c.images.len()), (1, 1));
        c.settle(Vec::new(), u64::MAX);
        assert_eq!((c.pending.len(), c.images.len()), (0, 0));
        assert_eq!((c.samples, c.unattributed, c.gave_up), (1, 1, 1));
        assert_eq!(
            c.stacks
                .iter()
                .map(|(k, &n)| (k.clone(), n))
                .collect::<Vec<_>>(),
            [(vec![FrameKey::Unattributed], 1)]
        );
    }

    /// A sample that found a moved method's new copy before the move's
    /// event came (the heap sends it just after the copy is visible) is
    /// not named by a version freed at that start before the sample began:
    /// it waits, and the event names it. A sample that ended less than
    /// [`WAIT_NS`] ago keeps waiting past its passes. (Before, the freed
    /// version's placement answered, and the sample was billed to it.)
    #[test]
    fn a_sample_in_a_new_copy_waits_for_its_move_not_for_a_freed_version() {
        let b = |generation| BlockId {
            heap: 5,
            generation,
        };
        let mut c = Collector::new(false, 16, [], Vec::new());
        let load = |c: &mut Collector, g, name: &str, start, at_ns| {
            c.apply(LogEntry::Loaded {
                block: b(g),
                info: Arc::new(CodeInfo::new(g, name, JitKind::Optimized)),
                start,
                size: 0x80,
                at_ns,
            });
        };
        load(&mut c, 1, "earlier", 0x8000, 10);
        c.apply(LogEntry::Freed {
            block: b(1),
            tag: 1,
            at_ns: 15,
        });
        load(&mut c, 2, "moved", 0x4000, 20);
        // Moved to 0x8000 at 30, sampled there from 40 (the sample began
        // after the free), before the move's event.
        let mut sample = one_frame(FrameKind::Jit, 0x8010, 0x8000, 45);
        sample.begin_ns = 40;
        c.settle(vec![sample], 0);
        assert_eq!((c.pending.len(), c.samples), (1, 0));
        // A sample that began before the free may have found the freed
        // version: it names it.
        let mut before = one_frame(FrameKind::Jit, 0x8010, 0x8000, 14);
        before.begin_ns = 12;
        c.settle(vec![before], 0);
        c.apply(LogEntry::Moved {
            from: b(2),
            to: b(3),
            start: 0x8000,
            at_ns: 30,
            tag: 2,
        });
        c.settle(Vec::new(), 0);
        assert_eq!((c.pending.len(), c.samples), (0, 2));
        let mut named: Vec<&str> = c
            .stacks
            .keys()
            .map(|keys| {
                let FrameKey::Jit(m) = keys[0] else {
                    panic!("{keys:?}")
                };
                c.methods[m].name.as_str()
            })
            .collect();
        named.sort();
        assert_eq!(named, ["earlier", "moved"]);
        // A sample of unknown code that ended just now waits past its
        // passes: its event may still be on its way.
        let now = crate::events::monotonic_ns();
        c.settle(vec![one_frame(FrameKind::Jit, 0xA010, 0xA000, now)], 0);
        c.settle(Vec::new(), 0);
        c.settle(Vec::new(), 0);
        assert_eq!((c.pending.len(), c.pending[0].attempts), (1, 3));
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
            weight: 1,
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
        assert!(c.add(&image_sample(1, base + 0x10, base + 0x40), u64::MAX));
        assert!(c.add(&image_sample(2, base + 0x3f, base + 0x11), u64::MAX));
        // A method id no image has there waits two passes for its image,
        // then stays unnamed.
        let mut unknown = image_sample(3, base + 0x20, base + 0x20);
        assert!(!c.add(&unknown, u64::MAX));
        unknown.attempts = 2;
        assert!(c.add(&unknown, u64::MAX));
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
            weight: 1,
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
