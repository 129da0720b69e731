//! Known versions and images, and their placements by start: what names a sampled address.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::CodeInfo;
use crate::events::BlockId;
use crate::image::ImageSection;

use crate::agent::record::FrameKind;

use super::Collector;
use super::events::LogEntry;

/// A method version the collector can name.
pub(super) struct Known {
    pub(super) info: Arc<CodeInfo>,
    /// Where it is now (its last placement).
    pub(super) start: usize,
    pub(super) size: u64,
    /// Its index in the profile's methods, once a sample named it.
    pub(super) method: Option<usize>,
    /// The domain's retire tag, taken after its free.
    pub(super) freed: Option<u64>,
    /// Its placements in `occupants`: a freed version is forgotten with
    /// its last one.
    pub(super) placements: u32,
}

impl Known {
    /// A version just published (or listed live) at `start`: one placement,
    /// not named yet, not freed.
    pub(super) fn new(info: Arc<CodeInfo>, start: usize, size: u64) -> Self {
        Self {
            info,
            start,
            size,
            method: None,
            freed: None,
            placements: 1,
        }
    }
}

/// One place a version's bytes were: published there, or moved there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Placement {
    pub(super) size: u64,
    /// CLOCK_MONOTONIC ns when it was placed (0: before the agent started).
    pub(super) placed_ns: u64,
    pub(super) key: BlockId,
    /// The retire tag taken when the version left (freed, or moved away):
    /// once it is safe, no sample can still be running in these bytes.
    pub(super) left: Option<u64>,
    /// When a free or a move unpublished it (CLOCK_MONOTONIC ns): a handler
    /// that began later found another block at this start, not this one.
    pub(super) unpublished_ns: Option<u64>,
}

/// An image the collector can name methods of.
pub(super) struct KnownImage {
    pub(super) image: Arc<ImageSection>,
    /// The domain's retire tag, taken after its unload.
    pub(super) unloaded: Option<u64>,
}

impl KnownImage {
    /// The name of method `id` if this image has it at `addr`.
    pub(super) fn name_at(&self, addr: usize, id: u64) -> Option<&str> {
        let rel = addr.checked_sub(self.image.base())?;
        let method = self.image.method_at(rel as u64)?;
        (method.method_id == id).then_some(method.name.as_str())
    }
}

impl Collector {
    /// Forgets what no sample can name any more: placements left before
    /// `safe` (every sample that ran in them was drained before this pass),
    /// unless a waiting sample has a frame in their bytes; then the freed
    /// versions with no placement left, their aliases, and unloaded images
    /// no waiting sample has an image frame in.
    pub(super) fn forget(&mut self, safe: u64) {
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
        // An unloaded image goes once safe, unless a waiting sample has an
        // image frame in its bytes (a return address one byte back).
        let pending = &self.pending;
        self.images.retain(|k| {
            let (base, size) = (k.image.base(), k.image.info().size);
            let holds = |addr: usize| addr.wrapping_sub(base) < size;
            k.unloaded.is_none_or(|tag| tag >= safe)
                || pending.iter().flat_map(|s| &s.frames).any(|f| {
                    f.kind == FrameKind::Image && (holds(f.addr) || holds(f.addr.wrapping_sub(1)))
                })
        });
    }

    /// Marks `key`'s placement at `start` as left at `tag`, unpublished at
    /// `unpublished_ns`.
    fn leave(&mut self, start: usize, key: BlockId, tag: u64, unpublished_ns: u64) {
        let current = self.occupants.get_mut(&start).and_then(|list| {
            list.iter_mut()
                .rev()
                .find(|p| p.key == key && p.left.is_none())
        });
        if let Some(p) = current {
            p.left = Some(tag);
            p.unpublished_ns = Some(unpublished_ns);
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
            unpublished_ns: None,
        });
        self.max_size = self.max_size.max(size);
    }

    /// Applies one code event to the known versions. A version keeps the
    /// block it was first known in as its key; a move files its new block
    /// as an alias of that key, dropped when the version is freed.
    pub(super) fn apply(&mut self, entry: LogEntry) {
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
                self.known.insert(key, Known::new(info, start, size));
            }
            LogEntry::Moved {
                from,
                to,
                start,
                at_ns,
                tag,
                unpublished_ns,
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
                        self.leave(old, key, tag, unpublished_ns);
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
                    self.leave(old, key, tag, unpublished_ns);
                    self.place(start, size, at_ns, key);
                    self.aliases.insert(to, key);
                }
            }
            LogEntry::Freed { block, tag, at_ns } => {
                let key = self.aliases.remove(&block).unwrap_or(block);
                if let Some(k) = self.known.get_mut(&key) {
                    k.freed = Some(tag);
                    let start = k.start;
                    self.leave(start, key, tag, at_ns);
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
    /// the end, but not one unpublished (freed or moved away) before the
    /// beginning (the handler found a block the maps still held). A move's
    /// event is sent just after its new copy became visible, so a sample
    /// may find the new copy before the collector knows it: then no
    /// placement answers (the sample waits for the event), rather than one
    /// that left that start earlier.
    pub(super) fn placed_at(&self, start: usize, begin_ns: u64, end_ns: u64) -> Option<BlockId> {
        self.occupants
            .get(&start)?
            .iter()
            .filter(|p| p.placed_ns <= end_ns && p.unpublished_ns.is_none_or(|u| begin_ns < u))
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
    pub(super) fn occupant_at(&self, addr: usize, end_ns: u64) -> Option<(BlockId, usize)> {
        let lowest = addr.saturating_sub(self.max_size as usize);
        self.occupants
            .range(lowest..=addr)
            .flat_map(|(&start, list)| list.iter().map(move |p| (start, p)))
            .filter(|(start, p)| ((addr - start) as u64) < p.size && p.placed_ns <= end_ns)
            .max_by_key(|(_, p)| p.placed_ns)
            .map(|(start, p)| (p.key, start))
    }
}
