//! Samples from the kernel, aggregated into the agent's profile: stacks of
//! named frames, JIT method placements, and the counts of what was dropped.

use std::collections::HashMap;

use jitmap::StubKindName;
use jitmap::agent::{Profile, Stack, version_labels};
use jitmap::remote::ManagerStubNames;

use super::event::{Frame, FrameKind, Identity, Sample};

/// A frame as aggregated: JIT methods by placement, native code by address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Key {
    Method(usize),
    Native {
        addr: u64,
        is_return: bool,
    },
    Stub(u64),
    Image(u64),
    /// An image method, by its method id.
    ImageMethod(u64),
    Nothing,
    TooFar,
    Error,
    /// Where a walk ended at an object whose rows were stale.
    StaleRows,
    /// Where a walk ended at a frame whose rows have no rule it can apply.
    NoRule,
    /// A walk that stepped a native frame in no object with rows by the
    /// frame pointer.
    UnknownCode,
    /// A CoreCLR method, by its placement in `dotnet`.
    Dotnet(usize),
    /// A CoreCLR code heap's stub block, by its kind.
    DotnetStub(u64),
    /// A CoreCLR stub range, by its range list and the generation of
    /// names.
    DotnetStubs(u64, u64),
    /// A ReadyToRun image, by its `Module` and the generation of module
    /// names (see [`Aggregator::forget_modules`]; what was queued for the
    /// old generation is dropped, not named from the new one).
    DotnetImage(u64, u64),
    /// A CoreCLR code address past the capped scan.
    DotnetTooFar,
}

/// The v1 scan's bound in the program (`V1_MAX_WORDS` in `profile.bpf.c`,
/// checked by a test), in nibble-map words of 256 code bytes. (`inspect`,
/// in user space, scans up to `jitmap::remote::V1_MAX_WORDS`, four times
/// as far.)
pub const DOTNET_SCAN_WORDS: u64 = 256;

/// A CoreCLR method the samples named, at one code start (a method
/// recompiled at another tier has another).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DotnetPlacement {
    /// Its `MethodDesc`.
    pub method_desc: u64,
    /// First code byte.
    pub start: u64,
    /// What named it while it ran, in a collectible assembly's code.
    pub identity: Option<Identity>,
    /// Its name, read from the process while it ran (empty: not read).
    pub name: String,
    /// The lowest and highest address looked up in it.
    pub lookups: (u64, u64),
    /// Frames that named it.
    pub frames: u64,
}

/// What the program met that user space names from the live process (see
/// [`Aggregator::take_unnamed`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Unnamed {
    /// CoreCLR placements: (index, `MethodDesc`, start, identity).
    pub methods: Vec<(usize, u64, u64, Option<Identity>)>,
    /// ReadyToRun `Module`s.
    pub modules: Vec<u64>,
    /// Stub range lists (`CodeRangeMapRangeList`).
    pub stub_lists: Vec<u64>,
}

/// The name of a CoreCLR `StubCodeBlockKind` (.NET 8's `codeman.h`).
fn stub_kind_name(kind: u64) -> String {
    let name = match kind {
        1 => "jump stub",
        2 => "precode",
        3 => "dynamic helper",
        4 => "stub precode",
        5 => "fixup precode",
        6 => "virtual dispatch stub",
        7 => "virtual resolve stub",
        8 => "virtual lookup stub",
        9 => "virtual vtable stub",
        _ => return format!("[.NET stub kind {kind}]"),
    };
    format!("[.NET {name}]")
}

/// One placement of a JIT method the samples named: where it was, what it
/// was, and the addresses sampled in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The heap's id.
    pub heap_id: u64,
    /// The runtime's method id.
    pub method_id: u64,
    /// First code byte.
    pub start: u64,
    /// Code size.
    pub size: u64,
    /// The name the kernel copied.
    pub name: String,
    /// The name used in stacks: the name, or with ` [vN]` when several
    /// placements of one name were sampled.
    pub label: String,
    /// Whether the kernel cut the name at its cap.
    pub truncated: bool,
    /// The lowest and highest address looked up in it.
    pub lookups: (u64, u64),
    /// Frames that named it.
    pub frames: u64,
}

/// Counts over every decoded sample and frame.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Samples in the profile.
    pub samples: u64,
    /// Samples dropped because the host changed a range map during the
    /// sample, or a heap during one of its frames' lookups.
    pub stale_samples: u64,
    /// Samples without a user stack (the thread was in the kernel with no
    /// user frames to take).
    pub empty_samples: u64,
    /// Samples whose innermost frame was in a heap but not in a method or
    /// stub (or too far, or unreadable).
    pub unattributed: u64,
    /// Samples in native code without a frame pointer called from a JIT
    /// method that the kernel's frame-pointer walk skipped: their stacks
    /// lack that caller (detected, not repaired; see the BPF program).
    pub frameless_leaf: u64,
    /// Samples whose walk ended at an object whose native rows were stale
    /// (another object mapped where the rows were loaded for): their
    /// stacks end in `[stale unwind rows]`.
    pub stale_rows: u64,
    /// Samples whose walk ended at a frame whose unwind rows have no rule
    /// the kernel can apply (a PLT stub's DWARF expression, or native code
    /// no FDE covers): their stacks end in `[no unwind rule]`.
    pub no_rule: u64,
    /// Samples whose walk stepped a native frame in no object with rows by
    /// the frame pointer: their stacks end in `[frame pointer through
    /// unknown code]`.
    pub unknown_code: u64,
    /// Frames, by what they were.
    pub native: u64,
    /// JIT method frames.
    pub methods: u64,
    /// Stub frames.
    pub stubs: u64,
    /// Image frames.
    pub images: u64,
    /// Frames in a heap but in no block.
    pub nothing: u64,
    /// v1 frames past the program's capped scan.
    pub too_far: u64,
    /// Stale frames (their samples are dropped).
    pub stale: u64,
    /// Frames whose lookup failed a read or a check.
    pub errors: u64,
    /// Reads of every frame's lookup.
    pub reads: u64,
    /// The most reads one frame's lookup made.
    pub max_reads: u64,
    /// Reads of frames in a JIT section (method, stub, nothing, too far).
    pub jit_reads: u64,
    /// Most reads of one such frame.
    pub max_jit_reads: u64,
}

impl Counts {
    /// Frames decoded.
    pub fn frames(&self) -> u64 {
        self.native
            + self.methods
            + self.stubs
            + self.images
            + self.nothing
            + self.too_far
            + self.stale
            + self.errors
    }

    /// Frames inside a range section.
    pub fn jit_frames(&self) -> u64 {
        self.frames() - self.native
    }
}

/// Builds the profile from decoded samples.
#[derive(Debug, Default)]
pub struct Aggregator {
    stacks: HashMap<Vec<Key>, u64>,
    placements: Vec<Placement>,
    /// Placements by (heap id, method id, start, size); names differ only
    /// when a placement was reused, so the list is almost always one long.
    index: HashMap<(u64, u64, u64, u64), Vec<usize>>,
    /// Image methods' names, by method id.
    image_names: HashMap<u64, String>,
    /// The host's names of its stub kinds, by kind: more than one when two
    /// managers named one kind differently (a sample does not say which
    /// manager's stub it was in).
    stub_names: HashMap<u8, Vec<StubKindName>>,
    /// Stub kinds a registered manager left unnamed while another named
    /// them: labelled by number only.
    unnamed_stub_kinds: std::collections::HashSet<u8>,
    /// Open CoreCLR placements, by (`MethodDesc`, start, identity) into
    /// `dotnet`.
    dotnet_index: HashMap<(u64, u64, Option<Identity>), usize>,
    dotnet: Vec<DotnetPlacement>,
    /// ReadyToRun `Module`s' assembly names, by module and generation.
    modules: HashMap<(u64, u64), String>,
    /// The generation of module names: a `Module` address seen after
    /// [`Aggregator::forget_modules`] is another key, named anew.
    module_generation: u64,
    /// Stub range lists' kinds, by list and generation.
    stub_lists: HashMap<(u64, u64), u64>,
    /// Placements, modules and stub lists not named yet.
    unnamed_methods: Vec<usize>,
    unnamed_modules: Vec<u64>,
    unnamed_lists: Vec<u64>,
    counts: Counts,
}

impl Aggregator {
    /// An empty aggregator.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one sample: dropped (and counted) if any frame is stale or it
    /// has no frames, else its stack counted.
    pub fn add(&mut self, sample: &Sample) {
        for f in &sample.frames {
            self.count_frame(f);
        }
        let c = &mut self.counts;
        if sample.stale || sample.frames.iter().any(|f| f.kind == FrameKind::Stale) {
            c.stale_samples += 1;
            return;
        }
        if sample.frames.is_empty() {
            c.empty_samples += 1;
            return;
        }
        c.samples += 1;
        if sample.frameless_leaf {
            c.frameless_leaf += 1;
        }
        if sample.stale_rows {
            c.stale_rows += 1;
        }
        if sample.no_rule {
            c.no_rule += 1;
        }
        if sample.unknown_code {
            c.unknown_code += 1;
        }
        if matches!(
            sample.frames[0].kind,
            FrameKind::Nothing | FrameKind::TooFar | FrameKind::Error | FrameKind::DotnetTooFar
        ) {
            c.unattributed += 1;
        }
        let mut keys: Vec<Key> = sample
            .frames
            .iter()
            .enumerate()
            .map(|(depth, f)| self.key(f, depth > 0))
            .collect();
        if sample.stale_rows {
            keys.push(Key::StaleRows);
        }
        if sample.no_rule {
            keys.push(Key::NoRule);
        }
        if sample.unknown_code {
            keys.push(Key::UnknownCode);
        }
        *self.stacks.entry(keys).or_default() += 1;
    }

    fn count_frame(&mut self, f: &Frame) {
        let c = &mut self.counts;
        let reads = u64::from(f.reads);
        c.reads += reads;
        c.max_reads = c.max_reads.max(reads);
        let slot = match f.kind {
            FrameKind::Native => &mut c.native,
            FrameKind::Method { .. } => &mut c.methods,
            FrameKind::Stub { .. } => &mut c.stubs,
            FrameKind::Image { .. } => &mut c.images,
            FrameKind::Nothing => &mut c.nothing,
            FrameKind::TooFar => &mut c.too_far,
            FrameKind::Stale => &mut c.stale,
            FrameKind::Error => &mut c.errors,
            FrameKind::DotnetMethod { .. } => &mut c.methods,
            FrameKind::DotnetStub { .. } | FrameKind::DotnetStubs { .. } => &mut c.stubs,
            FrameKind::DotnetImage { .. } => &mut c.images,
            FrameKind::DotnetTooFar => &mut c.too_far,
        };
        *slot += 1;
        if f.kind != FrameKind::Native {
            c.jit_reads += reads;
            c.max_jit_reads = c.max_jit_reads.max(reads);
        }
    }

    fn key(&mut self, f: &Frame, is_return: bool) -> Key {
        match &f.kind {
            FrameKind::Native => Key::Native {
                addr: f.ip,
                is_return,
            },
            FrameKind::Method {
                start,
                size,
                method_id,
                heap_id,
                name,
                truncated,
            } => {
                // The address the program looked up (a return address one
                // byte back, in its call).
                let at = if is_return { f.ip - 1 } else { f.ip };
                let same = self
                    .index
                    .entry((*heap_id, *method_id, *start, *size))
                    .or_default();
                let found = same
                    .iter()
                    .copied()
                    .find(|&i| self.placements[i].name == *name);
                let i = found.unwrap_or_else(|| {
                    self.placements.push(Placement {
                        heap_id: *heap_id,
                        method_id: *method_id,
                        start: *start,
                        size: *size,
                        name: name.clone(),
                        label: name.clone(),
                        truncated: *truncated,
                        lookups: (at, at),
                        frames: 0,
                    });
                    same.push(self.placements.len() - 1);
                    self.placements.len() - 1
                });
                let p = &mut self.placements[i];
                p.lookups = (p.lookups.0.min(at), p.lookups.1.max(at));
                p.frames += 1;
                Key::Method(i)
            }
            FrameKind::Stub { kind, .. } => Key::Stub(*kind),
            FrameKind::Image { begin, method } => match method {
                Some(m) => {
                    // The first name the kernel copied for the method.
                    self.image_names.entry(m.method_id).or_insert_with(|| {
                        match (m.name.is_empty(), m.truncated) {
                            (true, _) => format!("[image method {}]", m.method_id),
                            (false, true) => format!("{}...", m.name),
                            (false, false) => m.name.clone(),
                        }
                    });
                    Key::ImageMethod(m.method_id)
                }
                None => Key::Image(*begin),
            },
            FrameKind::Nothing => Key::Nothing,
            FrameKind::TooFar => Key::TooFar,
            FrameKind::Stale | FrameKind::Error => Key::Error,
            FrameKind::DotnetMethod {
                start,
                method_desc,
                identity,
            } => {
                let at = if is_return { f.ip - 1 } else { f.ip };
                let next = self.dotnet.len();
                // A collectible assembly's method at a reused MethodDesc
                // and start is another placement if its identity differs.
                let i = *self
                    .dotnet_index
                    .entry((*method_desc, *start, *identity))
                    .or_insert(next);
                if i == next {
                    self.unnamed_methods.push(i);
                    self.dotnet.push(DotnetPlacement {
                        method_desc: *method_desc,
                        start: *start,
                        identity: *identity,
                        name: String::new(),
                        lookups: (at, at),
                        frames: 0,
                    });
                }
                let p = &mut self.dotnet[i];
                p.lookups = (p.lookups.0.min(at), p.lookups.1.max(at));
                p.frames += 1;
                Key::Dotnet(i)
            }
            FrameKind::DotnetStub { kind, .. } => Key::DotnetStub(*kind),
            FrameKind::DotnetStubs { list, .. } => {
                let key = (*list, self.module_generation);
                if !self.stub_lists.contains_key(&key) && !self.unnamed_lists.contains(list) {
                    self.unnamed_lists.push(*list);
                }
                Key::DotnetStubs(key.0, key.1)
            }
            FrameKind::DotnetImage { module, .. } => {
                let key = (*module, self.module_generation);
                if !self.modules.contains_key(&key) && !self.unnamed_modules.contains(module) {
                    self.unnamed_modules.push(*module);
                }
                Key::DotnetImage(key.0, key.1)
            }
            FrameKind::DotnetTooFar => Key::DotnetTooFar,
        }
    }

    /// The CoreCLR placements (index, `MethodDesc`, start), ReadyToRun
    /// `Module`s and stub range lists sampled since the last call, not
    /// named yet, for the caller to read from the live process
    /// ([`Aggregator::name_method`], [`Aggregator::name_module`],
    /// [`Aggregator::name_stub_list`]): only what is new, however many
    /// stacks there are.
    pub fn take_unnamed(&mut self) -> Unnamed {
        let methods = std::mem::take(&mut self.unnamed_methods)
            .into_iter()
            .map(|i| {
                let p = &self.dotnet[i];
                (i, p.method_desc, p.start, p.identity)
            })
            .collect();
        Unnamed {
            methods,
            modules: std::mem::take(&mut self.unnamed_modules),
            stub_lists: std::mem::take(&mut self.unnamed_lists),
        }
    }

    /// Adds the host's names of its stub kinds, read at one time, to those
    /// read before: each manager registered then, with (kind, name) for
    /// each kind it named. A frame in a stub of a named kind is
    /// labelled `[stub 1: trampoline (jitmap-cranelift)]`; but a sample
    /// does not say whose stub it was in, so a kind that one manager named
    /// and another left unnamed, at any read, stays `[stub 1]`, and one
    /// named differently by two is labelled with both names.
    pub fn name_stub_kinds(&mut self, managers: &[ManagerStubNames]) {
        for kind in 1..=jitmap::heap::MAX_STUB_KIND {
            let named: Vec<&StubKindName> = managers
                .iter()
                .filter_map(|(_, names)| names.iter().find(|(k, _)| *k == kind))
                .map(|(_, name)| name)
                .collect();
            if named.is_empty() {
                continue;
            }
            if named.len() < managers.len() {
                self.unnamed_stub_kinds.insert(kind);
            }
            let known = self.stub_names.entry(kind).or_default();
            for name in named {
                if !known.contains(name) {
                    known.push(name.clone());
                }
            }
        }
    }

    /// The label of a frame in a stub of `kind`.
    fn stub_label(&self, kind: u64) -> String {
        let names = u8::try_from(kind)
            .ok()
            .filter(|kind| !self.unnamed_stub_kinds.contains(kind))
            .and_then(|kind| self.stub_names.get(&kind))
            .map_or(&[][..], Vec::as_slice);
        jitmap::manager::stub_frame_label(kind as u8, names)
    }

    /// Gives stub range list `list` its stubs' `StubCodeBlockKind`.
    pub fn name_stub_list(&mut self, list: u64, kind: u64) {
        self.stub_lists.insert((list, self.module_generation), kind);
    }

    /// Names CoreCLR placement `i` (from [`Aggregator::take_unnamed`]).
    pub fn name_method(&mut self, i: usize, name: String) {
        if let Some(p) = self.dotnet.get_mut(i) {
            p.name = name;
        }
    }

    /// Names a ReadyToRun `Module` by its assembly.
    pub fn name_module(&mut self, module: u64, name: String) {
        self.modules.insert((module, self.module_generation), name);
    }

    /// Forgets the `Module` names: a module freed with its collectible
    /// assembly may be reused at the same address by another. Frames
    /// sampled before keep the names they had; later ones are named anew.
    pub fn forget_modules(&mut self) {
        self.module_generation += 1;
        self.unnamed_modules.clear();
        self.unnamed_lists.clear();
    }

    /// Closes the CoreCLR placements whose start `gone` says is in a range
    /// section the runtime removed (a collectible assembly unloaded): a
    /// later sample at the same `MethodDesc` and start, another method's
    /// now, opens a new placement, named anew.
    pub fn close_dotnet(&mut self, gone: impl Fn(u64) -> bool) {
        self.dotnet_index.retain(|&(_, start, _), _| !gone(start));
    }

    /// The CoreCLR methods sampled, with their names.
    pub fn dotnet_placements(&self) -> Vec<DotnetPlacement> {
        self.dotnet
            .iter()
            .enumerate()
            .map(|(i, p)| DotnetPlacement {
                name: self.dotnet_name(i),
                ..p.clone()
            })
            .collect()
    }

    /// Placement `i`'s name, or its `MethodDesc` when none was read.
    fn dotnet_name(&self, i: usize) -> String {
        let p = &self.dotnet[i];
        if p.name.is_empty() {
            format!("[.NET method {:#x}]", p.method_desc)
        } else {
            p.name.clone()
        }
    }

    /// The counts so far.
    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// Every native address in the stacks, with whether it is a return
    /// address (to be named one byte back), for [`Aggregator::finish`]'s names.
    pub fn native_addresses(&self) -> Vec<(u64, bool)> {
        let mut out: Vec<(u64, bool)> = self
            .stacks
            .keys()
            .flatten()
            .filter_map(|k| match *k {
                Key::Native { addr, is_return } => Some((addr, is_return)),
                _ => None,
            })
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The finished stacks and placements. `native` names a native address
    /// (from [`Aggregator::native_addresses`]); JIT placements that share a
    /// name get labels `name`, `name [v2]`, ... in the order they were first
    /// sampled; a name the kernel cut ends in `...`.
    pub fn finish(
        mut self,
        native: impl Fn(u64, bool) -> Vec<String>,
    ) -> (Vec<Stack>, Vec<Placement>, Counts) {
        let names: Vec<String> = self
            .placements
            .iter()
            .map(|p| {
                if p.truncated {
                    format!("{}...", p.name)
                } else {
                    p.name.clone()
                }
            })
            .collect();
        let labels = version_labels(names.iter().map(String::as_str));
        for (p, label) in self.placements.iter_mut().zip(labels) {
            p.label = label;
        }
        let mut named: HashMap<Vec<String>, u64> = HashMap::new();
        for (keys, count) in &self.stacks {
            let frames = keys
                .iter()
                .flat_map(|k| match *k {
                    // A native frame may be several: its inlined calls too.
                    Key::Native { addr, is_return } => native(addr, is_return),
                    Key::Method(i) => vec![self.placements[i].label.clone()],
                    Key::Stub(kind) => vec![self.stub_label(kind)],
                    Key::Image(begin) => vec![format!("[image {begin:#x}]")],
                    Key::ImageMethod(id) => vec![self.image_names[&id].clone()],
                    Key::Nothing => vec!["[unattributed]".to_owned()],
                    Key::TooFar => vec!["[too far]".to_owned()],
                    Key::Error => vec!["[unreadable]".to_owned()],
                    Key::StaleRows => vec!["[stale unwind rows]".to_owned()],
                    Key::NoRule => vec!["[no unwind rule]".to_owned()],
                    Key::UnknownCode => vec!["[frame pointer through unknown code]".to_owned()],
                    Key::Dotnet(i) => vec![self.dotnet_name(i)],
                    Key::DotnetStub(kind) => vec![stub_kind_name(kind)],
                    Key::DotnetStubs(list, generation) => {
                        vec![match self.stub_lists.get(&(list, generation)) {
                            Some(&kind) => stub_kind_name(kind),
                            None => "[.NET stub]".to_owned(),
                        }]
                    }
                    Key::DotnetImage(module, generation) => {
                        vec![match self.modules.get(&(module, generation)) {
                            Some(name) => format!("[.NET ReadyToRun {name}]"),
                            None => format!("[.NET ReadyToRun module {module:#x}]"),
                        }]
                    }
                    Key::DotnetTooFar => {
                        vec![format!("[.NET: start beyond {DOTNET_SCAN_WORDS} words]")]
                    }
                })
                .collect();
            *named.entry(frames).or_default() += count;
        }
        let stacks = Stack::ranked(named);
        (stacks, self.placements, self.counts)
    }
}

/// A profile of the agent's type from the finished stacks, so that the
/// agent's report tables, folded stacks, flamegraph and pprof writers serve
/// the eBPF profiler too.
pub fn profile(stacks: Vec<Stack>, counts: &Counts, duration: std::time::Duration) -> Profile {
    Profile {
        duration,
        taken: counts.samples + counts.stale_samples + counts.empty_samples,
        samples: counts.samples,
        dropped: counts.stale_samples + counts.empty_samples,
        // One period each: the kernel's samples carry no overrun.
        dropped_periods: counts.stale_samples + counts.empty_samples,
        unattributed: counts.unattributed,
        lookups: counts.frames(),
        stacks,
        ..Profile::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn method(ip: u64, start: u64, name: &str) -> Frame {
        Frame {
            ip,
            reads: 14,
            kind: FrameKind::Method {
                start,
                size: 0x40,
                method_id: 7,
                heap_id: 1,
                name: name.into(),
                truncated: false,
            },
        }
    }

    fn native(ip: u64) -> Frame {
        Frame {
            ip,
            reads: 3,
            kind: FrameKind::Native,
        }
    }

    fn sample(frames: Vec<Frame>) -> Sample {
        Sample {
            tid: 1,
            reads: 1,
            stale: false,
            frameless_leaf: false,
            stale_rows: false,
            no_rule: false,
            unknown_code: false,
            frames,
        }
    }

    #[test]
    fn a_reused_placement_with_a_new_name_is_a_new_placement() {
        let mut agg = Aggregator::new();
        agg.add(&sample(vec![method(0x1010, 0x1000, "f")]));
        agg.add(&sample(vec![method(0x1020, 0x1000, "g")]));
        agg.add(&sample(vec![method(0x1030, 0x1000, "f")]));
        let (_, placements, _) = agg.finish(|addr, _| vec![format!("{addr:x}")]);
        let seen: Vec<_> = placements
            .iter()
            .map(|p| (p.name.as_str(), p.lookups, p.frames))
            .collect();
        assert_eq!(
            seen,
            [("f", (0x1010, 0x1030), 2), ("g", (0x1020, 0x1020), 1)]
        );
    }

    #[test]
    fn stacks_placements_and_drops_are_counted_exactly() {
        let mut agg = Aggregator::new();
        // Two samples in f at its first placement, one at a second placement
        // of the same name, one stale, one empty, one unattributed.
        agg.add(&sample(vec![method(0x1010, 0x1000, "f"), native(0x500)]));
        agg.add(&sample(vec![method(0x1020, 0x1000, "f"), native(0x500)]));
        agg.add(&sample(vec![method(0x2010, 0x2000, "f"), native(0x500)]));
        agg.add(&sample(vec![
            Frame {
                ip: 0x3000,
                reads: 9,
                kind: FrameKind::Stale,
            },
            native(0x500),
        ]));
        agg.add(&sample(vec![]));
        agg.add(&Sample {
            stale: true,
            ..sample(vec![])
        });
        agg.add(&sample(vec![
            Frame {
                ip: 0x1090,
                reads: 12,
                kind: FrameKind::Nothing,
            },
            native(0x600),
        ]));
        assert_eq!(agg.native_addresses(), [(0x500, true), (0x600, true)]);
        // 0x600 has a helper inlined: its frame is two, innermost first.
        let (stacks, placements, counts) = agg.finish(|addr, is_return| {
            let name = format!("n{addr:x}{}", if is_return { "r" } else { "" });
            match addr {
                0x600 => vec!["h (inlined)".into(), name],
                _ => vec![name],
            }
        });
        assert_eq!(
            stacks,
            [
                Stack {
                    frames: vec!["f".into(), "n500r".into()],
                    count: 2
                },
                Stack {
                    frames: vec![
                        "[unattributed]".into(),
                        "h (inlined)".into(),
                        "n600r".into()
                    ],
                    count: 1
                },
                Stack {
                    frames: vec!["f [v2]".into(), "n500r".into()],
                    count: 1
                },
            ]
        );
        assert_eq!(placements.len(), 2);
        assert_eq!(
            (
                placements[0].lookups,
                placements[0].frames,
                &*placements[0].label
            ),
            ((0x1010, 0x1020), 2, "f")
        );
        assert_eq!(placements[1].start, 0x2000);
        let expected = Counts {
            samples: 4,
            stale_samples: 2,
            empty_samples: 1,
            unattributed: 1,
            native: 5,
            methods: 3,
            nothing: 1,
            stale: 1,
            reads: 5 * 3 + 3 * 14 + 12 + 9,
            max_reads: 14,
            jit_reads: 3 * 14 + 12 + 9,
            max_jit_reads: 14,
            ..Counts::default()
        };
        assert_eq!(counts, expected);
        assert_eq!((counts.frames(), counts.jit_frames()), (10, 5));
        let p = profile(stacks, &counts, std::time::Duration::from_secs(1));
        assert_eq!(
            (p.taken, p.samples, p.dropped, p.dropped_periods, p.lookups),
            (7, 4, 3, 3, 10)
        );
        assert_eq!(p.summary()[0].name, "f");
    }

    /// The label's bound is the program's.
    #[test]
    fn stubs_are_labelled_by_their_kinds_names() {
        let stub = |kind| Frame {
            ip: 0x4004,
            reads: 1,
            kind: FrameKind::Stub {
                start: 0x4000,
                kind,
            },
        };
        let mut agg = Aggregator::new();
        let name = |owner, name| StubKindName::new(owner, name).unwrap();
        // Read twice (the profile rereads the names): kept once. Kind 2 is
        // named by two managers in two ways; kind 3 by none.
        let trampoline = name("jitmap-cranelift", "trampoline");
        let managers = [
            (
                0xA,
                vec![
                    (1, trampoline.clone()),
                    (2, name("a", "precode")),
                    (4, name("a", "thunk")),
                ],
            ),
            (0xB, vec![(1, trampoline), (2, name("b", "veneer"))]),
        ];
        for _ in 0..2 {
            agg.name_stub_kinds(&managers);
        }
        // Kind 4: manager 0xB left it unnamed, and a sample does not say
        // whose stub it was in.
        for kind in [1, 2, 3, 4] {
            agg.add(&sample(vec![stub(kind), native(0x500)]));
        }
        let (stacks, _, _) = agg.finish(|addr, _| vec![format!("{addr:x}")]);
        let mut leaves: Vec<&str> = stacks.iter().map(|s| s.frames[0].as_str()).collect();
        leaves.sort();
        assert_eq!(
            leaves,
            [
                "[stub 1: trampoline (jitmap-cranelift)]",
                "[stub 2: precode (a) or veneer (b)]",
                "[stub 3]",
                "[stub 4]"
            ]
        );
    }

    #[test]
    fn the_name_hash_multiplier_is_the_programs() {
        use jitmap::remote::dotnet::names::NAME_HASH_MULTIPLIER;
        let line = format!("#define NAME_HASH_MULTIPLIER {NAME_HASH_MULTIPLIER:#X}ULL\n");
        assert!(include_str!("profile.bpf.c").contains(&line), "{line}");
    }

    #[test]
    fn the_scan_bound_named_is_the_programs() {
        let source = include_str!("profile.bpf.c");
        assert!(
            source.contains(&format!("#define V1_MAX_WORDS {DOTNET_SCAN_WORDS}\n")),
            "profile.bpf.c's V1_MAX_WORDS is not {DOTNET_SCAN_WORDS}"
        );
    }

    fn dotnet(ip: u64, start: u64, method_desc: u64) -> Frame {
        dotnet_in(ip, start, method_desc, None)
    }

    fn dotnet_in(ip: u64, start: u64, method_desc: u64, identity: Option<Identity>) -> Frame {
        Frame {
            ip,
            reads: 9,
            kind: FrameKind::DotnetMethod {
                start,
                method_desc,
                identity,
            },
        }
    }

    /// A collectible assembly's method at a `MethodDesc` and start another
    /// one had (the next assembly got the same addresses) is another
    /// placement, named on its own, when its identity differs; with the
    /// same identity it is the same placement.
    #[test]
    fn a_reused_collectible_method_is_another_placement_by_its_identity() {
        use jitmap::remote::dotnet::names::{MethodIdentity, name_hash};
        let read =
            |name: &[u8]| Identity::Read(MethodIdentity::from_raw(2, name_hash(0x7000, name)));
        let (a, b) = (read(b"Jitmap.UnloadA\0"), read(b"Jitmap.UnloadB\0"));
        let mut agg = Aggregator::new();
        agg.add(&sample(vec![dotnet_in(0x1010, 0x1000, 0xA0, Some(a))]));
        agg.add(&sample(vec![dotnet_in(0x1020, 0x1000, 0xA0, Some(b))]));
        agg.add(&sample(vec![dotnet_in(0x1030, 0x1000, 0xA0, Some(a))]));
        assert_eq!(
            agg.take_unnamed().methods,
            [(0, 0xA0, 0x1000, Some(a)), (1, 0xA0, 0x1000, Some(b))]
        );
        agg.name_method(0, "[UnloadA] A::Mid".into());
        agg.name_method(1, "[UnloadB] B::Mid".into());
        let seen: Vec<_> = agg
            .dotnet_placements()
            .iter()
            .map(|p| (p.name.clone(), p.frames))
            .collect();
        assert_eq!(
            seen,
            [
                ("[UnloadA] A::Mid".to_owned(), 2),
                ("[UnloadB] B::Mid".to_owned(), 1)
            ]
        );
    }

    /// CoreCLR placements are named once each; a placement closed because
    /// its section went is not given to a later sample at the same
    /// `MethodDesc` and start, which is named anew; stubs, images and the
    /// scan's bound are labelled by kind.
    #[test]
    fn dotnet_placements_are_named_once_and_closed_when_their_section_goes() {
        let mut agg = Aggregator::new();
        agg.add(&sample(vec![dotnet(0x1010, 0x1000, 0xA0), native(0x500)]));
        agg.add(&sample(vec![dotnet(0x1020, 0x1000, 0xA0), native(0x500)]));
        let methods = |methods: Vec<(usize, u64, u64, Option<Identity>)>| Unnamed {
            methods,
            ..Unnamed::default()
        };
        assert_eq!(agg.take_unnamed(), methods(vec![(0, 0xA0, 0x1000, None)]));
        agg.name_method(0, "[A] T::f".into());
        assert_eq!(agg.take_unnamed(), Unnamed::default());
        // Its section goes; the same desc and start now hold another method.
        agg.close_dotnet(|start| (0x1000..0x2000).contains(&start));
        agg.add(&sample(vec![dotnet(0x1030, 0x1000, 0xA0), native(0x500)]));
        assert_eq!(agg.take_unnamed(), methods(vec![(1, 0xA0, 0x1000, None)]));
        agg.name_method(1, "[B] U::g".into());
        agg.add(&sample(vec![Frame {
            ip: 0x7000,
            reads: 7,
            kind: FrameKind::DotnetImage {
                begin: 0x7000,
                module: 0xB0,
            },
        }]));
        let modules = |modules: Vec<u64>| Unnamed {
            modules,
            ..Unnamed::default()
        };
        assert_eq!(agg.take_unnamed(), modules(vec![0xB0]));
        agg.name_module(0xB0, "System.Private.CoreLib".into());
        // The module goes and its address is reused: the frame before keeps
        // its name, the one after is another image, named anew.
        agg.forget_modules();
        agg.add(&sample(vec![Frame {
            ip: 0x7008,
            reads: 7,
            kind: FrameKind::DotnetImage {
                begin: 0x7000,
                module: 0xB0,
            },
        }]));
        assert_eq!(agg.take_unnamed(), modules(vec![0xB0]));
        agg.name_module(0xB0, "Another.Assembly".into());
        for kind in [
            FrameKind::DotnetStub {
                start: 0x3000,
                kind: 5,
            },
            FrameKind::DotnetStubs {
                begin: 0x4000,
                list: 0xC0,
            },
            FrameKind::DotnetStubs {
                begin: 0x5000,
                list: 0xD0,
            },
            FrameKind::DotnetTooFar,
        ] {
            agg.add(&sample(vec![Frame {
                ip: 0x3010,
                reads: 8,
                kind,
            }]));
        }
        // One list's kind is read; the other's could not be.
        assert_eq!(
            agg.take_unnamed(),
            Unnamed {
                stub_lists: vec![0xC0, 0xD0],
                ..Unnamed::default()
            }
        );
        agg.name_stub_list(0xC0, 4);
        let placements = agg.dotnet_placements();
        let seen: Vec<_> = placements
            .iter()
            .map(|p| (p.name.as_str(), p.lookups, p.frames))
            .collect();
        assert_eq!(
            seen,
            [
                ("[A] T::f", (0x1010, 0x1020), 2),
                ("[B] U::g", (0x1030, 0x1030), 1)
            ]
        );
        let (stacks, _, counts) = agg.finish(|addr, _| vec![format!("n{addr:x}")]);
        let mut names: Vec<_> = stacks
            .iter()
            .map(|s| (s.frames[0].as_str(), s.count))
            .collect();
        names.sort_unstable();
        assert_eq!(
            names,
            [
                ("[.NET ReadyToRun Another.Assembly]", 1),
                ("[.NET ReadyToRun System.Private.CoreLib]", 1),
                ("[.NET fixup precode]", 1),
                ("[.NET stub precode]", 1),
                ("[.NET stub]", 1),
                ("[.NET: start beyond 256 words]", 1),
                ("[A] T::f", 2),
                ("[B] U::g", 1),
            ]
        );
        assert_eq!(
            (
                counts.methods,
                counts.stubs,
                counts.images,
                counts.too_far,
                counts.unattributed
            ),
            (3, 3, 2, 1, 1)
        );
    }

    /// A walk that ended at an object whose rows were stale, or at a frame
    /// without a rule it can apply, says so at the end of its stack, and is
    /// counted; the same frames without a flag are another stack.
    #[test]
    fn a_walk_ended_by_stale_rows_ends_in_a_marker() {
        let mut agg = Aggregator::new();
        let cut = Sample {
            stale_rows: true,
            ..sample(vec![native(0x700)])
        };
        agg.add(&cut);
        agg.add(&cut);
        agg.add(&sample(vec![native(0x700)]));
        agg.add(&Sample {
            no_rule: true,
            ..sample(vec![native(0x700)])
        });
        let (stacks, _, counts) = agg.finish(|addr, _| vec![format!("n{addr:x}")]);
        assert_eq!(
            stacks,
            [
                Stack {
                    frames: vec!["n700".into(), "[stale unwind rows]".into()],
                    count: 2
                },
                Stack {
                    frames: vec!["n700".into()],
                    count: 1
                },
                Stack {
                    frames: vec!["n700".into(), "[no unwind rule]".into()],
                    count: 1
                },
            ]
        );
        assert_eq!(
            (counts.samples, counts.stale_rows, counts.no_rule),
            (4, 2, 1)
        );
    }
}
