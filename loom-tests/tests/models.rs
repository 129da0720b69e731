//! loom models of jitmap's writer/reader protocols, over the library's real code
//! (its atomics come from `jitmap::sync`, which is loom's under `--cfg loom`).
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test -p jitmap-loom-tests --release`
#![cfg(loom)]

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex};

use jitmap::defect::{self, Defect};
use jitmap::end_words::{EndWords, RawEnds};
use jitmap::map_words::VecWords;
use jitmap::nibble::{find_v2_placed, words_for_span};
use jitmap::range::RangeSectionMap;
use jitmap::{Domain, MapVersion, MapWriter};
use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use loom::thread;

/// The C ABI's handle table, built alone (as the library's counters are).
#[path = "../../capi/src/table.rs"]
#[allow(dead_code)]
mod table;

const SPAN: u64 = 0x800;

/// A code header as the heap keeps it: plain memory, read by lookups without
/// atomics and freed (here: poisoned) by reclamation. loom reports any read that
/// is not ordered before the poisoning write, which atomic stand-ins would hide.
struct Header(UnsafeCell<u64>);

// SAFETY: access is ordered by the protocol under test; loom checks it.
unsafe impl Sync for Header {}

impl Header {
    fn new() -> Arc<Self> {
        Arc::new(Self(UnsafeCell::new(LIVE)))
    }

    /// A lookup's read of the header.
    fn read(&self) -> u64 {
        // SAFETY: the reader holds a guard; loom checks that reclamation waits.
        self.0.with(|p| unsafe { *p })
    }

    /// Reclamation: the header's memory is reused.
    fn reclaim(&self) {
        // SAFETY: called only once the grace period has passed; loom checks it.
        self.0.with_mut(|p| unsafe { *p = POISON });
    }
}
const LIVE: u64 = 0xC0DE;
const POISON: u64 = 0xDEAD;

/// Runs `f` under loom, with bounds from the `LOOM_*` variables (see
/// [`explored`]).
fn model(f: impl Fn() + Sync + Send + 'static) {
    explored(loom::model, f);
}

/// Runs `f` under loom in a thread whose stack fits range-map levels of 256 loom
/// atomics (loom's main model thread has a small, fixed stack). Building and
/// dropping those levels are loom operations too, so the branch limit is raised.
fn model_big_stack(f: impl Fn() + Sync + Send + 'static) {
    explored(
        |f| {
            let f = Arc::new(f);
            let mut builder = loom::model::Builder::new();
            builder.max_branches = builder.max_branches.max(20_000);
            builder.check(move || {
                let f = Arc::clone(&f);
                thread::Builder::new()
                    .stack_size(8 << 20)
                    .spawn(move || f())
                    .unwrap()
                    .join()
                    .unwrap();
            });
        },
        f,
    );
}

/// Runs model `f` through `run` and fails unless loom explored more than one
/// interleaving. Every model here races two threads or more, so one
/// interleaving means loom lost the race, and the model checked nothing. loom
/// 0.7 does lose one: when a thread loads an atomic and then stores to it
/// (the map writer's nibble update, the end map's), another thread's earlier
/// load of it is forgotten, and no other order is tried (tokio-rs/loom#392).
/// The models put the writer on the model's main thread and the readers on
/// spawned ones, which keeps every race in view.
fn explored(run: impl FnOnce(Box<dyn Fn() + Sync + Send>), f: impl Fn() + Sync + Send + 'static) {
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    run(Box::new(move || {
        // Relaxed: counted and read on this test's OS thread, which runs
        // every loom thread in turn.
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        f();
    }));
    // Relaxed: as above.
    let runs = runs.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        runs > 1,
        "loom explored {runs} interleaving: the model checks nothing"
    );
}

/// What a model's reader answered, over every interleaving loom explored.
/// `explored` proves that loom tried more than one order; this proves it
/// tried the ones that matter: each answer the race allows turned up.
struct Seen<T>(Arc<Mutex<BTreeSet<T>>>);

impl<T> Clone for Seen<T> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<T: Ord + Debug> Seen<T> {
    fn new() -> Self {
        Self(Arc::new(Mutex::new(BTreeSet::new())))
    }

    /// Records one answer (from a loom thread: one runs at a time).
    fn add(&self, answer: T) {
        self.0.lock().unwrap().insert(answer);
    }

    /// Fails unless the answers were exactly `all`.
    fn assert_all(&self, all: impl IntoIterator<Item = T>) {
        assert_eq!(*self.0.lock().unwrap(), all.into_iter().collect());
    }
}

fn writer(version: MapVersion) -> MapWriter<VecWords> {
    MapWriter::with_store(version, SPAN, VecWords::new(words_for_span(SPAN))).unwrap()
}

/// A reader looks up an address in live block A while a writer publishes B next
/// to it; the reader always finds A.
fn neighbour_publish(version: MapVersion, a: (u64, u64), b: (u64, u64), probe: u64) {
    model(move || {
        let mut w = writer(version);
        w.set(a.0, a.1).unwrap();
        let map = Arc::clone(w.map());
        let reader = thread::spawn(move || assert_eq!(map.find(probe), Some(a.0)));
        w.set(b.0, b.1).unwrap();
        reader.join().unwrap();
    });
}

#[test]
fn neighbour_shares_start_word() {
    for v in [MapVersion::V1, MapVersion::V2] {
        // A at 0x10 (word 0); B starts in word 0 too and covers word 1.
        neighbour_publish(v, (0x10, 0x20), (0x80, 0x200), 0x2F);
    }
}

#[test]
fn neighbour_pointer_words() {
    for v in [MapVersion::V1, MapVersion::V2] {
        // A's pointer words are 3 and 4; B starts in word 5, which holds A's tail.
        neighbour_publish(v, (0x210, 0x300), (0x520, 0x100), 0x50F);
    }
}

/// A reader looks up addresses in B while B is published: each answer is B or
/// none, and once a lookup (through a pointer word) has found B, a later lookup
/// in B's start word finds it too.
fn publish_self(version: MapVersion) {
    let seen = Seen::new();
    let answers = seen.clone();
    model(move || {
        let mut w = writer(version);
        let map = Arc::clone(w.map());
        let answers = answers.clone();
        let reader = thread::spawn(move || {
            let through_pointer = map.find(0x1F0);
            let in_start_word = map.find(0x60);
            answers.add((through_pointer, in_start_word));
            assert!(
                matches!(through_pointer, None | Some(0x40)),
                "{through_pointer:?}"
            );
            assert!(
                matches!(in_start_word, None | Some(0x40)),
                "{in_start_word:?}"
            );
            if through_pointer == Some(0x40) {
                assert_eq!(in_start_word, Some(0x40), "B vanished between two lookups");
            }
        });
        w.set_allocated(0x40, 0x300).unwrap();
        reader.join().unwrap();
    });
    seen.assert_all([(None, None), (None, Some(0x40)), (Some(0x40), Some(0x40))]);
}

#[test]
fn publish_is_seen_whole_or_not_at_all() {
    publish_self(MapVersion::V1);
    publish_self(MapVersion::V2);
}

/// The writer fills a header (as a heap writes a block's prefix and slot, with
/// Relaxed stores), aborts that reservation, reuses the space, and publishes;
/// a reader that finds the block sees the published header, never the aborted
/// one or none.
fn header_published_with_block(version: MapVersion) {
    let seen = Seen::new();
    let answers = seen.clone();
    model(move || {
        let mut w = writer(version);
        let map = Arc::clone(w.map());
        let header = Arc::new(AtomicU64::new(0));
        let h = Arc::clone(&header);
        let answers = answers.clone();
        let reader = thread::spawn(move || {
            let found = map.find(0x2F0);
            answers.add(found);
            if found == Some(0x100) {
                // Relaxed: ordered by the map's publish, as in the heap.
                assert_eq!(h.load(Ordering::Relaxed), LIVE);
            }
        });
        // Relaxed: as above.
        header.store(POISON, Ordering::Relaxed); // a reservation that is aborted
        header.store(LIVE, Ordering::Relaxed); // the reservation that is published
        w.set_allocated(0x100, 0x200).unwrap(); // as the heap publishes
        reader.join().unwrap();
    });
    seen.assert_all([None, Some(0x100)]);
}

#[test]
fn aborted_or_unpublished_headers_are_never_seen() {
    header_published_with_block(MapVersion::V1);
    header_published_with_block(MapVersion::V2);
}

/// How a reader ends after its lookup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum After {
    /// Unpins and stops.
    Unpin,
    /// Unpins, then pins again at depth 0 (the next profiler sample) and unpins.
    Repin,
    /// Unpins, then drops its `Reader` (the thread exits).
    DropReader,
}

/// A reader pins (optionally nesting a second pin, as a signal handler does),
/// looks up and reads the header; the writer unpublishes, retires and reclaims
/// (poisons the header) when the grace period allows. The reader's read is
/// always ordered before the poisoning, whatever the reader does after its last
/// unpin.
fn grace_period(nested: bool, after: After) {
    model(move || {
        let domain = Domain::new(2);
        let mut w = writer(MapVersion::V2);
        w.set(0x100, 0x200).unwrap();
        let map = Arc::clone(w.map());
        let header = Header::new();
        let (d, h) = (Arc::clone(&domain), Arc::clone(&header));
        let reader = thread::spawn(move || {
            let r = d.register().unwrap();
            let outer = r.pin().unwrap();
            if nested {
                drop(r.pin().unwrap());
            }
            if map.find(0x250) == Some(0x100) {
                assert_eq!(h.read(), LIVE);
            }
            drop(outer);
            match after {
                After::Unpin => {}
                After::Repin => drop(r.pin().unwrap()),
                After::DropReader => drop(r),
            }
        });
        w.delete(0x100).unwrap();
        let tag = domain.retire_tag();
        if domain.is_safe(tag) {
            header.reclaim();
        }
        reader.join().unwrap();
    });
}

#[test]
fn freed_memory_is_not_reclaimed_under_a_guard() {
    grace_period(false, After::Unpin);
}

#[test]
fn a_repin_after_the_last_unpin_keeps_earlier_reads_ordered() {
    grace_period(false, After::Repin);
}

#[test]
fn dropping_the_reader_keeps_earlier_reads_ordered() {
    grace_period(false, After::DropReader);
}

#[test]
fn nested_pin_keeps_the_outer_protection() {
    grace_period(true, After::Unpin);
}

/// Two readers, one plain and one nesting a pin, against a writer that frees and
/// reclaims: the writer's slot scan must respect both.
fn grace_period_two_readers() {
    model(|| {
        let domain = Domain::new(3);
        let mut w = writer(MapVersion::V2);
        w.set(0x100, 0x200).unwrap();
        let map = Arc::clone(w.map());
        let header = Header::new();
        let readers: Vec<_> = [false, true]
            .into_iter()
            .map(|nested| {
                let (d, h, m) = (Arc::clone(&domain), Arc::clone(&header), Arc::clone(&map));
                thread::spawn(move || {
                    let r = d.register().unwrap();
                    let outer = r.pin().unwrap();
                    if nested {
                        drop(r.pin().unwrap());
                    }
                    if m.find(0x250) == Some(0x100) {
                        assert_eq!(h.read(), LIVE);
                    }
                    drop(outer);
                })
            })
            .collect();
        w.delete(0x100).unwrap();
        let tag = domain.retire_tag();
        if domain.is_safe(tag) {
            header.reclaim();
        }
        for r in readers {
            r.join().unwrap();
        }
    });
}

#[test]
fn two_readers_hold_the_grace_period() {
    grace_period_two_readers();
}

/// Code that may still be running: an executor comes online, loads a code
/// pointer from an indirection cell and "runs" the code (reads its bytes), then
/// passes a quiescent point; the writer unlinks the cell, frees, and reuses the
/// bytes (writes them) only when the grace period allows. Running is always
/// ordered before the reuse, including for an executor that comes online while
/// the writer frees.
fn executor_quiescence() {
    model(|| {
        const OLD: usize = 1;
        const NEW: usize = 2;
        let domain = Domain::new(2);
        let cell = Arc::new(AtomicUsize::new(OLD));
        let code = Header::new();
        let (d, c, k) = (Arc::clone(&domain), Arc::clone(&cell), Arc::clone(&code));
        let executor = thread::spawn(move || {
            let e = d.register_executor().unwrap();
            // Relaxed: the executor protocol, not this load, orders the code.
            if c.load(Ordering::Relaxed) == OLD {
                assert_eq!(k.read(), LIVE, "ran reused code");
            }
            e.quiescent();
        });
        // Relaxed: as above; the free's fence orders the unlink.
        cell.store(NEW, Ordering::Relaxed);
        let tag = domain.retire_tag();
        if domain.is_safe(tag) {
            code.reclaim();
        }
        executor.join().unwrap();
    });
}

#[test]
fn freed_code_is_not_reused_before_the_executor_quiesces() {
    executor_quiescence();
}

/// Counts live copies of a range-map value: fragments hold clones.
struct Tracker(Arc<AtomicUsize>);

impl Clone for Tracker {
    fn clone(&self) -> Self {
        self.0.fetch_add(1, Ordering::SeqCst);
        Self(Arc::clone(&self.0))
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

const BASE: usize = 0x7f00_0000_0000;

/// A reader finds a section while the writer removes (and reclaims) it: the
/// fragment the reader holds stays alive until the reader unpins.
#[test]
fn range_removal_waits_for_readers() {
    range_removal();
}

fn range_removal() {
    model_big_stack(|| {
        let domain = Domain::new(2);
        let map = Arc::new(RangeSectionMap::new(&domain));
        let copies = Arc::new(AtomicUsize::new(1));
        map.insert(BASE, BASE + 0x100, Tracker(Arc::clone(&copies)))
            .unwrap();
        let (m, d, c) = (Arc::clone(&map), Arc::clone(&domain), Arc::clone(&copies));
        let reader = thread::spawn(move || {
            let r = d.register().unwrap();
            let g = r.pin().unwrap();
            if let Some(s) = m.find(&g, BASE + 8).unwrap() {
                assert_eq!((s.begin(), s.end()), (BASE, BASE + 0x100));
                assert_eq!(
                    c.load(Ordering::SeqCst),
                    1,
                    "the fragment was freed under a guard"
                );
            }
            drop(g);
        });
        map.remove(BASE).unwrap();
        map.try_reclaim();
        reader.join().unwrap();
    });
}

/// A reader finds a section, then finds it again with the same guard (from the
/// guard's memory of it) while the writer removes and reclaims it. The second
/// answer is the live section or nothing; and once the reader has seen the
/// writer's "removed" flag, it is nothing: the guard's memory never outlives
/// the section in the map.
#[test]
fn a_guard_never_remembers_a_removed_section() {
    remembered_section();
}

fn remembered_section() {
    model_big_stack(|| {
        let domain = Domain::new(2);
        let map = Arc::new(RangeSectionMap::new(&domain));
        let copies = Arc::new(AtomicUsize::new(1));
        let removed = Arc::new(AtomicBool::new(false));
        map.insert(BASE, BASE + 0x100, Tracker(Arc::clone(&copies)))
            .unwrap();
        let (m, d, c, f) = (
            Arc::clone(&map),
            Arc::clone(&domain),
            Arc::clone(&copies),
            Arc::clone(&removed),
        );
        let reader = thread::spawn(move || {
            let r = d.register().unwrap();
            let g = r.pin().unwrap();
            if m.find(&g, BASE + 8).unwrap().is_none() {
                return;
            }
            let seen_removed = f.load(Ordering::Acquire);
            let again = m.find(&g, BASE + 0x10).unwrap();
            if seen_removed {
                assert!(again.is_none(), "a removed section answered from the guard");
            }
            if let Some(s) = again {
                assert_eq!((s.begin(), s.end()), (BASE, BASE + 0x100));
                assert_eq!(
                    c.load(Ordering::SeqCst),
                    1,
                    "the fragment was freed under a guard"
                );
            }
        });
        map.remove(BASE).unwrap();
        removed.store(true, Ordering::Release);
        map.try_reclaim();
        reader.join().unwrap();
    });
}

/// A reader looks up while a section is inserted: none, or the whole section.
#[test]
fn range_insert_is_seen_whole_or_not_at_all() {
    model_big_stack(|| {
        let domain = Domain::new(2);
        let map = Arc::new(RangeSectionMap::new(&domain));
        let m = Arc::clone(&map);
        let writer = thread::spawn(move || m.insert(BASE, BASE + 0x100, 7u64).unwrap());
        let r = domain.register().unwrap();
        let g = r.pin().unwrap();
        if let Some(s) = map.find(&g, BASE + 0xFF).unwrap() {
            assert_eq!((s.begin(), s.end(), *s.value()), (BASE, BASE + 0x100, 7));
        }
        drop(g);
        writer.join().unwrap();
    });
}

/// Runs `model` with `defect` seeded and reports whether loom caught it.
fn caught(defect: Defect, model: impl FnOnce()) -> bool {
    defect::seed(Some(defect));
    let failed = catch_unwind(AssertUnwindSafe(model)).is_err();
    defect::seed(None);
    failed
}

#[test]
fn seeded_unchecked_section_memory_is_caught() {
    assert!(caught(Defect::SectionCacheUnchecked, remembered_section));
}

#[test]
fn seeded_relaxed_publish_is_caught() {
    assert!(caught(Defect::RelaxedPublish, || {
        header_published_with_block(MapVersion::V2)
    }));
}

#[test]
fn seeded_pointers_before_nibble_is_caught() {
    assert!(caught(Defect::PointersBeforeNibble, || publish_self(
        MapVersion::V2
    )));
}

#[test]
fn seeded_skipped_grace_period_is_caught() {
    assert!(caught(Defect::SkipGracePeriod, || grace_period(
        false,
        After::Unpin
    )));
    assert!(caught(Defect::SkipGracePeriod, range_removal));
    assert!(caught(Defect::SkipGracePeriod, grace_period_two_readers));
}

#[test]
fn seeded_nested_unpin_clearing_the_outer_guard_is_caught() {
    assert!(caught(Defect::NestedUnpinClears, || grace_period(
        true,
        After::Unpin
    )));
    assert!(caught(Defect::NestedUnpinClears, grace_period_two_readers));
}

#[test]
fn seeded_relaxed_repin_is_caught() {
    assert!(caught(Defect::RelaxedRepin, || grace_period(
        false,
        After::Repin
    )));
    assert!(caught(Defect::RelaxedRepin, || grace_period(
        false,
        After::DropReader
    )));
}

#[test]
fn seeded_skipped_grace_period_is_caught_for_executors() {
    assert!(caught(Defect::SkipGracePeriod, executor_quiescence));
}

/// Probes racing on one call counter (threshold 1, so every call reaches the
/// crossing), with the compiler thread taking crossings meanwhile: exactly one
/// call reports the crossing, and the cell is taken exactly once.
#[test]
fn a_call_counter_crosses_and_is_taken_exactly_once() {
    call_counter_race();
}

#[test]
fn seeded_check_then_set_crossing_is_caught() {
    assert!(caught(Defect::CheckThenSetCrossing, call_counter_race));
}

fn call_counter_race() {
    use jitmap::counters::{CallCounters, jitmap_probe_count};
    model(|| {
        let counters = Arc::new(CallCounters::new(2, 1).unwrap());
        let probes: Vec<_> = (0..2)
            .map(|_| {
                let counters = Arc::clone(&counters);
                thread::spawn(move || {
                    // SAFETY: the cell belongs to `counters`, alive in this thread.
                    unsafe { jitmap_probe_count(counters.cell(1).unwrap()) }
                })
            })
            .collect();
        let early = counters.take_crossed();
        let crossings: u32 = probes.into_iter().map(|p| p.join().unwrap()).sum();
        let mut taken = early;
        taken.extend(counters.take_crossed());
        assert_eq!(crossings, 1);
        assert_eq!(taken, [1]);
        assert_eq!(counters.take_crossed(), Vec::<u32>::new());
    });
}

/// A re-armed counter crosses once more, while a probe races with the re-arm:
/// never twice for one arming, never lost once the probe saw it armed.
#[test]
fn a_rearmed_call_counter_crosses_once_more() {
    use jitmap::counters::{CallCounters, jitmap_probe_count};
    model(|| {
        let counters = Arc::new(CallCounters::new(1, 1).unwrap());
        // SAFETY: the cell belongs to `counters`, alive for the model.
        assert_eq!(unsafe { jitmap_probe_count(counters.cell(0).unwrap()) }, 1);
        assert_eq!(counters.take_crossed(), [0]);
        let probe = {
            let counters = Arc::clone(&counters);
            thread::spawn(move || {
                // SAFETY: as above.
                unsafe { jitmap_probe_count(counters.cell(0).unwrap()) }
            })
        };
        counters.rearm(0, 1).unwrap();
        let raced = probe.join().unwrap();
        // SAFETY: as above.
        let after = unsafe { jitmap_probe_count(counters.cell(0).unwrap()) };
        assert_eq!(raced + after, 1, "one crossing per arming");
        assert_eq!(counters.take_crossed(), [0]);
    });
}

/// A writer changes two words under a change sequence (as a heap changes its
/// start and end maps, or a range map its fragment links) while a reader that
/// cannot pin reads both: whenever the reader's sequence checks pass, it saw
/// both words from one state, never one old and one new.
fn change_seq_pair() {
    use jitmap::change_seq::ChangeSeq;
    model(|| {
        let shared = Arc::new((ChangeSeq::new(), AtomicU64::new(0), AtomicU64::new(0)));
        let writer = {
            let shared = Arc::clone(&shared);
            thread::spawn(move || {
                for value in 1..=2 {
                    shared.0.begin();
                    // Relaxed: ordered by the sequence's fences, which is the claim.
                    shared.1.store(value, Ordering::Relaxed);
                    shared.2.store(value, Ordering::Relaxed);
                    shared.0.end();
                }
            })
        };
        let seen = shared.0.read();
        // Relaxed: as the writer's stores.
        let a = shared.1.load(Ordering::Relaxed);
        let b = shared.2.load(Ordering::Relaxed);
        if shared.0.validate(seen) {
            assert_eq!(a, b, "a validated read mixed two states");
            assert_eq!(seen, 2 * a, "the sequence names the state read");
        }
        writer.join().unwrap();
    });
}

#[test]
fn change_sequence_readers_see_whole_changes() {
    change_seq_pair();
}

#[test]
fn seeded_unfenced_change_sequence_is_caught() {
    assert!(caught(Defect::SeqNoFence, change_seq_pair));
}

/// Block A (bytes 0x20..=0x3F) ends in word 0; block B starts later in word 0
/// (bucket 5, at 0xA0) and runs into word 1, ending at 0x19F.
const A: (u64, u64) = (0x20, 0x20);
const B: (u64, u64) = (0xA0, 0x100);

/// The heap's exact v2 lookup over a start map and end words: the start map
/// names a start and where it found it, and the end word for that origin says
/// whether the block ended before `offset` (`HeapLookup::start_v2`'s
/// composition, through the same two functions). The heap keeps its own copy
/// of these few lines: one function shared by both, tried, changed the
/// compiler's register choices in the timed loops and cost the manager 8% at
/// 1 KiB (three alternated `compare` runs).
fn exact(map: &jitmap::NibbleMap<VecWords>, ends: &[AtomicU64], offset: u64) -> Option<u64> {
    let (start, origin) = find_v2_placed(map.words(), offset)?;
    // SAFETY: `ends` outlives the view, has a word per 256 bytes of the span,
    // and the map named `start` for `offset` from `origin`.
    let ended = unsafe { RawEnds::over(ends).ended(offset, start, origin) };
    (!ended).then_some(start)
}

/// End words for the model's span, with A marked and published in `w`.
fn with_a(w: &mut MapWriter<VecWords>) -> Arc<Vec<AtomicU64>> {
    let ends: Arc<Vec<AtomicU64>> = Arc::new(
        (0..words_for_span(SPAN))
            .map(|_| AtomicU64::new(0))
            .collect(),
    );
    EndWords::new(&ends).mark(A.0, A.1, false);
    w.set_allocated(A.0, A.1).unwrap();
    ends
}

/// While the writer publishes B as the heap does (end words marked, then the
/// start map's Release stores), a reader looks up an address of B in word 1:
/// B or nothing, never A, whose start is the last the start map shows in
/// word 0 until B's appears. Then an address in A (always A) and one past B's
/// end in word 1 (never anything).
fn runs_on_during_publish() {
    let seen = Seen::new();
    let answers = seen.clone();
    model(move || {
        let mut w = writer(MapVersion::V2);
        let ends = with_a(&mut w);
        let map = Arc::clone(w.map());
        let (m, e) = (Arc::clone(&map), Arc::clone(&ends));
        let answers = answers.clone();
        let reader = thread::spawn(move || {
            let in_b = exact(&m, &e, 0x150);
            answers.add(in_b);
            assert!(matches!(in_b, None | Some(0xA0)), "{in_b:x?}");
            assert_eq!(exact(&m, &e, 0x30), Some(A.0));
            assert_eq!(exact(&m, &e, 0x1B0), None);
        });
        EndWords::new(&ends).mark(B.0, B.1, false);
        w.set_allocated(B.0, B.1).unwrap();
        reader.join().unwrap();
        assert_eq!(exact(&map, &ends, 0x150), Some(B.0));
    });
    seen.assert_all([None, Some(B.0)]);
}

#[test]
fn a_block_being_published_runs_on_for_itself_only() {
    runs_on_during_publish();
}

#[test]
fn seeded_runs_on_flag_is_caught_during_publish() {
    assert!(caught(Defect::RunsOnAnyBucket, runs_on_during_publish));
}

/// The writer frees B as the heap does (start map cleared, then the end words
/// cleared once the grace period allows) while a pinned reader looks up an
/// address of B in word 1: B or nothing, never A, although B's end-word
/// marks outlive its start until reclamation.
fn runs_on_after_free() {
    let seen = Seen::new();
    let answers = seen.clone();
    model(move || {
        let domain = Domain::new(2);
        let mut w = writer(MapVersion::V2);
        let ends = with_a(&mut w);
        EndWords::new(&ends).mark(B.0, B.1, false);
        w.set_allocated(B.0, B.1).unwrap();
        let map = Arc::clone(w.map());
        let (d, e) = (Arc::clone(&domain), Arc::clone(&ends));
        let answers = answers.clone();
        let reader = thread::spawn(move || {
            let r = d.register().unwrap();
            let guard = r.pin().unwrap();
            let in_b = exact(&map, &e, 0x150);
            answers.add(in_b);
            assert!(matches!(in_b, None | Some(0xA0)), "{in_b:x?}");
            assert_eq!(exact(&map, &e, 0x30), Some(A.0));
            drop(guard);
        });
        w.delete(B.0).unwrap();
        let tag = domain.retire_tag();
        if domain.is_safe(tag) {
            EndWords::new(&ends).clear(B.0, B.1);
        }
        reader.join().unwrap();
    });
    seen.assert_all([None, Some(B.0)]);
}

#[test]
fn a_freed_block_runs_on_for_nothing() {
    runs_on_after_free();
}

#[test]
fn seeded_runs_on_flag_is_caught_after_free() {
    assert!(caught(Defect::RunsOnAnyBucket, runs_on_after_free));
}

/// An object in the handle table: plain memory its drop poisons, so loom
/// reports a use's read that is not ordered before the drop.
struct Object(UnsafeCell<u64>);

// SAFETY: access is ordered by the table's protocol; loom checks it.
unsafe impl Sync for Object {}

impl Object {
    fn boxed(value: u64) -> Box<Self> {
        Box::new(Self(UnsafeCell::new(value)))
    }

    fn read(&self) -> u64 {
        // SAFETY: under a use of its handle; loom checks the removal waits.
        self.0.with(|p| unsafe { *p })
    }
}

impl Drop for Object {
    fn drop(&mut self) {
        // SAFETY: the object's last owner; loom checks no use reads now.
        self.0.with_mut(|p| unsafe { *p = POISON });
    }
}

const KIND: u8 = 1;

/// A use taken while another thread destroys the handle, then puts a new
/// object in the freed slot: the use sees the object it named (never the
/// poisoned one, never the new one), or is refused as destroyed; a removal
/// while the use is held is refused as in use.
#[test]
fn a_handle_used_while_destroyed_and_reused_sees_its_own_object_or_nothing() {
    let seen = Seen::new();
    let answers = seen.clone();
    model(move || {
        let table = Arc::new(table::Table::<2>::new());
        let handle = table.insert(KIND, Object::boxed(LIVE)).unwrap();
        let t = Arc::clone(&table);
        let answers = answers.clone();
        let user = thread::spawn(move || match t.take::<Object>(handle, KIND) {
            Ok(u) => {
                assert_eq!(u.get().read(), LIVE);
                answers.add("used");
            }
            Err(r) => {
                assert_eq!(r, table::Refusal::Destroyed);
                answers.add("destroyed");
            }
        });
        match table.remove::<Object>(handle, KIND) {
            Ok(object) => {
                drop(object);
                let again = table.insert(KIND, Object::boxed(0xBEEF)).unwrap();
                assert_ne!(again, handle, "a reused slot gets a new generation");
            }
            Err(r) => assert_eq!(r, table::Refusal::InUse),
        }
        user.join().unwrap();
    });
    seen.assert_all(["destroyed", "used"]);
}

/// Two threads race for the only use of one reservation-like object and
/// write it; a third takes a shared use and reads it. loom reports any two
/// of them touching the object at once.
#[test]
fn an_exclusive_use_excludes_every_other_use() {
    model(|| {
        let table = Arc::new(table::Table::<1>::new());
        let handle = table.insert(KIND, Object::boxed(LIVE)).unwrap();
        let writers: Vec<_> = (0..2)
            .map(|_| {
                let t = Arc::clone(&table);
                thread::spawn(move || {
                    if let Ok(mut e) = t.take_exclusive::<Object>(handle, KIND) {
                        // SAFETY: the exclusive use; loom checks it is alone.
                        e.get_mut().0.with_mut(|p| unsafe { *p += 1 });
                    }
                })
            })
            .collect();
        if let Ok(u) = table.take::<Object>(handle, KIND) {
            assert!(u.get().read() >= LIVE);
        }
        for w in writers {
            w.join().unwrap();
        }
        let last = table.remove::<Object>(handle, KIND).unwrap();
        assert!((LIVE..=LIVE + 2).contains(&last.read()));
    });
}

/// Two threads each create and destroy handles in a table of two slots,
/// through the lock-free free list: no slot is handed out twice at once
/// (each use reads back its own object), and afterwards both slots are free
/// and a third object does not fit.
#[test]
fn the_free_list_hands_each_slot_out_once() {
    model(|| {
        let table = Arc::new(table::Table::<2>::new());
        let others: Vec<_> = (0..2)
            .map(|i| {
                let t = Arc::clone(&table);
                thread::spawn(move || {
                    let value = 100 + i;
                    let h = t.insert(KIND, Object::boxed(value)).unwrap();
                    assert_eq!(t.take::<Object>(h, KIND).unwrap().get().read(), value);
                    drop(t.remove::<Object>(h, KIND).unwrap());
                })
            })
            .collect();
        for o in others {
            o.join().unwrap();
        }
        let a = table.insert(KIND, Object::boxed(1)).unwrap();
        let b = table.insert(KIND, Object::boxed(2)).unwrap();
        assert_eq!(
            table.insert(KIND, Object::boxed(3)).err(),
            Some(table::Refusal::Full)
        );
        assert_eq!(table.take::<Object>(a, KIND).unwrap().get().read(), 1);
        assert_eq!(table.take::<Object>(b, KIND).unwrap().get().read(), 2);
        drop(table.remove::<Object>(a, KIND).unwrap());
        drop(table.remove::<Object>(b, KIND).unwrap());
    });
}

/// Machine code as the models see it: bytes written by the compiler before
/// publication, read by callers that run it, overwritten when reused.
struct Code(UnsafeCell<u64>);

// SAFETY: access is ordered by the protocol under test; loom checks it.
unsafe impl Sync for Code {}

impl Code {
    fn new(bytes: u64) -> Self {
        Self(UnsafeCell::new(bytes))
    }

    fn read(&self) -> u64 {
        // SAFETY: ordered by the protocol under test; loom checks it.
        self.0.with(|p| unsafe { *p })
    }

    fn write(&self, bytes: u64) {
        // SAFETY: as above.
        self.0.with_mut(|p| unsafe { *p = bytes });
    }
}

impl Drop for Code {
    /// Freed memory is reused: loom reports a read not ordered before it.
    /// (Not while a caught model unwinds: a second panic would abort.)
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.write(POISON);
        }
    }
}

/// A JIT module's call cell (the library's `CallCell`, as jitmap-cranelift
/// uses it) switched from an old version to a new one, and the old version
/// freed, while an executor calls through the cell: the executor runs the
/// new version's bytes as written, and the old version's bytes are reused
/// only after the executor's quiescent point.
fn call_cell_swap(seen: Seen<usize>) {
    use jitmap::call::{CallCell, CodeAddress};
    const OLD: usize = 0x1000;
    const NEW: usize = 0x2000;
    model(move || {
        let domain = Domain::new(2);
        let cell = Arc::new(CallCell::new(CodeAddress::new(OLD)));
        let old = Arc::new(Code::new(LIVE));
        let new = Arc::new(Code::new(0));
        let (d, c, o, n, s) = (
            Arc::clone(&domain),
            Arc::clone(&cell),
            Arc::clone(&old),
            Arc::clone(&new),
            seen.clone(),
        );
        let executor = thread::spawn(move || {
            let e = d.register_executor().unwrap();
            let entry = c.get().get();
            let bytes = if entry == OLD { o.read() } else { n.read() };
            assert_eq!(
                bytes, LIVE,
                "ran bytes at {entry:#x} that were not live code"
            );
            e.quiescent();
            s.add(entry);
        });
        // The compiler writes the new version, then switches the cell.
        new.write(LIVE);
        cell.set(CodeAddress::new(NEW));
        // The old version's free: its bytes are reused once it is safe.
        let tag = domain.retire_tag();
        if domain.is_safe(tag) || defect::on(Defect::SkipGracePeriod) {
            old.write(POISON);
        }
        executor.join().unwrap();
    });
}

#[test]
fn a_swapped_call_cell_frees_its_old_code_only_after_the_executor_leaves() {
    let seen = Seen::new();
    call_cell_swap(seen.clone());
    seen.assert_all([0x1000, 0x2000]);
}

#[test]
fn seeded_relaxed_call_cell_switch_is_caught() {
    assert!(caught(Defect::RelaxedCellSet, || call_cell_swap(
        Seen::new()
    )));
    assert!(caught(Defect::SkipGracePeriod, || call_cell_swap(
        Seen::new()
    )));
}

/// What a late signal did: wrote into the record its token named, or found
/// nothing to write into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Late {
    WroteOwn,
    TookNothing,
}

/// A thread's timer signal arrives while the thread detaches, and the slot
/// is reused by another thread: the late handler writes into the record its
/// token named while that record is still registered, or takes nothing. It
/// never writes into the next record, and never into one being freed.
fn late_signal(seen: Seen<Late>) {
    use jitmap::registry::Registry;
    const SALT: u64 = 0x5A17 << 20;
    model(move || {
        let table = Arc::new(Registry::<Code, 1>::new());
        let first = Arc::new(Code::new(0));
        let registration = table.register(&first, SALT).unwrap();
        let token = registration.token();
        let (t, s) = (Arc::clone(&table), seen.clone());
        let handler = thread::spawn(move || {
            let in_flight = t.enter(token);
            // SAFETY: between `enter` and `leave`.
            let late = match unsafe { t.lookup(token) } {
                Some(record) => {
                    record.write(record.read() + 1);
                    Late::WroteOwn
                }
                None => Late::TookNothing,
            };
            t.leave(in_flight);
            s.add(late);
        });
        table.unregister(registration);
        // The first record is freed, and another thread takes the slot.
        first.write(POISON);
        let second = Arc::new(Code::new(0));
        let next = table.register(&second, SALT).unwrap();
        assert_ne!(next.token(), token);
        handler.join().unwrap();
        assert_eq!(second.read(), 0, "a late signal wrote into the next record");
        table.unregister(next);
    });
}

#[test]
fn a_late_signal_never_writes_into_another_threads_record() {
    let seen = Seen::new();
    late_signal(seen.clone());
    seen.assert_all([Late::WroteOwn, Late::TookNothing]);
}

#[test]
fn seeded_unfenced_detach_is_caught() {
    assert!(caught(Defect::UnfencedDetach, || late_signal(Seen::new())));
}

/// The agent's table of native unwind rows replaced while a handler
/// searches it: the handler sees the old table or the new one whole, and
/// the old one is freed only after the handler's guard unpins.
fn table_swap(seen: Seen<u64>) {
    use jitmap::swap::Swap;
    model(move || {
        let domain = Domain::new(2);
        let swap = Arc::new(Swap::new(Code::new(1), Arc::clone(&domain)));
        let (d, w, s) = (Arc::clone(&domain), Arc::clone(&swap), seen.clone());
        let handler = thread::spawn(move || {
            let reader = d.register().unwrap();
            let guard = reader.pin().unwrap();
            let rows = w.get(&guard).unwrap().read();
            assert!(
                rows == 1 || rows == 2,
                "read a table that was not whole: {rows}"
            );
            drop(guard);
            s.add(rows);
        });
        let retired = swap
            .update(|old| {
                assert_eq!(old.read(), 1);
                let new = Code::new(0);
                new.write(2);
                Some(new)
            })
            .unwrap();
        // Freed now if its grace period has passed (a `Code` poisons itself
        // when dropped, so a table freed under the handler is caught).
        drop(retired);
        handler.join().unwrap();
    });
}

#[test]
fn a_swapped_table_outlives_the_handler_that_reads_it() {
    let seen = Seen::new();
    table_swap(seen.clone());
    seen.assert_all([1, 2]);
}

#[test]
fn seeded_relaxed_table_swap_is_caught() {
    assert!(caught(Defect::RelaxedSwap, || table_swap(Seen::new())));
    assert!(caught(Defect::SkipGracePeriod, || table_swap(Seen::new())));
}
