//! Property tests: canonical form after random sequences, exact agreement of v1,
//! v2 and the model at every address, and the two-word bound of v2.

use std::cell::Cell;

use jitmap::map_words::{VecWords, WordRead, WordStore};
use jitmap::nibble::words_for_span;
use jitmap::{MapError, MapVersion, MapWriter};
use jitmap_testkit::model::{MapModel, Verdict};
use jitmap_testkit::rng::Rng;
use jitmap_testkit::workload::{MapOp, map_op};

const SPAN: u64 = 16 * 1024;

fn writer(version: MapVersion, span: u64) -> MapWriter<VecWords> {
    MapWriter::with_store(version, span, VecWords::new(words_for_span(span))).unwrap()
}

fn all_words<S: WordRead>(w: &MapWriter<S>) -> Vec<u32> {
    (0..w.map().word_count()).map(|i| w.map().word(i)).collect()
}

/// Runs one seeded sequence against both maps and the model, checking canonical
/// form after every step. Returns the final maps and model.
fn run_sequence(seed: u64, steps: usize) -> (MapWriter<VecWords>, MapWriter<VecWords>, MapModel) {
    let mut rng = Rng::new(seed);
    let mut model = MapModel::new(SPAN);
    let mut v1 = writer(MapVersion::V1, SPAN);
    let mut v2 = writer(MapVersion::V2, SPAN);
    for step in 0..steps {
        match map_op(&mut rng, &model, SPAN) {
            MapOp::Set {
                verdict: Verdict::Hidden,
                ..
            } => continue,
            MapOp::Set {
                start,
                size,
                verdict,
            } => {
                let (r1, r2) = (v1.set(start, size), v2.set(start, size));
                if verdict == Verdict::Valid {
                    assert_eq!((r1, r2), (Ok(()), Ok(())), "seed {seed} step {step}");
                    model.insert(start, size);
                } else {
                    assert!(
                        r1.is_err() && r2.is_err(),
                        "seed {seed} step {step}: {r1:?} {r2:?}"
                    );
                }
            }
            MapOp::Delete { start, live } => {
                let expected = if live { Ok(()) } else { Err(()) };
                assert_eq!(
                    v1.delete(start).map_err(drop),
                    expected,
                    "seed {seed} step {step}"
                );
                assert_eq!(
                    v2.delete(start).map_err(drop),
                    expected,
                    "seed {seed} step {step}"
                );
                model.remove(start);
            }
        }
        assert_eq!(
            all_words(&v1),
            model.canonical_words(MapVersion::V1),
            "v1 seed {seed} step {step}"
        );
        assert_eq!(
            all_words(&v2),
            model.canonical_words(MapVersion::V2),
            "v2 seed {seed} step {step}"
        );
    }
    (v1, v2, model)
}

#[test]
fn canonical_form_after_random_sequences() {
    for seed in 0..3000 {
        run_sequence(seed, 40);
    }
}

#[test]
fn v1_v2_and_model_agree_at_every_address() {
    for seed in 10_000..10_200 {
        let (v1, v2, model) = run_sequence(seed, 60);
        let live: Vec<u64> = model.live().keys().copied().collect();
        assert_eq!(v1.map().starts().collect::<Vec<_>>(), live);
        assert_eq!(v2.map().starts().collect::<Vec<_>>(), live);
        for addr in 0..SPAN + 64 {
            let inside = model.containing(addr).map(|(s, _)| s);
            let (a1, a2) = (v1.map().find(addr), v2.map().find(addr));
            if inside.is_some() {
                assert_eq!((a1, a2), (inside, inside), "seed {seed} addr {addr:#x}");
            }
            assert_eq!(
                a1,
                model.expected(MapVersion::V1, addr),
                "v1 seed {seed} addr {addr:#x}"
            );
            assert_eq!(
                a2,
                model.expected(MapVersion::V2, addr),
                "v2 seed {seed} addr {addr:#x}"
            );
        }
    }
}

/// Word storage that counts loads.
struct Counting {
    inner: VecWords,
    loads: Cell<usize>,
}

impl WordRead for Counting {
    fn word_count(&self) -> usize {
        self.inner.word_count()
    }
    fn load(&self, index: usize) -> u32 {
        self.loads.set(self.loads.get() + 1);
        self.inner.load(index)
    }
}

impl WordStore for Counting {
    fn store(&self, index: usize, value: u32) {
        self.inner.store(index, value);
    }
}

fn counting(version: MapVersion, span: u64) -> MapWriter<Counting> {
    let store = Counting {
        inner: VecWords::new(words_for_span(span)),
        loads: Cell::new(0),
    };
    MapWriter::with_store(version, span, store).unwrap()
}

fn loads_for(w: &MapWriter<Counting>, addr: u64) -> (Option<u64>, usize) {
    w.map().words().loads.set(0);
    let found = w.map().find(addr);
    (found, w.map().words().loads.get())
}

#[test]
fn v2_reads_at_most_two_words() {
    let mut rng = Rng::new(7);
    let span = 1 << 20;
    let mut w = counting(MapVersion::V2, span);
    let mut model = MapModel::new(span);
    for _ in 0..400 {
        let size = jitmap_testkit::workload::method_size(&mut rng, 128 * 1024);
        let start = rng.below(span) & !15;
        if model.judge(start, size) == Verdict::Valid {
            w.set(start, size).unwrap();
            model.insert(start, size);
        }
    }
    let mut max = 0;
    for addr in 0..span {
        let (found, loads) = loads_for(&w, addr);
        assert_eq!(found, model.expected(MapVersion::V2, addr));
        max = max.max(loads);
    }
    assert_eq!(max, 2, "the bound is reached and never exceeded");
}

#[test]
fn v1_walks_back_one_word_per_256_bytes() {
    let mut w = counting(MapVersion::V1, 1 << 20);
    w.set(0, 64 * 1024).unwrap();
    assert_eq!(loads_for(&w, 64 * 1024 - 1), (Some(0), 256));
    assert_eq!(loads_for(&w, 255), (Some(0), 1));
    let mut w2 = counting(MapVersion::V2, 1 << 20);
    w2.set(0, 64 * 1024).unwrap();
    assert_eq!(loads_for(&w2, 64 * 1024 - 1), (Some(0), 1));
    assert_eq!(loads_for(&w2, 64 * 1024), (Some(0), 2), "past the end");
    assert_eq!(loads_for(&w2, 64 * 1024 + 256), (None, 2));
}

#[test]
fn rejected_sets_report_the_conflicting_start() {
    let mut rng = Rng::new(99);
    for _ in 0..2000 {
        let mut w = writer(MapVersion::V2, SPAN);
        let a = rng.below(SPAN / 2) & !3;
        w.set(a, rng.range(1, 512)).unwrap();
        let b = a - a % 32 + rng.below(32) / 4 * 4;
        let err = w.set(b, 4).unwrap_err();
        assert_eq!(
            err,
            MapError::BucketOccupied {
                start: b,
                existing: a
            }
        );
    }
}
