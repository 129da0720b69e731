//! The simulator's shadow model: every code version it ever published, with
//! the times around its publish and its free, against which every lookup and
//! every agent sample is judged. Stubs (the Cranelift module's trampolines)
//! are in it too: lookups never name them, and a sample's frame in one must
//! say it is a stub.
//!
//! A long run forgets versions freed long ago ([`Shadow::forget_freed_before`]),
//! so that the model stays the size of the code live in the last half
//! minute, and finds the versions at an address through an index by start.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

/// One published version of a method.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    /// Its name (group, method, tier).
    pub name: String,
    /// Address of its first byte.
    pub start: usize,
    /// Size in bytes.
    pub size: u64,
    /// CLOCK_MONOTONIC ns before its publish began: after its bytes were
    /// reserved and written, or, for a Cranelift module, which reserves
    /// inside its publish, before they were.
    pub publish_begin: u64,
    /// After its publish returned.
    pub publish_end: u64,
    /// Before its free began (`u64::MAX` while live).
    pub free_begin: u64,
    /// After its free returned (`u64::MAX` while live).
    pub free_end: u64,
    /// A stub, not a method.
    pub stub: bool,
    /// Its bytes were reserved inside its publish (a Cranelift module's
    /// `finalize_definitions`): they took their place somewhere between
    /// `publish_begin` and `publish_end`, not by `publish_begin`.
    pub reserved_in_publish: bool,
}

impl Version {
    fn covers(&self, addr: usize) -> bool {
        addr >= self.start && ((addr - self.start) as u64) < self.size
    }
}

/// Every version, and the live ones for random picks.
#[derive(Debug, Default)]
pub struct Shadow {
    versions: HashMap<u64, Version>,
    /// Version ids by start address.
    by_start: BTreeMap<usize, Vec<u64>>,
    /// The largest size ever recorded: no version starts further below an
    /// address it covers.
    max_size: u64,
    live: Vec<u64>,
    live_index: HashMap<u64, usize>,
    /// Versions being published whose address is not known yet (a Cranelift
    /// module places them inside `finalize_definitions`).
    placing: HashSet<u64>,
    /// The versions forgotten last ([`FORGOTTEN_KEPT`] at most), for the
    /// report of a wrong answer that names one.
    forgotten: VecDeque<(u64, Version)>,
}

/// Forgotten versions kept for reports: a few seconds of churn.
const FORGOTTEN_KEPT: usize = 1 << 16;

impl Shadow {
    /// Records a version about to be published.
    pub fn publishing(&mut self, id: u64, version: Version) {
        self.live_index.insert(id, self.live.len());
        self.live.push(id);
        self.insert(id, version);
    }

    fn insert(&mut self, id: u64, version: Version) {
        self.max_size = self.max_size.max(version.size);
        self.by_start.entry(version.start).or_default().push(id);
        if let Some(old) = self.versions.insert(id, version) {
            self.unindex(id, old.start);
        }
    }

    fn remove(&mut self, id: u64) {
        if let Some(v) = self.versions.remove(&id) {
            self.unindex(id, v.start);
        }
    }

    fn unindex(&mut self, id: u64, start: usize) {
        if let Some(ids) = self.by_start.get_mut(&start) {
            if let Some(i) = ids.iter().position(|&x| x == id) {
                ids.swap_remove(i);
            }
            if ids.is_empty() {
                self.by_start.remove(&start);
            }
        }
    }

    /// Forgets every version whose free returned before `horizon` (ns).
    /// Judging a lookup or sample that still needed one would report it
    /// wrong (an unknown or misplaced version), never hide a wrong answer:
    /// the caller keeps `horizon` far behind anything still to be judged.
    pub fn forget_freed_before(&mut self, horizon: u64) {
        let old: Vec<u64> = self
            .versions
            .iter()
            .filter(|(_, v)| v.free_end < horizon)
            .map(|(id, _)| *id)
            .collect();
        for id in old {
            if let Some(v) = self.versions.remove(&id) {
                self.unindex(id, v.start);
                if self.forgotten.len() == FORGOTTEN_KEPT {
                    self.forgotten.pop_front();
                }
                self.forgotten.push_back((id, v));
            }
        }
    }

    /// Versions and stubs recorded.
    pub fn len(&self) -> usize {
        self.versions.len()
    }

    /// Whether none is recorded.
    pub fn is_empty(&self) -> bool {
        self.versions.is_empty()
    }

    /// Records that `id` is being published somewhere not yet known: a
    /// lookup that names it is judged once it is [`Shadow::placed`].
    pub fn placing(&mut self, id: u64) {
        self.placing.insert(id);
    }

    /// Whether `id` is being published and not placed yet.
    pub fn is_placing(&self, id: u64) -> bool {
        self.placing.contains(&id)
    }

    /// Records where `id` was published (its publish times included).
    pub fn placed(&mut self, id: u64, version: Version) {
        self.placing.remove(&id);
        self.publishing(id, version);
    }

    /// Records a stub: judged like a version, never picked for a lookup.
    pub fn stub(&mut self, id: u64, version: Version) {
        self.insert(
            id,
            Version {
                stub: true,
                ..version
            },
        );
    }

    /// Forgets a version whose publish failed (placed or not).
    pub fn unpublished(&mut self, id: u64) {
        self.placing.remove(&id);
        self.unlist(id);
        self.remove(id);
    }

    /// Records that `id`'s publish returned at `now`.
    pub fn published(&mut self, id: u64, now: u64) {
        if let Some(v) = self.versions.get_mut(&id) {
            v.publish_end = now;
        }
    }

    /// Records that `id`'s free begins at `now`.
    pub fn freeing(&mut self, id: u64, now: u64) {
        self.unlist(id);
        if let Some(v) = self.versions.get_mut(&id) {
            v.free_begin = now;
        }
    }

    /// Records that `id`'s free returned at `now`.
    pub fn freed(&mut self, id: u64, now: u64) {
        if let Some(v) = self.versions.get_mut(&id) {
            v.free_end = now;
        }
    }

    fn unlist(&mut self, id: u64) {
        if let Some(i) = self.live_index.remove(&id) {
            self.live.swap_remove(i);
            if let Some(&moved) = self.live.get(i) {
                self.live_index.insert(moved, i);
            }
        }
    }

    /// The live version at position `pick % live` (for random picks).
    pub fn pick(&self, pick: u64) -> Option<(u64, &Version)> {
        let id = *self
            .live
            .get((pick % self.live.len().max(1) as u64) as usize)?;
        Some((id, &self.versions[&id]))
    }

    /// A version by id.
    pub fn get(&self, id: u64) -> Option<&Version> {
        self.versions.get(&id)
    }

    /// Judges a lookup of `addr` made between `t0` and `t1` that answered
    /// `found` (version id and block start). `expected`, if the address was
    /// picked inside a version, is that version's id. Returns what was wrong.
    pub fn judge_lookup(
        &self,
        addr: usize,
        t0: u64,
        t1: u64,
        found: Option<(u64, usize)>,
        expected: Option<u64>,
    ) -> Result<(), String> {
        match found {
            Some((id, start)) => {
                let Some(v) = self.versions.get(&id) else {
                    return Err(format!("lookup of {addr:#x} named unknown version {id}"));
                };
                if !v.covers(addr) || v.start != start {
                    return Err(format!("lookup of {addr:#x} named {v:?} at {start:#x}"));
                }
                // Visible only between its publish and its free.
                if v.publish_begin > t1 || v.free_end < t0 {
                    return Err(format!(
                        "lookup of {addr:#x} in [{t0}, {t1}] named {v:?} outside its life"
                    ));
                }
                Ok(())
            }
            None => match expected.and_then(|id| self.versions.get(&id)) {
                // Live for the whole lookup, yet not found.
                Some(v) if v.publish_end <= t0 && v.free_begin >= t1 => Err(format!(
                    "lookup of {addr:#x} in [{t0}, {t1}] found nothing inside live {v:?}"
                )),
                _ => Ok(()),
            },
        }
    }

    /// What may have occupied `addr` when a sample ended at `end_ns`: the
    /// versions and stubs placed there before then, from the last one
    /// certainly in place on. A version is certainly in place from its
    /// `publish_begin`, except one whose publish reserves inside itself (a
    /// Cranelift module's `finalize_definitions`, [`Version::reserved_in_publish`]):
    /// it takes the bytes at some moment before its publish returns, so
    /// until then the one before it may still be there. (The agent's handler names the block it
    /// found; freed bytes are reused only after every handler that could
    /// have found them returned, so a handler that found the old block ended
    /// before the new one's reserve.) Latest first.
    fn occupants(&self, addr: usize, end_ns: u64) -> Vec<(u64, &Version)> {
        let lowest = addr.saturating_sub(self.max_size as usize);
        let mut placed: Vec<(u64, &Version)> = self
            .by_start
            .range(lowest..=addr)
            .flat_map(|(_, ids)| ids)
            .map(|id| (*id, &self.versions[id]))
            .filter(|(_, v)| v.covers(addr) && v.publish_begin <= end_ns)
            .collect();
        placed.sort_by_key(|(_, v)| std::cmp::Reverse(v.publish_begin));
        if let Some(certain) = placed
            .iter()
            .position(|(_, v)| !v.reserved_in_publish || v.publish_end <= end_ns)
        {
            placed.truncate(certain + 1);
        }
        placed
    }

    /// Judges a frame the agent named a stub at `addr` (sampled at
    /// `end_ns`): a stub must have occupied it.
    pub fn judge_stub(&self, addr: usize, end_ns: u64) -> Result<(), String> {
        let occupants = self.occupants(addr, end_ns);
        if occupants.iter().any(|(_, v)| v.stub) {
            return Ok(());
        }
        Err(format!(
            "sample at {addr:#x} (ended {end_ns}) named a stub; the occupants were {:?}",
            occupants.iter().map(|(_, v)| v).collect::<Vec<_>>()
        ))
    }

    /// Judges a frame the agent left unattributed at `addr` (sampled at
    /// `end_ns`): right only in a v1 heap, deep enough in the method that
    /// occupied `addr` that the handler's capped walk (`v1_words` map words,
    /// the covering one included) cannot reach its start.
    pub fn judge_unattributed(
        &self,
        addr: usize,
        end_ns: u64,
        v1_words: Option<usize>,
    ) -> Result<(), String> {
        let occupants = self.occupants(addr, end_ns);
        let too_deep = |v: &Version| {
            v1_words.is_some_and(|words| !v.stub && addr - v.start > (words - 1) * 256)
        };
        if occupants.iter().any(|(_, v)| too_deep(v)) {
            return Ok(());
        }
        Err(format!(
            "sample at {addr:#x} (ended {end_ns}) unattributed; the occupants were {:?}",
            occupants.iter().map(|(_, v)| v).collect::<Vec<_>>()
        ))
    }

    /// Judges an agent frame that named version `id` at `addr` in a sample
    /// that ended at `end_ns`: the version must be one whose bytes may have
    /// been there then ([`Shadow::occupants`]). (Freed code keeps running
    /// until its executor leaves it, and its bytes are reused only after
    /// that executor's next quiescent point.)
    pub fn judge_sample(
        &self,
        addr: usize,
        end_ns: u64,
        id: u64,
        name: &str,
    ) -> Result<(), String> {
        let occupants = self.occupants(addr, end_ns);
        match self.versions.get(&id) {
            Some(v) if occupants.iter().any(|(o, _)| *o == id) && !v.stub && v.name == name => {
                Ok(())
            }
            v => Err(format!(
                "sample at {addr:#x} (ended {end_ns}) named {name} (version {id}: {v:?}{}), the occupants were {:?}",
                match self.forgotten.iter().rev().find(|(f, _)| *f == id) {
                    Some((_, f)) => format!(", forgotten: {f:?}"),
                    None => String::new(),
                },
                occupants.iter().map(|(_, v)| v).collect::<Vec<_>>()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(start: usize, publish: u64, free: u64) -> Version {
        Version {
            name: format!("v{start:x}_{publish}"),
            start,
            size: 16,
            publish_begin: publish,
            publish_end: publish + 1,
            free_begin: free,
            free_end: free.saturating_add(1),
            stub: false,
            reserved_in_publish: false,
        }
    }

    #[test]
    fn lookups_are_judged_by_the_life_of_what_they_name() {
        // `scale`'s test reads the process's allocator figures: this crate's
        // unit tests take turns.
        let _turn = crate::scale::measuring();
        let mut s = Shadow::default();
        s.publishing(1, version(0x100, 10, 20));
        s.publishing(2, version(0x100, 30, u64::MAX));
        assert_eq!(
            s.judge_lookup(0x104, 12, 13, Some((1, 0x100)), Some(1)),
            Ok(())
        );
        assert_eq!(
            s.judge_lookup(0x104, 32, 33, Some((2, 0x100)), Some(2)),
            Ok(())
        );
        // A freed version named after its free, a start that is not its own,
        // an address past its end, an unknown id: all wrong.
        assert!(
            s.judge_lookup(0x104, 25, 26, Some((1, 0x100)), None)
                .is_err()
        );
        assert!(
            s.judge_lookup(0x104, 32, 33, Some((2, 0x108)), None)
                .is_err()
        );
        assert!(
            s.judge_lookup(0x110, 32, 33, Some((2, 0x100)), None)
                .is_err()
        );
        assert!(
            s.judge_lookup(0x104, 32, 33, Some((3, 0x100)), None)
                .is_err()
        );
        // Nothing found: wrong only inside a version live throughout.
        assert!(s.judge_lookup(0x104, 32, 33, None, Some(2)).is_err());
        assert_eq!(s.judge_lookup(0x104, 19, 21, None, Some(1)), Ok(()));
        assert_eq!(s.judge_lookup(0x104, 5, 11, None, Some(1)), Ok(()));
    }

    #[test]
    fn samples_are_judged_by_the_occupant_of_the_bytes() {
        // `scale`'s test reads the process's allocator figures: this crate's
        // unit tests take turns.
        let _turn = crate::scale::measuring();
        let mut s = Shadow::default();
        s.publishing(1, version(0x100, 10, 20));
        s.publishing(2, version(0x100, 30, u64::MAX));
        let name1 = s.get(1).unwrap().name.clone();
        let name2 = s.get(2).unwrap().name.clone();
        // Version 1 ran until version 2 took its bytes, even after its free.
        assert_eq!(s.judge_sample(0x104, 25, 1, &name1), Ok(()));
        assert!(s.judge_sample(0x104, 31, 1, &name1).is_err());
        assert_eq!(s.judge_sample(0x104, 31, 2, &name2), Ok(()));
        assert!(s.judge_sample(0x104, 31, 2, &name1).is_err());
        s.freeing(2, 40);
        assert!(s.pick(0).is_some_and(|(id, _)| id == 1));
        s.freeing(1, 50);
        assert!(s.pick(0).is_none());
    }

    #[test]
    fn a_publish_that_reserves_inside_leaves_the_old_occupant_possible_until_it_returns() {
        // `scale`'s test reads the process's allocator figures: this crate's
        // unit tests take turns.
        let _turn = crate::scale::measuring();
        let mut s = Shadow::default();
        s.publishing(1, version(0x100, 10, 20));
        // A Cranelift module reserves inside its publish: version 2's bytes
        // took version 1's somewhere in [30, 50].
        let cranelift = |start| Version {
            publish_end: 50,
            reserved_in_publish: true,
            ..version(start, 30, u64::MAX)
        };
        s.publishing(2, cranelift(0x100));
        s.stub(3, version(0x200, 10, 20));
        s.publishing(4, cranelift(0x200));
        let name1 = s.get(1).unwrap().name.clone();
        let name2 = s.get(2).unwrap().name.clone();
        assert_eq!(s.judge_sample(0x104, 40, 1, &name1), Ok(()));
        assert_eq!(s.judge_sample(0x104, 40, 2, &name2), Ok(()));
        assert_eq!(s.judge_sample(0x104, 50, 2, &name2), Ok(()));
        assert!(s.judge_sample(0x104, 50, 1, &name1).is_err());
        assert!(s.judge_sample(0x104, 25, 2, &name2).is_err());
        // The same for a stub the publish replaces.
        assert_eq!(s.judge_stub(0x204, 40), Ok(()));
        assert!(s.judge_stub(0x204, 50).is_err());
        // A publish into bytes reserved before it (iced) holds them from its
        // begin, though its end is not known yet: the one before is wrong.
        s.publishing(5, version(0x300, 10, 20));
        s.publishing(
            6,
            Version {
                publish_end: u64::MAX,
                ..version(0x300, 30, u64::MAX)
            },
        );
        let name5 = s.get(5).unwrap().name.clone();
        assert!(s.judge_sample(0x304, 40, 5, &name5).is_err());
    }

    #[test]
    fn a_version_being_placed_is_judged_once_placed_and_a_stub_only_as_one() {
        // `scale`'s test reads the process's allocator figures: this crate's
        // unit tests take turns.
        let _turn = crate::scale::measuring();
        let mut s = Shadow::default();
        s.placing(1);
        assert!(s.is_placing(1));
        assert!(s.pick(0).is_none());
        s.placed(1, version(0x100, 10, u64::MAX));
        assert!(!s.is_placing(1));
        assert_eq!(
            s.judge_lookup(0x104, 12, 13, Some((1, 0x100)), Some(1)),
            Ok(())
        );
        s.placing(2);
        s.unpublished(2);
        assert!(!s.is_placing(2));
        // A stub after the method at the same bytes: a frame there must be
        // a stub frame; before it, the method's.
        s.stub(3, version(0x100, 30, u64::MAX));
        assert!(s.pick(1).is_some_and(|(id, _)| id == 1));
        assert_eq!(s.judge_stub(0x104, 31), Ok(()));
        assert!(s.judge_stub(0x104, 20).is_err());
        let name = s.get(3).unwrap().name.clone();
        assert!(s.judge_sample(0x104, 31, 3, &name).is_err());
        let name = s.get(1).unwrap().name.clone();
        assert_eq!(s.judge_sample(0x104, 20, 1, &name), Ok(()));
        assert!(s.judge_stub(0x200, 31).is_err());
    }

    #[test]
    fn versions_freed_before_the_horizon_are_forgotten_and_no_others() {
        // `scale`'s test reads the process's allocator figures: this crate's
        // unit tests take turns.
        let _turn = crate::scale::measuring();
        let mut s = Shadow::default();
        assert!(s.is_empty());
        s.publishing(1, version(0x100, 10, 20));
        s.publishing(2, version(0x100, 30, u64::MAX));
        s.publishing(3, version(0x200, 40, 50));
        let mut big = version(0x1000, 60, u64::MAX);
        big.size = 0x1000;
        s.publishing(4, big);
        let name1 = s.get(1).unwrap().name.clone();
        assert_eq!(s.judge_sample(0x104, 25, 1, &name1), Ok(()));
        // Freed at 21 (free_end): forgotten by a horizon of 22, not of 21.
        s.forget_freed_before(21);
        assert_eq!(s.len(), 4);
        s.forget_freed_before(22);
        assert_eq!(s.len(), 3);
        assert_eq!(s.get(1), None);
        // Its samples are now judged wrong, never right by mistake.
        assert!(s.judge_sample(0x104, 25, 1, &name1).is_err());
        let name2 = s.get(2).unwrap().name.clone();
        assert_eq!(s.judge_sample(0x104, 31, 2, &name2), Ok(()));
        // The index finds a large version from far inside it.
        let name4 = s.get(4).unwrap().name.clone();
        assert_eq!(s.judge_sample(0x1ff0, 61, 4, &name4), Ok(()));
        s.forget_freed_before(u64::MAX);
        assert_eq!(s.len(), 2);
        assert_eq!(s.get(3), None);
    }

    #[test]
    fn an_unattributed_leaf_is_right_only_past_the_v1_cap() {
        // `scale`'s test reads the process's allocator figures: this crate's
        // unit tests take turns.
        let _turn = crate::scale::measuring();
        let mut s = Shadow::default();
        let mut big = version(0x10_0000, 10, u64::MAX);
        big.size = 1 << 20;
        s.publishing(1, big);
        // 256 words: the walk reads the covering word and 255 before it.
        let edge = 0x10_0000 + 255 * 256;
        assert!(s.judge_unattributed(edge, 20, Some(256)).is_err());
        assert_eq!(s.judge_unattributed(edge + 1, 20, Some(256)), Ok(()));
        // Never in a v2 heap, never outside a method, never before its publish.
        assert!(s.judge_unattributed(edge + 1, 20, None).is_err());
        assert!(s.judge_unattributed(0x30_0000, 20, Some(256)).is_err());
        assert!(s.judge_unattributed(edge + 1, 5, Some(256)).is_err());
    }
}
