//! Naming samples: frame keys, the profile's versions (retired ones merged), stacks by name.

use rustc_hash::{FxHashMap, FxHashSet};

use crate::JitKind;
use crate::events::BlockId;
use crate::heap::StubKind;
use crate::manager::stub_frame_label;
use crate::manager::stub_names::{Names as StubNames, slot};

use crate::agent::profile::{MethodVersion, Sample, SampleFrame, Stack, version_labels};
use crate::agent::record::FrameKind;
use crate::agent::symbols::NativeNames;

use super::Collector;
use super::pending::{Pending, RETRIES, WAIT_NS};

/// A frame as aggregated: without offsets, native frames by address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum FrameKey {
    Jit(usize),
    Image(u64),
    Stub(u64),
    /// A native frame's chain of names ([`NativeNames`]).
    Native(usize),
    Unattributed,
}

impl Collector {
    /// Merges versions the collector has forgotten, first sampled first,
    /// into one entry per tier, until the profile names half its cap of
    /// versions (or none is left to merge). A forgotten version can name no
    /// later sample, so only counts change hands. Versions still known, or
    /// named by a kept sample not yet taken, stay as they are.
    pub(super) fn merge_retired(&mut self) {
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

    /// Aggregates one sample; false if a frame in it cannot be named yet
    /// and it has retries left ([`RETRIES`]). Past them a JIT frame whose
    /// version the collector never heard of counts as unattributed (and the
    /// sample as one that gave up), an unattributed frame that may be in
    /// freed code stays unattributed, and an image method stays unnamed.
    /// `now_ns` is the pass's time, against which the sample's wait is
    /// measured ([`WAIT_NS`]).
    pub(super) fn add(&mut self, sample: &Pending, now_ns: u64) -> bool {
        let may_wait = sample.attempts < RETRIES || now_ns.saturating_sub(sample.end_ns) < WAIT_NS;
        self.aggregate(sample, may_wait)
    }

    /// [`Collector::add`] with its wait decided: with `may_wait` false,
    /// every frame is taken as it is (the last pass, at `finish`).
    pub(super) fn aggregate(&mut self, sample: &Pending, may_wait: bool) -> bool {
        // The previous sample's buffer: a stack already counted costs no
        // allocation (a sample that must wait drops it, rarely).
        let mut keys = std::mem::take(&mut self.scratch);
        keys.clear();
        let mut kept = Vec::new();
        let mut gave_up = false;
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
            w.handler_ns += sample.end_ns.saturating_sub(sample.begin_ns);
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
    pub(super) fn name_image_method(&mut self, at: usize, id: u64, may_wait: bool) -> bool {
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
    pub(super) fn method_of(&mut self, key: BlockId) -> Option<usize> {
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
/// [`crate::agent::symbols`]).
pub(super) fn named_stacks(
    methods: &[MethodVersion],
    image_names: &FxHashMap<u64, String>,
    stub_names: &StubNames,
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
                FrameKey::Stub(kind) => frames.push(stub_frame_label(
                    kind as u8,
                    StubKind::new(kind as u8)
                        .and_then(|kind| stub_names[slot(kind)].as_ref())
                        .map_or(&[], std::slice::from_ref),
                )),
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
pub(super) fn label_versions(methods: &mut [MethodVersion]) {
    let labels = version_labels(methods.iter().map(|m| m.name.as_str()));
    for (m, label) in methods.iter_mut().zip(labels) {
        m.label = label;
    }
}
