//! Regression tests for bugs found by review and by use. Each test failed before
//! its fix; the comment above it names the bug.

mod common;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak, mpsc};
use std::time::Duration;

use jitmap::events::{CodeEvent, CodeListener};
use jitmap::heap::{HeapStats, PREFIX};
use jitmap::image::{ImageError, ImageFunction, ImageInfo, ImageMethod};
use jitmap::manager::ManagerError;
use jitmap::map_words::{VecWords, WordRead};
use jitmap::nibble::{Capped, find_v1, find_v1_capped, words_for_span};
use jitmap::range::{MAX_SECTION_BYTES, RangeError, RangeSectionMap};
use jitmap::{
    CodeHeap, CodeInfo, Domain, EpochError, ExecutionManager, ForeignGuard, HeapConfig, HeapError,
    JitKind, MapVersion, MapWriter,
};

fn config(span: u64) -> HeapConfig {
    HeapConfig {
        span,
        ..HeapConfig::default()
    }
}

fn publish(heap: &CodeHeap, id: u64, size: u64) -> jitmap::CodeRef {
    let mut r = heap.reserve(size).unwrap();
    r.code_mut().fill(0xC3);
    r.publish(CodeInfo::new(id, format!("m{id}"), JitKind::Optimized))
        .unwrap()
}

/// Runs `f` on another thread and fails if it does not finish in 20 s: a
/// deadlock becomes a test failure, not a hung suite.
fn within_deadline<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(20))
        .expect("deadlock: the operation did not finish in 20 s")
}

// 2. A span of u64::MAX overflowed the page rounding: Ok with span 0 in release,
// a panic in debug.
#[test]
fn spans_that_overflow_or_reach_4_gib_are_bad_spans() {
    let domain = Domain::new(1);
    for span in [u64::MAX, u64::MAX - 4095, 1 << 32, (1 << 32) - 1, 0] {
        assert_eq!(
            CodeHeap::new(config(span), &domain).err(),
            Some(HeapError::BadSpan { span }),
            "span {span:#x}"
        );
    }
    let heap = CodeHeap::new(config((1 << 32) - 4096), &domain).unwrap();
    assert_eq!(heap.span(), (1 << 32) - 4096);
}

// 2. Address and size arithmetic at the edges: lookups of the extreme addresses,
// reservations at and past the top of the span.
#[test]
fn extreme_addresses_and_sizes_are_answered_exactly() {
    let m = ExecutionManager::new(2);
    let heap = m.create_heap(config(1 << 16)).unwrap();
    let a = publish(&heap, 1, 64);
    let r = m.register_reader().unwrap();
    let g = m.pin(&r).unwrap();
    for ip in [0, 1, usize::MAX, usize::MAX - 1, 1 << 57, heap.base() - 1] {
        assert!(g.find(ip).is_none(), "{ip:#x}");
        assert!(heap.find(&g, ip).unwrap().is_none(), "{ip:#x}");
        assert!(g.find_return_address(ip).is_none(), "{ip:#x}");
    }
    assert_eq!(g.find(a.start()).unwrap().method_id(), 1);
    drop(g);
    let max = (1 << 16) - PREFIX;
    for size in [u64::MAX, u64::MAX - PREFIX + 1, max + 1] {
        assert_eq!(
            heap.reserve(size).err(),
            Some(HeapError::TooLarge { size, max }),
            "{size:#x}"
        );
    }
    heap.free(a).unwrap();
    heap.try_reclaim();
    // The largest reservation fills the span exactly, up to its last byte.
    let mut r = heap.reserve(max).unwrap();
    r.code_mut().fill(0x90);
    let whole = r
        .publish(CodeInfo::new(2, "whole", JitKind::Optimized))
        .unwrap();
    assert_eq!(whole.start() + max as usize, heap.base() + (1 << 16));
    let reader = m.register_reader().unwrap();
    let g = m.pin(&reader).unwrap();
    let last = g.find(heap.base() + (1 << 16) - 1).unwrap();
    assert_eq!((last.method_id(), last.offset()), (2, max - 1));
    assert!(g.find(heap.base() + (1 << 16)).is_none());
}

// 2, 11. Image bases near the top of the address space, and sizes past what one
// section may cost: typed errors, nothing registered.
#[test]
fn images_at_the_top_of_the_address_space_or_too_large_are_refused() {
    let m = ExecutionManager::new(1);
    let image = |base: usize, size: usize| ImageInfo {
        base,
        size,
        ..ImageInfo::default()
    };
    assert_eq!(
        m.load_image(image(usize::MAX, 2)),
        Err(ManagerError::Range(RangeError::OutOfRange {
            begin: usize::MAX,
            end: usize::MAX
        }))
    );
    let top = (1usize << 57) - 0x1000;
    assert_eq!(
        m.load_image(image(top + 1, 0x1000)),
        Err(ManagerError::Range(RangeError::OutOfRange {
            begin: top + 1,
            end: top + 0x1001
        }))
    );
    assert_eq!(m.load_image(image(top, 0x1000)), Ok(top));
    assert_eq!(
        m.load_image(image(0x1000_0000_0000, 1 << 50)),
        Err(ManagerError::Image(ImageError::TooLarge { size: 1 << 50 }))
    );
    // The range map bounds a section's cost by itself too.
    let map = RangeSectionMap::new(&Domain::new(1));
    let begin = 0x1000_0000_0000;
    assert_eq!(
        map.insert(begin, begin + MAX_SECTION_BYTES + 1, ()),
        Err(RangeError::TooLarge {
            begin,
            end: begin + MAX_SECTION_BYTES + 1
        })
    );
    assert_eq!(map.len(), 0);
    map.insert(begin, begin + MAX_SECTION_BYTES, ()).unwrap();
    assert_eq!(map.len(), 1);
}

struct Panicker {
    seen: AtomicUsize,
}

impl CodeListener for Panicker {
    fn on_event(&self, event: &CodeEvent) {
        // Relaxed: a counter read after `flush`, which orders delivery before it.
        self.seen.fetch_add(1, Ordering::Relaxed);
        if matches!(event, CodeEvent::Load(_)) {
            panic!("a listener that panics on every load");
        }
    }
}

// 3. A panicking listener left the block visible but not live: no CodeRef, never
// freeable.
#[test]
fn a_panicking_listener_leaves_the_heap_consistent() {
    let (_d, heap) = common::small_heap(2);
    let listener = Arc::new(Panicker {
        seen: AtomicUsize::new(0),
    });
    heap.listeners().add(listener.clone()).unwrap();
    let a = publish(&heap, 1, 64);
    let b = publish(&heap, 2, 64);
    heap.listeners().flush();
    assert_eq!(heap.listeners().panics(), 2);
    assert_eq!(heap.stats().live_blocks, 2);
    let reader = heap.domain().register().unwrap();
    {
        let g = reader.pin().unwrap();
        let found = heap.find(&g, a.start() + 5).unwrap().unwrap();
        assert_eq!((found.start(), found.offset()), (a.start(), 5));
    }
    heap.free(a).unwrap();
    heap.free(b).unwrap();
    heap.listeners().flush();
    // Two loads (panicked) and two frees (delivered): delivery went on.
    // Relaxed: as in `on_event`.
    assert_eq!(listener.seen.load(Ordering::Relaxed), 4);
    assert_eq!(heap.listeners().panics(), 2);
    assert_eq!(heap.stats().live_blocks, 0);
}

/// A listener that reads the heap's statistics on every event.
struct StatsReader {
    heap: Mutex<Weak<CodeHeap>>,
    last: Mutex<Option<HeapStats>>,
}

impl CodeListener for StatsReader {
    fn on_event(&self, _: &CodeEvent) {
        if let Some(heap) = self.heap.lock().unwrap().upgrade() {
            *self.last.lock().unwrap() = Some(heap.stats());
        }
    }
}

// 6. Listeners ran under the heap lock: one that called `heap.stats()` deadlocked,
// and file I/O serialized every compiler thread.
#[test]
fn a_listener_may_call_back_into_the_heap() {
    let (_d, heap) = common::small_heap(2);
    let heap = Arc::new(heap);
    let listener = Arc::new(StatsReader {
        heap: Mutex::new(Arc::downgrade(&heap)),
        last: Mutex::new(None),
    });
    heap.listeners().add(listener.clone()).unwrap();
    let h = Arc::clone(&heap);
    let published = within_deadline(move || {
        let refs: Vec<_> = (0..3000).map(|i| publish(&h, i, 32)).collect();
        h.listeners().flush();
        refs.len()
    });
    assert_eq!(published, 3000);
    let last = listener.last.lock().unwrap().expect("the listener ran");
    assert_eq!(last.live_blocks, 3000);
    drop(listener);
}

/// Records the (kind, start) of every event, in delivery order.
#[derive(Default)]
struct Recorder(Mutex<Vec<(char, usize)>>);

impl CodeListener for Recorder {
    fn on_event(&self, event: &CodeEvent) {
        let entry = match event {
            CodeEvent::Load(l) => ('L', l.start),
            CodeEvent::Move(m) => ('M', m.new_start),
            CodeEvent::Free(f) => ('F', f.start),
            _ => ('?', 0),
        };
        self.0.lock().unwrap().push(entry);
    }
}

// 6. Events leave the lock but keep their order: four writers churn one heap
// (reusing addresses), and every address's events alternate load, free, load...
// exactly as the writers saw them. The queue never holds much more than its
// capacity.
#[test]
fn events_stay_in_order_off_the_lock() {
    let (_d, heap) = common::small_heap(2);
    let heap = Arc::new(heap);
    let recorder = Arc::new(Recorder::default());
    heap.listeners().add(recorder.clone()).unwrap();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let heap = Arc::clone(&heap);
            std::thread::spawn(move || {
                for i in 0..2000 {
                    let r = publish(&heap, t * 10_000 + i, 48);
                    heap.free(r).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    heap.listeners().flush();
    let events = recorder.0.lock().unwrap();
    assert_eq!(events.len(), 4 * 2000 * 2);
    let mut state = std::collections::HashMap::new();
    for &(kind, start) in events.iter() {
        let loaded = state.entry(start).or_insert(false);
        assert_eq!(
            (kind, *loaded),
            (if *loaded { 'F' } else { 'L' }, *loaded),
            "{start:#x}"
        );
        *loaded = !*loaded;
    }
    assert!(state.values().all(|loaded| !loaded));
}

// 7. Reclamation was not automatic: retired blocks waited for `try_reclaim`.
// Now free and reserve reclaim on the writer side, so while no reader is pinned
// what retired blocks hold stays bounded (32 blocks or 1 MiB).
#[test]
fn reclamation_is_automatic_and_bounded() {
    let (_d, heap) = common::small_heap(2);
    let mut max_retired = 0;
    for i in 0..1000 {
        let r = publish(&heap, i, 4000);
        heap.free(r).unwrap();
        max_retired = max_retired.max(heap.stats().retired_blocks);
    }
    let stats = heap.stats();
    // 16 blocks of 4,032 bytes fill the first 64 KiB commit; the 17th reservation
    // reclaims instead of committing more.
    assert_eq!(max_retired, 16);
    assert_eq!(stats.live_blocks, 0);
    // 1000 blocks of 4 KiB went through a heap that committed 64 KiB once.
    assert_eq!(stats.committed, 64 * 1024);
    assert!(stats.reclaimed_bytes >= 968 * 4000, "{stats:?}");

    // Large blocks are bounded by bytes: 1 MiB retired triggers a reclaim.
    let big = CodeHeap::new(config(16 << 20), heap.domain()).unwrap();
    for i in 0..40 {
        let r = publish(&big, i, 300_000);
        big.free(r).unwrap();
        assert!(big.stats().retired_blocks <= 4, "{:?}", big.stats());
    }
}

// 7. A dropped heap stayed mapped until someone called `manager.try_reclaim_sections()`
// when a reader was pinned at the drop. The next manager writer call frees it.
#[test]
fn a_heap_dropped_under_a_guard_is_freed_by_the_next_manager_call() {
    let m = ExecutionManager::new(2);
    let heap = m.create_heap(config(1 << 16)).unwrap();
    let weak = Arc::downgrade(heap.heap());
    let reader = m.register_reader().unwrap();
    let g = m.pin(&reader).unwrap();
    drop(heap);
    assert!(weak.upgrade().is_some(), "held for the pinned reader");
    drop(g);
    let other = m.create_heap(config(1 << 16)).unwrap();
    assert!(weak.upgrade().is_none(), "freed by create_heap");
    drop(other);
}

// 8. A guard from another domain silently found nothing.
#[test]
fn a_guard_from_another_manager_is_refused_everywhere() {
    let m = ExecutionManager::new(1);
    let heap = m.create_heap(config(1 << 16)).unwrap();
    let a = publish(&heap, 1, 64);
    let other = ExecutionManager::new(1);
    let reader = other.register_reader().unwrap();
    // The manager refuses to pin another manager's reader, so no lookup of it
    // can be given a foreign guard at all.
    assert_eq!(m.pin(&reader).err(), Some(EpochError::ForeignReader));
    // The heap layer, whose lookups take a plain guard, refuses one.
    let g = reader.pin().unwrap();
    assert!(matches!(heap.find(&g, a.start()), Err(ForeignGuard)));
    assert_eq!(HeapError::from(ForeignGuard), HeapError::ForeignGuard);
}

// 10. `unload_image` given a heap's base unregistered the live heap.
#[test]
fn unload_image_refuses_a_code_heap() {
    let m = ExecutionManager::new(1);
    let heap = m.create_heap(config(1 << 16)).unwrap();
    let a = publish(&heap, 1, 64);
    assert_eq!(
        m.unload_image(heap.base()),
        Err(ManagerError::NotAnImage { base: heap.base() })
    );
    let reader = m.register_reader().unwrap();
    let g = m.pin(&reader).unwrap();
    assert_eq!(g.find(a.start()).unwrap().method_id(), 1);
    drop(g);
    // And nothing can be loaded over it.
    let over = ImageInfo {
        base: heap.base(),
        size: 0x1000,
        functions: vec![ImageFunction {
            begin: 0,
            end: 0x10,
            unwind: Box::new([]),
        }],
        methods: vec![ImageMethod {
            entry: 0,
            method_id: 9,
            gc: None,
            debug: vec![],
            name: String::new(),
        }],
        ..ImageInfo::default()
    };
    assert_eq!(
        m.load_image(over),
        Err(ManagerError::Range(RangeError::Overlap {
            begin: heap.base(),
            existing: heap.base()
        }))
    );
    assert_eq!(
        m.unload_image(0x1234_0000),
        Err(ManagerError::Range(RangeError::NotFound {
            begin: 0x1234_0000
        }))
    );
}

// 12. `move_block` dropped the alignment the block was reserved with.
#[test]
fn a_moved_block_keeps_its_alignment() {
    let (_d, heap) = common::small_heap(1);
    for align in [64u64, 256, 4096] {
        let mut r = heap.reserve_aligned(256, align).unwrap();
        r.code_mut().fill(0x90);
        let mut code = r
            .publish(CodeInfo::new(align, "aligned", JitKind::Optimized))
            .unwrap();
        for _ in 0..4 {
            let moved = heap.move_block(code).unwrap();
            assert_ne!(moved.start(), code.start());
            assert_eq!(moved.start() % align as usize, 0, "align {align}");
            code = moved;
        }
        heap.free(code).unwrap();
    }
}

/// Word storage that counts its loads.
struct Counting<'a> {
    words: &'a VecWords,
    loads: AtomicU64,
}

impl WordRead for Counting<'_> {
    fn word_count(&self) -> usize {
        self.words.word_count()
    }

    fn load(&self, index: usize) -> u32 {
        // Relaxed: a read counter, used by this thread only.
        self.loads.fetch_add(1, Ordering::Relaxed);
        self.words.load(index)
    }
}

// 13. "Bounded" held only for v2. The capped v1 walk reads at most its cap and
// says "too far" rather than guess.
#[test]
fn a_capped_v1_walk_reads_at_most_its_cap() {
    let span = 1 << 20;
    let mut w =
        MapWriter::with_store(MapVersion::V1, span, VecWords::new(words_for_span(span))).unwrap();
    w.set(0x100, 64 * 1024).unwrap(); // words 1..=256
    w.set(0x20000, 64).unwrap();
    let map = w.map();
    assert!(!MapVersion::V1.is_bounded() && MapVersion::V2.is_bounded());
    let words = Counting {
        words: map.words(),
        loads: AtomicU64::new(0),
    };
    let tail = 0x100 + 64 * 1024 - 1; // word 256
    for (cap, expected, reads) in [
        (0, Capped::TooFar, 0),
        (1, Capped::TooFar, 1),
        (16, Capped::TooFar, 16),
        (256, Capped::Found(0x100), 256),
        (10_000, Capped::Found(0x100), 256),
    ] {
        // Relaxed: as in `load`.
        words.loads.store(0, Ordering::Relaxed);
        assert_eq!(find_v1_capped(&words, tail, cap), expected, "cap {cap}");
        // Relaxed: as in `load`.
        assert_eq!(words.loads.load(Ordering::Relaxed), reads, "cap {cap}");
    }
    // Agreement with the uncapped walk at every address, with a generous cap.
    for offset in (0..0x30000).step_by(61) {
        let capped = match find_v1(&words, offset) {
            Some(s) => Capped::Found(s),
            None => Capped::Nothing,
        };
        assert_eq!(find_v1_capped(&words, offset, 4096), capped, "{offset:#x}");
    }
    assert_eq!(find_v1_capped(&words, 0x50, 1), Capped::Nothing);
    assert_eq!(find_v1_capped(&words, span, 1), Capped::Nothing);
}

/// Records each event as (kind, start, name).
#[derive(Default)]
struct EventKinds {
    events: Mutex<Vec<(char, usize, String)>>,
}

impl CodeListener for EventKinds {
    fn on_event(&self, event: &CodeEvent) {
        let seen = match event {
            CodeEvent::Load(l) => ('L', l.start, l.info.name.clone()),
            CodeEvent::Move(m) => ('M', m.new_start, m.info.name.clone()),
            CodeEvent::Free(f) => ('F', f.start, f.info.name.clone()),
            _ => ('?', 0, String::new()),
        };
        self.events.lock().unwrap().push(seen);
    }
}

// Found by the soak (`jitmap-sim run --seconds 3600`): a heap dropped with
// live code told no listener that its code was gone, so the agent's
// collector kept every such version for the life of the process (the run's
// RSS grew by megabytes a minute, one unloaded heap after another).
#[test]
fn dropping_a_heap_frees_its_live_code_for_listeners() {
    let manager = jitmap::ExecutionManager::new(4);
    let recorder = Arc::new(EventKinds::default());
    manager.listeners().add(recorder.clone()).unwrap();
    let heap = manager
        .create_heap(jitmap::HeapConfig {
            span: 1 << 16,
            ..jitmap::HeapConfig::default()
        })
        .unwrap();
    let a = publish(&heap, 1, 64);
    let b = publish(&heap, 2, 64);
    let freed = publish(&heap, 3, 64);
    heap.free(freed).unwrap();
    drop(heap);
    manager.listeners().flush();
    let mut frees: Vec<(char, usize, String)> = recorder
        .events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e.0 == 'F')
        .cloned()
        .collect();
    frees.sort();
    let mut expected = vec![
        ('F', a.start(), "m1".to_owned()),
        ('F', b.start(), "m2".to_owned()),
        ('F', freed.start(), "m3".to_owned()),
    ];
    expected.sort();
    assert_eq!(frees, expected);
}
