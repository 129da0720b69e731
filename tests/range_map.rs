//! The range-section map: exact boundaries, chunks, removal under pinned readers,
//! and a differential check against a `BTreeMap` model.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use jitmap::Domain;
use jitmap::range::{RangeError, RangeSectionMap};
use jitmap_testkit::rng::Rng;

const CHUNK: usize = 128 * 1024;
const BASE: usize = 0x7f12_3400_0000;

fn setup() -> (Arc<Domain>, RangeSectionMap<u64>) {
    let domain = Domain::new(4);
    let map = RangeSectionMap::new(&domain);
    (domain, map)
}

fn at(map: &RangeSectionMap<u64>, domain: &Arc<Domain>, addr: usize) -> Option<u64> {
    let reader = domain.register().unwrap();
    let guard = reader.pin().unwrap();
    map.find(&guard, addr).unwrap().map(|s| *s.value())
}

#[test]
fn first_and_last_byte_of_sections() {
    let (d, map) = setup();
    map.insert(BASE + 0x100, BASE + 0x200, 1).unwrap();
    assert_eq!(at(&map, &d, BASE + 0xFF), None);
    assert_eq!(at(&map, &d, BASE + 0x100), Some(1));
    assert_eq!(at(&map, &d, BASE + 0x1FF), Some(1));
    assert_eq!(at(&map, &d, BASE + 0x200), None);
}

#[test]
fn several_sections_in_one_chunk_and_across_boundaries() {
    let (d, map) = setup();
    map.insert(BASE, BASE + 0x1000, 1).unwrap();
    map.insert(BASE + 0x1000, BASE + 0x3000, 2).unwrap();
    map.insert(BASE + CHUNK - 0x10, BASE + CHUNK + 0x10, 3)
        .unwrap();
    assert_eq!(at(&map, &d, BASE + 0xFFF), Some(1));
    assert_eq!(at(&map, &d, BASE + 0x1000), Some(2));
    assert_eq!(at(&map, &d, BASE + 0x3000), None);
    assert_eq!(at(&map, &d, BASE + CHUNK - 0x11), None);
    assert_eq!(at(&map, &d, BASE + CHUNK - 0x10), Some(3));
    assert_eq!(at(&map, &d, BASE + CHUNK + 0xF), Some(3));
    assert_eq!(at(&map, &d, BASE + CHUNK + 0x10), None);
}

#[test]
fn a_section_spanning_many_chunks() {
    let (d, map) = setup();
    let (begin, end) = (BASE + 0x40, BASE + 300 * CHUNK + 0x40);
    map.insert(begin, end, 9).unwrap();
    for k in 0..=300 {
        let chunk = BASE + k * CHUNK;
        assert_eq!(
            at(&map, &d, chunk + 0x40),
            if chunk + 0x40 < end { Some(9) } else { None }
        );
        if k > 0 {
            assert_eq!(at(&map, &d, chunk), Some(9), "chunk {k}");
            assert_eq!(at(&map, &d, chunk - 1), Some(9), "chunk {k}");
        }
    }
    assert_eq!(at(&map, &d, begin - 1), None);
    assert_eq!(at(&map, &d, end - 1), Some(9));
    assert_eq!(at(&map, &d, end), None);
    map.remove(begin).unwrap();
    for k in 0..300 {
        assert_eq!(at(&map, &d, BASE + k * CHUNK + 0x100), None);
    }
}

#[test]
fn high_addresses_and_bad_ranges() {
    let (d, map) = setup();
    assert_eq!(
        map.insert(1 << 57, (1 << 57) + 16, 1),
        Err(RangeError::OutOfRange {
            begin: 1 << 57,
            end: (1 << 57) + 16
        })
    );
    assert_eq!(
        map.insert(0x1000, 0x1000, 1),
        Err(RangeError::Empty {
            begin: 0x1000,
            end: 0x1000
        })
    );
    map.insert((1 << 57) - 0x100, 1 << 57, 2).unwrap();
    assert_eq!(at(&map, &d, (1 << 57) - 1), Some(2));
    assert_eq!(
        at(&map, &d, (1 << 57) | ((1 << 57) - 1)),
        None,
        "bits 57..63 set"
    );
    assert_eq!(at(&map, &d, usize::MAX), None);
    map.insert(0x1000, 0x2000, 3).unwrap();
    assert_eq!(
        map.insert(0x1800, 0x2800, 4),
        Err(RangeError::Overlap {
            begin: 0x1800,
            existing: 0x1000
        })
    );
    assert_eq!(
        map.insert(0x800, 0x1001, 4),
        Err(RangeError::Overlap {
            begin: 0x800,
            existing: 0x1000
        })
    );
    assert_eq!(
        map.remove(0x1800),
        Err(RangeError::NotFound { begin: 0x1800 })
    );
    assert_eq!(map.len(), 2);
    assert_eq!(at(&map, &d, 0x1FFF), Some(3));
}

#[test]
fn matches_a_model_over_random_inserts_and_removes() {
    let (d, map) = setup();
    let reader = d.register().unwrap();
    let mut model: BTreeMap<usize, (usize, u64)> = BTreeMap::new();
    let mut rng = Rng::new(5);
    let span = 64 * CHUNK;
    for step in 0..3000u64 {
        if !model.is_empty() && rng.chance(40) {
            let k = *model
                .keys()
                .nth(rng.below(model.len() as u64) as usize)
                .unwrap();
            model.remove(&k);
            map.remove(k).unwrap();
        } else {
            let begin = BASE + rng.below(span as u64) as usize;
            let len = if rng.chance(20) {
                rng.range(CHUNK as u64, 4 * CHUNK as u64)
            } else {
                rng.range(1, 0x4000)
            } as usize;
            let end = begin + len;
            let overlaps = model
                .range(..end)
                .next_back()
                .is_some_and(|(_, &(e, _))| e > begin);
            assert_eq!(map.insert(begin, end, step).is_ok(), !overlaps);
            if !overlaps {
                model.insert(begin, (end, step));
            }
        }
        let guard = reader.pin().unwrap();
        for _ in 0..20 {
            let addr = BASE + rng.below(span as u64 + 4 * CHUNK as u64) as usize;
            let expected = model
                .range(..=addr)
                .next_back()
                .filter(|(_, (e, _))| addr < *e)
                .map(|(_, &(_, v))| v);
            assert_eq!(
                map.find(&guard, addr).unwrap().map(|s| *s.value()),
                expected,
                "step {step} addr {addr:#x}"
            );
        }
        for (&b, &(e, v)) in &model {
            assert_eq!(map.find(&guard, b).unwrap().map(|s| *s.value()), Some(v));
            assert_eq!(
                map.find(&guard, e - 1).unwrap().map(|s| *s.value()),
                Some(v)
            );
        }
    }
    assert_eq!(map.len(), model.len());
}

/// A guard remembers the last section it found. One guard held across a random
/// sequence of changes: each step finds an address (caching its section), then
/// removes that very section or reinserts over it with a new value, or changes
/// something elsewhere, and the same address must then answer as the model
/// does, never from the guard's memory of the old map.
#[test]
fn one_guard_held_across_changes_never_answers_from_a_stale_section() {
    let (d, map) = setup();
    let reader = d.register().unwrap();
    let guard = reader.pin().unwrap();
    let mut model: BTreeMap<usize, (usize, u64)> = BTreeMap::new();
    let mut rng = Rng::new(11);
    let span = 16 * CHUNK;
    let expected = |model: &BTreeMap<usize, (usize, u64)>, addr: usize| {
        model
            .range(..=addr)
            .next_back()
            .filter(|(_, (e, _))| addr < *e)
            .map(|(_, &(_, v))| v)
    };
    let mut removed_then_missed = 0;
    for step in 1..=2000u64 {
        let begin = BASE + rng.below(span as u64) as usize;
        let end = begin + rng.range(1, 2 * CHUNK as u64) as usize;
        let overlaps = model
            .range(..end)
            .next_back()
            .is_some_and(|(_, &(e, _))| e > begin);
        if !overlaps {
            map.insert(begin, end, step).unwrap();
            model.insert(begin, (end, step));
        }
        let Some((&b, &(e, v))) = model.iter().nth(rng.below(model.len() as u64) as usize) else {
            continue;
        };
        let addr = b + rng.below((e - b) as u64) as usize;
        assert_eq!(map.find(&guard, addr).unwrap().map(|s| *s.value()), Some(v));
        match rng.below(3) {
            0 => {
                map.remove(b).unwrap();
                model.remove(&b);
                removed_then_missed += 1;
            }
            1 => {
                map.remove(b).unwrap();
                map.insert(b, e, v + 100_000).unwrap();
                model.insert(b, (e, v + 100_000));
            }
            _ => {}
        }
        assert_eq!(
            map.find(&guard, addr).unwrap().map(|s| *s.value()),
            expected(&model, addr),
            "step {step} addr {addr:#x}"
        );
    }
    assert!(removed_then_missed > 500, "{removed_then_missed}");
}

/// Two maps in one domain, searched with one guard: each answers from its own
/// sections, whichever the guard found last.
#[test]
fn one_guard_over_two_maps_keeps_them_apart() {
    let (d, first) = setup();
    let second: RangeSectionMap<u64> = RangeSectionMap::new(&d);
    first.insert(BASE, BASE + CHUNK, 1).unwrap();
    second.insert(BASE + 0x100, BASE + 0x200, 2).unwrap();
    let reader = d.register().unwrap();
    let guard = reader.pin().unwrap();
    for _ in 0..3 {
        assert_eq!(
            first
                .find(&guard, BASE + 0x180)
                .unwrap()
                .map(|s| *s.value()),
            Some(1)
        );
        assert_eq!(
            second
                .find(&guard, BASE + 0x180)
                .unwrap()
                .map(|s| *s.value()),
            Some(2)
        );
        assert_eq!(
            second
                .find(&guard, BASE + 0x80)
                .unwrap()
                .map(|s| *s.value()),
            None
        );
        assert_eq!(
            first.find(&guard, BASE + 0x80).unwrap().map(|s| *s.value()),
            Some(1)
        );
    }
    // A map dropped while the guard remembers one of its sections, and a new
    // one (perhaps where it was): the new map never answers with the old one's.
    assert_eq!(
        second
            .find(&guard, BASE + 0x180)
            .unwrap()
            .map(|s| *s.value()),
        Some(2)
    );
    drop(second);
    let third: RangeSectionMap<u64> = RangeSectionMap::new(&d);
    assert_eq!(
        first
            .find(&guard, BASE + 0x180)
            .unwrap()
            .map(|s| *s.value()),
        Some(1)
    );
    assert_eq!(
        third
            .find(&guard, BASE + 0x180)
            .unwrap()
            .map(|s| *s.value()),
        None
    );
}

#[test]
fn removal_waits_for_pinned_readers() {
    let domain = Domain::new(2);
    let map: RangeSectionMap<Arc<String>> = RangeSectionMap::new(&domain);
    let value = Arc::new("section".to_string());
    let weak: Weak<String> = Arc::downgrade(&value);
    map.insert(BASE, BASE + 0x1000, value).unwrap();
    let reader = domain.register().unwrap();
    let guard = reader.pin().unwrap();
    let section = map.find(&guard, BASE + 8).unwrap().unwrap();
    map.remove(BASE).unwrap();
    assert!(
        map.find(&guard, BASE + 8).unwrap().is_none(),
        "unlinked at once"
    );
    assert_eq!(map.try_reclaim(), 0);
    assert_eq!(
        (section.begin(), section.end(), section.value().as_str()),
        (BASE, BASE + 0x1000, "section")
    );
    assert!(weak.upgrade().is_some());
    drop(guard);
    assert_eq!(map.try_reclaim(), 1);
    assert!(
        weak.upgrade().is_none(),
        "the value dropped after the grace period"
    );
    assert_eq!(map.retired(), 0);
}
