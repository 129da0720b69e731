//! The execution manager: JIT and image lookups with the contract's full API.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Weak};

use jitmap::heap::StubKind;
use jitmap::heap::{DebugEntry, GcInfo, JitKind, UnwindEntry};
use jitmap::image::{HotCold, ImageError, ImageFunction, ImageInfo, ImageMethod, RegionInfo};
use jitmap::range::RangeError;
use jitmap::{CodeInfo, ExecutionManager, HeapConfig, Lookup, OwnedHeap};

fn small_heap(m: &ExecutionManager) -> OwnedHeap {
    m.create_heap(HeapConfig {
        span: 1 << 20,
        ..HeapConfig::default()
    })
    .unwrap()
}

fn unwind(begin: u32, end: u32, tag: u8) -> UnwindEntry {
    UnwindEntry {
        begin,
        end,
        data: vec![tag; 4].into_boxed_slice(),
    }
}

fn row(offset: u32, line: u32) -> DebugEntry {
    DebugEntry {
        offset,
        line,
        column: 1,
        file: "m.cs".into(),
    }
}

#[test]
fn jit_method_with_two_funclets() {
    let m = ExecutionManager::new(4);
    let heap = small_heap(&m);
    let info = CodeInfo {
        unwind: vec![unwind(0, 100, 1), unwind(100, 150, 2), unwind(150, 200, 3)],
        debug: vec![row(0, 10), row(40, 11), row(120, 20)],
        gc: Some(GcInfo {
            version: 3,
            bytes: vec![0xAB, 0xCD].into_boxed_slice(),
        }),
        ..CodeInfo::new(0xFEED, "Foo.Bar", JitKind::Optimized)
    };
    let code = heap.reserve(200).unwrap().publish(info).unwrap();
    let s = code.start();
    let reader = m.register_reader().unwrap();
    let g = m.pin(&reader).unwrap();
    let cases = [
        (0, s, false, 1, 10),
        (99, s, false, 1, 11),
        (100, s + 100, true, 2, 11),
        (149, s + 100, true, 2, 20),
        (150, s + 150, true, 3, 20),
        (199, s + 150, true, 3, 20),
    ];
    for (off, funclet, is_funclet, tag, line) in cases {
        let b = g.find(s + off).unwrap();
        assert_eq!(
            (b.method_id(), b.start(), b.offset()),
            (0xFEED, s, off as u64)
        );
        assert_eq!(
            (b.funclet_start(), b.is_funclet()),
            (funclet, is_funclet),
            "offset {off}"
        );
        assert_eq!(b.unwind_info(), Some(&[tag; 4][..]));
        assert_eq!(b.unwind_base(), heap.base());
        assert_eq!(b.debug_at().map(|r| r.line), Some(line));
        assert_eq!(b.debug_info().len(), 3);
        assert_eq!(
            b.gc_info().map(|g| (g.version, &*g.bytes)),
            Some((3, &[0xAB, 0xCD][..]))
        );
        assert_eq!(
            (b.jit_kind(), b.name()),
            (JitKind::Optimized, Some("Foo.Bar"))
        );
        assert_eq!(
            b.region(),
            RegionInfo {
                hot_size: 200,
                cold_start: None,
                cold_size: 0
            }
        );
    }
    assert!(g.find(s + 200).is_none(), "past the end");
    assert!(g.find(s - 1).is_none(), "header slot");
    assert_eq!(g.entry_to_method(s), Some(0xFEED));
    assert_eq!(g.entry_to_method(s + 100), None);
    assert_eq!(g.entry_to_method(s + 1), None);
}

#[test]
fn jit_cold_part_reports_regions() {
    let m = ExecutionManager::new(4);
    let heap = small_heap(&m);
    let info = CodeInfo {
        cold_offset: Some(0x60),
        ..CodeInfo::new(7, "hotcold", JitKind::Baseline)
    };
    let code = heap.reserve(0x100).unwrap().publish(info).unwrap();
    let reader = m.register_reader().unwrap();
    let g = m.pin(&reader).unwrap();
    let b = g.find(code.start() + 0x70).unwrap();
    assert_eq!(
        b.region(),
        RegionInfo {
            hot_size: 0x60,
            cold_start: Some(code.start() + 0x60),
            cold_size: 0xA0
        }
    );
    assert_eq!(b.offset(), 0x70);
    assert_eq!((b.funclet_start(), b.is_funclet()), (code.start(), false));
}

#[test]
fn stubs_and_free_space() {
    let m = ExecutionManager::new(4);
    let heap = small_heap(&m);
    let stub = heap
        .reserve(32)
        .unwrap()
        .publish_stub(StubKind::new(2).unwrap())
        .unwrap();
    let reader = m.register_reader().unwrap();
    let g = m.pin(&reader).unwrap();
    assert!(
        matches!(g.classify(stub.start() + 5), Lookup::Stub { kind, start, size: 32 } if kind.get() == 2 && start == stub.start())
    );
    assert!(g.find(stub.start() + 5).is_none());
    assert_eq!(g.entry_to_method(stub.start()), None);
    assert!(matches!(g.classify(stub.start() + 0x1000), Lookup::Nothing));
    assert!(matches!(g.classify(0x10), Lookup::Nothing));
}

const IMG: usize = 0x5555_0000_0000;

fn image() -> ImageInfo {
    let f = |begin, end, tag| ImageFunction {
        begin,
        end,
        unwind: vec![tag].into_boxed_slice(),
    };
    ImageInfo {
        base: IMG,
        size: 0x10000,
        functions: vec![
            f(0x1000, 0x1100, 0), // A main
            f(0x1100, 0x1140, 1), // A funclet
            f(0x1200, 0x1300, 2), // B main
            f(0x1300, 0x1310, 3), // C main
            f(0x8000, 0x8040, 4), // A cold
            f(0x8040, 0x8080, 5), // B cold, part 1
            f(0x8080, 0x8090, 6), // B cold, part 2
        ],
        methods: vec![
            ImageMethod {
                entry: 0x1000,
                method_id: 100,
                gc: None,
                debug: vec![row(0, 5)],
                name: String::new(),
            },
            ImageMethod {
                entry: 0x1200,
                method_id: 200,
                gc: Some(GcInfo {
                    version: 1,
                    bytes: Box::new([9]),
                }),
                debug: vec![],
                name: String::new(),
            },
            ImageMethod {
                entry: 0x1300,
                method_id: 300,
                gc: None,
                debug: vec![],
                name: String::new(),
            },
        ],
        hot_cold: vec![HotCold { cold: 4, hot: 0 }, HotCold { cold: 5, hot: 2 }],
        thunks: Some(0x9000..0x9100),
    }
}

#[test]
fn image_main_body_funclet_cold_part_and_thunks() {
    let m = ExecutionManager::new(4);
    assert_eq!(m.load_image(image()), Ok(IMG));
    let reader = m.register_reader().unwrap();
    let g = m.pin(&reader).unwrap();
    // (address, method, start, relative offset, funclet start, unwind tag)
    let cases = [
        (0x1010, 100, 0x1000, 0x10, 0x1000, 0),
        (0x1120, 100, 0x1000, 0x120, 0x1100, 1),
        (0x8010, 100, 0x1000, 0x140 + 0x10, 0x1000, 4),
        (0x12FF, 200, 0x1200, 0xFF, 0x1200, 2),
        (0x8050, 200, 0x1200, 0x100 + 0x10, 0x1200, 5),
        (0x8085, 200, 0x1200, 0x100 + 0x45, 0x1200, 6),
        (0x1300, 300, 0x1300, 0, 0x1300, 3),
    ];
    for (rel, id, start, offset, funclet, tag) in cases {
        let b = g.find(IMG + rel).unwrap();
        assert_eq!(
            (b.method_id(), b.start(), b.offset()),
            (id, IMG + start, offset),
            "{rel:#x}"
        );
        assert_eq!(b.funclet_start(), IMG + funclet, "{rel:#x}");
        assert_eq!(b.is_funclet(), funclet != start);
        assert_eq!(b.unwind_info(), Some(&[tag][..]));
        assert_eq!(
            (b.unwind_base(), b.jit_kind(), b.name()),
            (IMG, JitKind::Precompiled, None)
        );
    }
    let a = g.find(IMG + 0x1000).unwrap();
    assert_eq!(
        a.region(),
        RegionInfo {
            hot_size: 0x140,
            cold_start: Some(IMG + 0x8000),
            cold_size: 0x40
        }
    );
    assert_eq!(a.debug_at().map(|r| r.line), Some(5));
    let b = g.find(IMG + 0x8088).unwrap();
    assert_eq!(
        b.region(),
        RegionInfo {
            hot_size: 0x100,
            cold_start: Some(IMG + 0x8040),
            cold_size: 0x50
        }
    );
    assert_eq!(b.gc_info().map(|g| g.version), Some(1));
    let c = g.find(IMG + 0x1300).unwrap();
    assert_eq!(
        c.region(),
        RegionInfo {
            hot_size: 0x10,
            cold_start: None,
            cold_size: 0
        }
    );
    assert!(matches!(g.classify(IMG + 0x9000), Lookup::Thunk));
    assert!(matches!(g.classify(IMG + 0x90FF), Lookup::Thunk));
    for gap in [0x0, 0xFFF, 0x1140, 0x11FF, 0x1310, 0x8090, 0x9100, 0xFFFF] {
        assert!(matches!(g.classify(IMG + gap), Lookup::Nothing), "{gap:#x}");
    }
    assert!(matches!(g.classify(IMG + 0x10000), Lookup::Nothing));
    assert_eq!(g.entry_to_method(IMG + 0x1200), Some(200));
    assert_eq!(
        g.entry_to_method(IMG + 0x1100),
        None,
        "a funclet is not an entry"
    );
    assert_eq!(g.entry_to_method(IMG + 0x1001), None);
    drop(g);
    m.unload_image(IMG).unwrap();
    let g = m.pin(&reader).unwrap();
    assert!(g.find(IMG + 0x1010).is_none());
}

#[test]
fn image_validation_errors() {
    let m = ExecutionManager::new(4);
    let err = |f: &dyn Fn(&mut ImageInfo)| {
        let mut info = image();
        f(&mut info);
        m.load_image(info).unwrap_err()
    };
    use jitmap::manager::ManagerError::{Image, Range};
    assert_eq!(err(&|i| i.size = 0), Image(ImageError::Empty));
    assert_eq!(
        err(&|i| i.functions[1].end = 0x1100),
        Image(ImageError::FunctionOutOfRange { index: 1 })
    );
    assert_eq!(
        err(&|i| i.functions[6].end = 0x10001),
        Image(ImageError::FunctionOutOfRange { index: 6 })
    );
    assert_eq!(
        err(&|i| i.functions.swap(1, 2)),
        Image(ImageError::Unsorted { index: 2 })
    );
    assert_eq!(
        err(&|i| i.functions[1].begin = 0x10FF),
        Image(ImageError::Overlapping { index: 1 })
    );
    assert_eq!(
        err(&|i| i.methods[0].entry = 0x1001),
        Image(ImageError::EntryNotFunction { entry: 0x1001 })
    );
    assert_eq!(
        err(&|i| i.methods[0].entry = 0x8000),
        Image(ImageError::EntryNotFunction { entry: 0x8000 })
    );
    assert_eq!(
        err(&|i| i.methods[1].entry = 0x1000),
        Image(ImageError::DuplicateEntry { entry: 0x1000 })
    );
    assert_eq!(
        err(&|i| i.methods[0].entry = 0x1100),
        Image(ImageError::Orphan { index: 0 })
    );
    assert_eq!(
        err(&|i| i.hot_cold.swap(0, 1)),
        Image(ImageError::BadHotCold { pair: 1 })
    );
    assert_eq!(
        err(&|i| i.hot_cold[0].hot = 1),
        Image(ImageError::BadHotCold { pair: 0 })
    );
    assert_eq!(
        err(&|i| i.hot_cold[1].cold = 7),
        Image(ImageError::BadHotCold { pair: 1 })
    );
    assert_eq!(
        err(&|i| i.thunks = Some(0x9000..0x9000)),
        Image(ImageError::ThunksOutOfRange)
    );
    assert_eq!(
        err(&|i| i.thunks = Some(0xFF00..0x10001)),
        Image(ImageError::ThunksOutOfRange)
    );
    m.load_image(image()).unwrap();
    assert_eq!(
        err(&|i| i.base = IMG + 0x8000),
        Range(RangeError::Overlap {
            begin: IMG + 0x8000,
            existing: IMG
        })
    );
    assert_eq!(
        m.unload_image(IMG + 1),
        Err(Range(RangeError::NotFound { begin: IMG + 1 }))
    );
}

#[test]
fn a_thousand_heaps() {
    let m = ExecutionManager::new(4);
    let heaps: Vec<_> = (0..1000)
        .map(|_| {
            m.create_heap(HeapConfig {
                span: 64 * 1024,
                ..HeapConfig::default()
            })
            .unwrap()
        })
        .collect();
    let codes: Vec<_> = heaps
        .iter()
        .enumerate()
        .map(|(i, h)| {
            h.reserve(100)
                .unwrap()
                .publish(CodeInfo::new(i as u64, "m", JitKind::Baseline))
                .unwrap()
        })
        .collect();
    let reader = m.register_reader().unwrap();
    let g = m.pin(&reader).unwrap();
    for (i, (h, c)) in heaps.iter().zip(&codes).enumerate() {
        for ip in [c.start(), c.start() + 99] {
            let b = g.find(ip).unwrap();
            assert_eq!((b.method_id(), b.start()), (i as u64, c.start()));
        }
        assert!(g.find(c.start() + 100).is_none());
        assert!(g.section(h.base()).is_some_and(|s| s.begin() == h.base()));
        assert!(
            g.section(h.base() + 65535)
                .is_some_and(|s| s.begin() == h.base())
        );
    }
}

#[test]
fn dropping_a_heap_waits_for_readers_in_another_thread() {
    let m = ExecutionManager::new(4);
    let heap = small_heap(&m);
    let mut r = heap.reserve(64).unwrap();
    r.code_mut().fill(0x5A);
    let code = r
        .publish(CodeInfo::new(11, "doomed", JitKind::Baseline))
        .unwrap();
    let weak: Weak<jitmap::CodeHeap> = Arc::downgrade(heap.heap());
    let (pinned, dropped) = (Barrier::new(2), Barrier::new(2));
    std::thread::scope(|s| {
        s.spawn(|| {
            let reader = m.register_reader().unwrap();
            let g = m.pin(&reader).unwrap();
            let b = g.find(code.start() + 3).unwrap();
            pinned.wait();
            dropped.wait();
            // The heap is unregistered, but this guard keeps its memory mapped.
            assert!(g.find(code.start() + 3).is_none());
            assert_eq!((b.method_id(), b.name()), (11, Some("doomed")));
            // SAFETY: the block's code bytes stay mapped while the guard is held.
            let bytes = unsafe { std::slice::from_raw_parts(b.start() as *const u8, 64) };
            assert!(bytes.iter().all(|&x| x == 0x5A));
        });
        pinned.wait();
        drop(heap);
        assert_eq!(
            m.try_reclaim_sections(),
            0,
            "a reader pinned before the removal holds it"
        );
        assert!(weak.upgrade().is_some(), "still mapped");
        dropped.wait();
    });
    assert_eq!(m.try_reclaim_sections(), 1);
    assert!(
        weak.upgrade().is_none(),
        "unmapped after the reader unpinned"
    );
}

#[test]
fn a_heap_fragment_is_one_cache_line() {
    use jitmap::manager::SectionKind;
    use jitmap::range::Section;
    assert_eq!(std::mem::size_of::<Section<SectionKind>>(), 64);
    assert_eq!(std::mem::align_of::<Section<SectionKind>>(), 64);
}

/// `classify` skips the size and slot reads when a v2 pointer word proves the
/// address inside a block and the heap has never held a stub; it must agree with
/// the heap's own exact lookup at every byte, with and without (large) stubs.
#[test]
fn manager_agrees_with_the_heap_at_every_byte() {
    use jitmap::heap::BlockKind;
    use jitmap_testkit::rng::Rng;
    for version in [jitmap::MapVersion::V1, jitmap::MapVersion::V2] {
        for with_stubs in [false, true] {
            let m = ExecutionManager::new(4);
            let heap = m
                .create_heap(HeapConfig {
                    span: 1 << 20,
                    version,
                    ..HeapConfig::default()
                })
                .unwrap();
            let mut rng = Rng::new(31);
            let mut refs = Vec::new();
            for id in 0..60u64 {
                let size = if rng.chance(30) {
                    rng.range(600, 6000)
                } else {
                    rng.range(1, 300)
                };
                let r = heap.reserve(size).unwrap();
                refs.push(if with_stubs && id % 7 == 3 {
                    r.publish_stub(StubKind::new(1 + (id % 15) as u8).unwrap())
                        .unwrap()
                } else {
                    r.publish(CodeInfo::new(id, "m", JitKind::Baseline))
                        .unwrap()
                });
            }
            for r in refs.iter().step_by(5) {
                heap.free(*r).unwrap();
            }
            let reader = m.register_reader().unwrap();
            let g = m.pin(&reader).unwrap();
            let end = refs
                .iter()
                .map(|r| r.start() + r.size() as usize)
                .max()
                .unwrap()
                + 600;
            let mut methods = 0;
            for ip in heap.base()..end {
                let expected = heap.find(&g, ip).unwrap().map(|b| match b.kind() {
                    BlockKind::Method(h) => (false, b.start(), b.offset(), h.method_id()),
                    BlockKind::Stub(k) => (true, b.start(), b.offset(), u64::from(k.get())),
                });
                let got = match g.classify(ip) {
                    Lookup::Method(b) => Some((false, b.start(), b.offset(), b.method_id())),
                    Lookup::Stub { kind, start, .. } => {
                        Some((true, start, (ip - start) as u64, u64::from(kind.get())))
                    }
                    Lookup::Nothing => None,
                    Lookup::Thunk | Lookup::TooFar => panic!("no thunks in a heap, no cap"),
                };
                assert_eq!(got, expected, "{version} stubs={with_stubs} ip {ip:#x}");
                methods += usize::from(matches!(expected, Some((false, ..))));
            }
            assert!(methods > 10_000, "{methods}");
        }
    }
}

/// What a byte of a heap holds in the test's model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Byte {
    Free,
    Method { start: usize, id: u64 },
    Stub { start: usize, kind: u8 },
}

/// Seeded random heaps in both map versions: methods and stubs of sizes from 1
/// byte to 40 KB published, some freed, some reclaimed. Every byte of the span
/// (and a page either side) is then classified by the manager and looked up in
/// the heap, and both must match the model exactly: start, offset, id, stub
/// kind, or nothing. This covers every case of the v2 end check (start and
/// address in one word or adjacent ones, pointer words, ends on word and
/// bucket edges) against the allocator's real layouts.
#[test]
fn random_heaps_answer_every_byte_like_the_model() {
    use jitmap::MapVersion;
    use jitmap::heap::BlockKind;
    use jitmap_testkit::rng::Rng;

    const SPAN: usize = 256 << 10;
    for version in [MapVersion::V1, MapVersion::V2] {
        for seed in 0..12 {
            let m = ExecutionManager::new(4);
            let heap = m
                .create_heap(HeapConfig {
                    span: SPAN as u64,
                    version,
                    ..HeapConfig::default()
                })
                .unwrap();
            let mut rng = Rng::new(seed * 7 + 1);
            let mut live = Vec::new();
            for id in 1..=90u64 {
                let size = match rng.below(4) {
                    0 => rng.range(1, 64),
                    1 => rng.range(1, 600),
                    2 => rng.range(200, 3000),
                    _ => rng.range(1, 40_000),
                };
                let Ok(mut r) = heap.reserve(size) else {
                    continue;
                };
                r.code_mut().fill(0xCC);
                let code = if rng.chance(15) {
                    let kind = rng.range(1, 15) as u8;
                    (
                        r.publish_stub(StubKind::new(kind).unwrap()).unwrap(),
                        Some(kind),
                    )
                } else {
                    let info = CodeInfo::new(id, format!("m{id}"), JitKind::Optimized);
                    (r.publish(info).unwrap(), None)
                };
                live.push((code.0, size, id, code.1));
                if rng.chance(30) {
                    let (code, ..) = live.swap_remove(rng.below(live.len() as u64) as usize);
                    heap.free(code).unwrap();
                }
                if rng.chance(10) {
                    heap.try_reclaim();
                }
            }
            let base = heap.base();
            let mut model = vec![Byte::Free; SPAN];
            for &(code, size, id, stub) in &live {
                let start = code.start();
                for byte in &mut model[start - base..start - base + size as usize] {
                    *byte = match stub {
                        Some(kind) => Byte::Stub { start, kind },
                        None => Byte::Method { start, id },
                    };
                }
            }
            let reader = m.register_reader().unwrap();
            let guard = m.pin(&reader).unwrap();
            for ip in base - 4096..base + SPAN + 4096 {
                let expected = ip
                    .checked_sub(base)
                    .and_then(|o| model.get(o))
                    .copied()
                    .unwrap_or(Byte::Free);
                let classified = match guard.classify(ip) {
                    Lookup::Method(b) => Byte::Method {
                        start: b.start(),
                        id: b.method_id(),
                    },
                    Lookup::Stub { kind, start, .. } => Byte::Stub {
                        start,
                        kind: kind.get(),
                    },
                    Lookup::Nothing => Byte::Free,
                    other => panic!("{version} seed {seed} ip {ip:#x}: {other:?}"),
                };
                assert_eq!(
                    classified, expected,
                    "{version} seed {seed} manager ip {ip:#x}"
                );
                let found = heap.find(&guard, ip).unwrap().map(|b| {
                    assert_eq!(b.offset(), (ip - b.start()) as u64);
                    match b.kind() {
                        BlockKind::Method(h) => Byte::Method {
                            start: b.start(),
                            id: h.method_id(),
                        },
                        BlockKind::Stub(kind) => Byte::Stub {
                            start: b.start(),
                            kind: kind.get(),
                        },
                    }
                });
                assert_eq!(
                    found.unwrap_or(Byte::Free),
                    expected,
                    "{version} seed {seed} heap ip {ip:#x}"
                );
            }
            let bytes = model.iter().filter(|b| **b != Byte::Free).count();
            assert_eq!(
                bytes as u64,
                live.iter().map(|l| l.1).sum::<u64>(),
                "{version} seed {seed}: the model holds every live byte once"
            );
        }
    }
}

/// A value that counts its drops.
struct Dropped(Arc<AtomicUsize>);

impl Drop for Dropped {
    fn drop(&mut self) {
        // Relaxed: read on this thread after the drop.
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn a_retired_value_drops_after_the_readers_and_executors_that_could_reach_it() {
    let manager = ExecutionManager::new(4);
    let drops = Arc::new(AtomicUsize::new(0));
    // Relaxed: the drops counted are this thread's own.
    let count = || drops.load(Ordering::Relaxed);
    // Nobody holds the grace period back: dropped in the call.
    manager.retire(Dropped(Arc::clone(&drops)));
    assert_eq!(count(), 1);

    // A pinned reader holds it until it unpins and a writer call reclaims.
    let reader = manager.register_reader().unwrap();
    let guard = manager.pin(&reader).unwrap();
    manager.retire(Dropped(Arc::clone(&drops)));
    assert_eq!(manager.try_reclaim_sections(), 0);
    assert_eq!(count(), 1);
    drop(guard);
    manager.try_reclaim_sections();
    assert_eq!(count(), 2);

    // An online executor holds it until its next quiescent point; a reader
    // pinned after the retire does not.
    let executor = manager.register_executor().unwrap();
    manager.retire(Dropped(Arc::clone(&drops)));
    let late = manager.pin(&reader).unwrap();
    manager.try_reclaim_sections();
    assert_eq!(count(), 2);
    executor.quiescent();
    // A heap handle's drop is a writer call that reclaims too.
    drop(
        manager
            .create_heap(HeapConfig {
                span: 1 << 16,
                ..HeapConfig::default()
            })
            .unwrap(),
    );
    assert_eq!(count(), 3);
    drop(late);

    // What is still retired when the manager drops is dropped with it.
    let guard = manager.pin(&reader).unwrap();
    manager.retire(Dropped(Arc::clone(&drops)));
    drop(guard);
    assert_eq!(count(), 3);
    drop((reader, executor));
    drop(manager);
    assert_eq!(count(), 4);
}
