//! The code heap: real execution, exact lookups, abort, grace periods, bad input
//! and a concurrent writers-against-readers run.

use std::sync::Arc;

use jitmap::heap::{BlockKind, HeapBlock, HeapStats, JitKind, PREFIX, StubKind};
use jitmap::{
    CodeHeap, CodeInfo, Domain, EpochError, HeapConfig, HeapError, MapVersion, MemoryMode,
};

const MODES: [MemoryMode; 3] = [
    MemoryMode::Rwx,
    MemoryMode::WriteXorExecute,
    MemoryMode::FlipOnPublish,
];
const VERSIONS: [MapVersion; 2] = [MapVersion::V1, MapVersion::V2];

fn heap(version: MapVersion, mode: MemoryMode, span: u64) -> (Arc<Domain>, CodeHeap) {
    let domain = Domain::new(8);
    let heap = CodeHeap::new(
        HeapConfig {
            span,
            version,
            mode,
            ..HeapConfig::default()
        },
        &domain,
    )
    .unwrap();
    (domain, heap)
}

fn method(heap: &CodeHeap, id: u64, size: u64) -> jitmap::CodeRef {
    let mut r = heap.reserve(size).unwrap();
    r.code_mut().fill(0xCC);
    r.publish(CodeInfo::new(id, format!("m{id}"), JitKind::Optimized))
        .unwrap()
}

fn method_of<'a>(b: Option<HeapBlock<'a>>) -> Option<(usize, u64, u64)> {
    b.map(|b| match b.kind() {
        BlockKind::Method(h) => (b.start(), b.offset(), h.method_id()),
        BlockKind::Stub(k) => panic!("unexpected stub {k}"),
    })
}

#[test]
fn published_code_executes() {
    for mode in MODES {
        let (_d, heap) = heap(MapVersion::V2, mode, 1 << 20);
        let answer = jitmap_testkit::arch::returns(42);
        let mut r = heap.reserve(answer.len() as u64).unwrap();
        r.code_mut().copy_from_slice(&answer);
        let code = r
            .publish(CodeInfo::new(1, "answer", JitKind::Baseline))
            .unwrap();
        // SAFETY: the bytes above are a complete function with the C ABI.
        let f: extern "C" fn() -> u32 = unsafe { std::mem::transmute(code.start()) };
        assert_eq!(f(), 42, "{mode:?}");

        let lp = jitmap_testkit::arch::add_loop(1000, 3);
        let mut r = heap.reserve(lp.len() as u64).unwrap();
        r.code_mut().copy_from_slice(&lp);
        let code = r
            .publish(CodeInfo::new(2, "loop", JitKind::Baseline))
            .unwrap();
        // SAFETY: as above.
        let f: extern "C" fn() -> u32 = unsafe { std::mem::transmute(code.start()) };
        assert_eq!(f(), 3000, "{mode:?}");
    }
}

#[test]
fn every_byte_finds_its_block_and_nothing_else_does() {
    for version in VERSIONS {
        for mode in MODES {
            let (domain, heap) = heap(version, mode, 1 << 20);
            let sizes = [1u64, 31, 32, 200, 4096, 70_000, 3, 1000];
            let refs: Vec<_> = sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| method(&heap, i as u64 + 10, n))
                .collect();
            // Free two to leave holes.
            heap.free(refs[3]).unwrap();
            heap.free(refs[6]).unwrap();
            let reader = domain.register().unwrap();
            let guard = reader.pin().unwrap();
            let live: Vec<_> = refs
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != 3 && *i != 6)
                .collect();
            let end = refs
                .iter()
                .map(|r| r.start() + r.size() as usize)
                .max()
                .unwrap()
                + 4096;
            let mut inside = 0;
            for ip in heap.base()..end {
                let expected = live
                    .iter()
                    .find(|(_, r)| ip >= r.start() && ip < r.start() + r.size() as usize)
                    .map(|(i, r)| (r.start(), (ip - r.start()) as u64, *i as u64 + 10));
                inside += usize::from(expected.is_some());
                assert_eq!(
                    method_of(heap.find(&guard, ip).unwrap()),
                    expected,
                    "{version} {mode:?} ip {ip:#x}"
                );
            }
            assert_eq!(
                inside as u64,
                live.iter().map(|(_, r)| r.size()).sum::<u64>()
            );
            for ip in [
                0,
                heap.base() - 1,
                heap.base() + heap.span() as usize,
                usize::MAX,
            ] {
                assert!(heap.find(&guard, ip).unwrap().is_none());
            }
        }
    }
}

#[test]
fn header_prefix_holds_size_and_slot() {
    let (domain, heap) = heap(MapVersion::V2, MemoryMode::Rwx, 1 << 20);
    let r = method(&heap, 5, 100);
    let reader = domain.register().unwrap();
    let guard = reader.pin().unwrap();
    let BlockKind::Method(h) = heap.find(&guard, r.start()).unwrap().unwrap().kind() else {
        panic!()
    };
    // SAFETY: the prefix words of a live block are readable in RWX mode.
    let words =
        unsafe { std::slice::from_raw_parts((r.start() - PREFIX as usize) as *const usize, 2) };
    assert_eq!(words, [100, h as *const _ as usize]);
    assert_eq!((h.method_id(), h.code_size(), h.name()), (5, 100, "m5"));
}

#[test]
fn stubs_are_reported_as_stubs() {
    let (domain, heap) = heap(MapVersion::V2, MemoryMode::Rwx, 1 << 20);
    let r = heap.reserve(64).unwrap();
    let stub = r.publish_stub(StubKind::new(7).unwrap()).unwrap();
    let reader = domain.register().unwrap();
    let guard = reader.pin().unwrap();
    let b = heap.find(&guard, stub.start() + 63).unwrap().unwrap();
    assert!(matches!(b.kind(), BlockKind::Stub(k) if k.get() == 7));
    assert_eq!((b.start(), b.size(), b.offset()), (stub.start(), 64, 63));
    assert!(heap.find(&guard, stub.start() + 64).unwrap().is_none());
    // A bad kind cannot reach a publish: it is refused when it is made.
    for kind in [0, 16, 255] {
        assert_eq!(
            StubKind::try_from(kind),
            Err(HeapError::BadStubKind { kind })
        );
    }
    assert_eq!(StubKind::try_from(15).map(StubKind::get), Ok(15));
}

#[test]
fn abort_is_never_visible_and_space_is_reused() {
    for mode in MODES {
        let (domain, heap) = heap(MapVersion::V2, mode, 1 << 20);
        let before = usage(&heap);
        let mut r = heap.reserve(512).unwrap();
        r.code_mut().fill(0x90);
        let addr = r.address();
        let reader = domain.register().unwrap();
        let guard = reader.pin().unwrap();
        assert!(
            heap.find(&guard, addr).unwrap().is_none(),
            "reserved is not visible"
        );
        r.abort();
        assert!(heap.find(&guard, addr).unwrap().is_none());
        assert_eq!(usage(&heap), before);
        assert_eq!(heap.map().nonzero_words().count(), 0);
        let r2 = heap.reserve(512).unwrap();
        assert_eq!(r2.address(), addr, "aborted space is reused at once");
        drop(r2);
        assert_eq!(usage(&heap), before, "dropping a reservation aborts it");
    }
}

#[test]
fn grace_period_keeps_header_and_bytes_until_unpin() {
    let (domain, heap) = heap(MapVersion::V2, MemoryMode::Rwx, 1 << 20);
    let a = method(&heap, 77, 1000);
    let reader = domain.register().unwrap();
    let guard = reader.pin().unwrap();
    let BlockKind::Method(header) = heap.find(&guard, a.start() + 10).unwrap().unwrap().kind()
    else {
        panic!()
    };
    heap.free(a).unwrap();
    assert!(
        heap.find(&guard, a.start() + 10).unwrap().is_none(),
        "unpublished at once"
    );
    assert_eq!(
        heap.try_reclaim(),
        0,
        "a pinned guard holds the grace period open"
    );
    assert_eq!((header.method_id(), header.name()), (77, "m77"));
    let b = heap.reserve(1000).unwrap();
    assert_ne!(b.address(), a.start(), "bytes are not reused while pinned");
    drop(b);
    assert_eq!(heap.stats().retired_blocks, 1);
    drop(guard);
    let extent = heap.try_reclaim();
    assert_eq!(extent, 1000 + PREFIX);
    assert_eq!(heap.stats().retired_blocks, 0);
    assert_eq!(
        heap.reserve(1000).unwrap().address(),
        a.start(),
        "reused after reclaim"
    );
}

#[test]
fn guard_from_another_domain_is_refused() {
    let (_d, heap) = heap(MapVersion::V2, MemoryMode::Rwx, 1 << 20);
    let a = method(&heap, 1, 64);
    let other = Domain::new(1);
    let reader = other.register().unwrap();
    let guard = reader.pin().unwrap();
    assert_eq!(
        heap.find(&guard, a.start()).map(|b| b.map(|b| b.start())),
        Err(jitmap::ForeignGuard)
    );
}

#[test]
fn code_info_is_validated() {
    use jitmap::heap::{DebugEntry, InfoError, UnwindEntry};
    let (_d, heap) = heap(MapVersion::V2, MemoryMode::Rwx, 1 << 20);
    let unwind = |b, e| UnwindEntry {
        begin: b,
        end: e,
        data: Box::new([]),
    };
    let dbg = |o| DebugEntry {
        offset: o,
        line: 1,
        column: 1,
        file: "f.rs".into(),
    };
    let cases: Vec<(CodeInfo, InfoError)> = vec![
        (
            CodeInfo {
                unwind: vec![unwind(4, 10)],
                ..CodeInfo::new(1, "x", JitKind::Baseline)
            },
            InfoError::MainBodyNotFirst,
        ),
        (
            CodeInfo {
                unwind: vec![unwind(0, 101)],
                ..CodeInfo::new(1, "x", JitKind::Baseline)
            },
            InfoError::UnwindOutOfRange { begin: 0, end: 101 },
        ),
        (
            CodeInfo {
                unwind: vec![unwind(0, 50), unwind(40, 60)],
                ..CodeInfo::new(1, "x", JitKind::Baseline)
            },
            InfoError::UnwindUnsorted { begin: 40 },
        ),
        (
            CodeInfo {
                debug: vec![dbg(5), dbg(2)],
                ..CodeInfo::new(1, "x", JitKind::Baseline)
            },
            InfoError::DebugUnsorted { offset: 2 },
        ),
        (
            CodeInfo {
                debug: vec![dbg(100)],
                ..CodeInfo::new(1, "x", JitKind::Baseline)
            },
            InfoError::DebugOutOfRange { offset: 100 },
        ),
        (
            CodeInfo {
                cold_offset: Some(100),
                ..CodeInfo::new(1, "x", JitKind::Baseline)
            },
            InfoError::ColdOutOfRange { offset: 100 },
        ),
    ];
    for (info, err) in cases {
        let before = usage(&heap);
        let r = heap.reserve(100).unwrap();
        assert_eq!(r.publish(info), Err(HeapError::Info(err)));
        assert_eq!(usage(&heap), before);
        assert_eq!(heap.map().nonzero_words().count(), 0);
    }
}

/// Usage without `committed`, which only grows (pages stay committed for reuse).
fn usage(heap: &CodeHeap) -> HeapStats {
    HeapStats {
        committed: 0,
        ..heap.stats()
    }
}

fn unchanged(heap: &CodeHeap, before: HeapStats, words: &[(usize, u32)]) {
    assert_eq!(usage(heap), before);
    assert_eq!(heap.map().nonzero_words().collect::<Vec<_>>(), words);
}

#[test]
fn bad_input_is_rejected_and_changes_nothing() {
    let (domain, heap) = heap(MapVersion::V2, MemoryMode::Rwx, 64 * 1024);
    let a = method(&heap, 1, 100);
    let before = usage(&heap);
    let words: Vec<_> = heap.map().nonzero_words().collect();

    assert_eq!(heap.reserve(0).err(), Some(HeapError::ZeroSize));
    unchanged(&heap, before, &words);
    assert_eq!(
        heap.reserve(64 * 1024).err(),
        Some(HeapError::TooLarge {
            size: 64 * 1024,
            max: 64 * 1024 - PREFIX
        })
    );
    unchanged(&heap, before, &words);
    for align in [0, 4, 12, 1 << 20] {
        assert_eq!(
            heap.reserve_aligned(64, align).err(),
            Some(HeapError::BadAlignment { align })
        );
    }
    unchanged(&heap, before, &words);
    assert_eq!(
        heap.reserve(65_400).err(),
        Some(HeapError::HeapFull { size: 65_400 })
    );
    unchanged(&heap, before, &words);

    heap.free(a).unwrap();
    heap.try_reclaim();
    let before = usage(&heap);
    assert_eq!(
        heap.free(a),
        Err(HeapError::DoubleFree { start: a.start() })
    );
    unchanged(&heap, before, &[]);

    let (_d2, other) = self::heap(MapVersion::V2, MemoryMode::Rwx, 64 * 1024);
    let foreign = method(&other, 2, 100);
    assert_eq!(heap.free(foreign), Err(HeapError::ForeignRef));
    unchanged(&heap, before, &[]);

    let readers: Vec<_> = (0..8).map(|_| domain.register().unwrap()).collect();
    assert_eq!(
        domain.register().err(),
        Some(EpochError::NoSlots { slots: 8 })
    );
    drop(readers);
    assert!(domain.register().is_ok(), "slots are released on drop");

    for span in [0, 1 << 32] {
        assert_eq!(
            CodeHeap::new(
                HeapConfig {
                    span,
                    ..HeapConfig::default()
                },
                &domain
            )
            .err(),
            Some(HeapError::BadSpan { span })
        );
    }
    assert_eq!(
        CodeHeap::new(
            HeapConfig {
                align: 4,
                ..HeapConfig::default()
            },
            &domain
        )
        .err(),
        Some(HeapError::BadAlignment { align: 4 })
    );
    let room = jitmap::MAX_UNWIND_ROOM + 1;
    assert_eq!(
        CodeHeap::new(
            HeapConfig {
                unwind_room: room,
                ..HeapConfig::default()
            },
            &domain
        )
        .err(),
        Some(HeapError::BadUnwindRoom { room })
    );
}

/// Each block keeps `unwind_room` free bytes after its code: the next block's
/// code starts past them, and the room counts against the largest size.
#[test]
fn unwind_room_keeps_bytes_free_after_each_block() {
    let domain = Domain::new(2);
    let heap = CodeHeap::new(
        HeapConfig {
            span: 64 * 1024,
            unwind_room: 200,
            huge_pages: false,
            ..HeapConfig::default()
        },
        &domain,
    )
    .unwrap();
    let starts: Vec<_> = (0..4u64)
        .map(|i| method(&heap, i + 1, 10 + 30 * i).start())
        .collect();
    let sizes = [10, 40, 70, 100];
    for i in 0..3 {
        assert!(
            starts[i] + sizes[i] + 200 + PREFIX as usize <= starts[i + 1],
            "{starts:x?}"
        );
    }
    let max = 64 * 1024 - PREFIX - 200;
    assert_eq!(
        heap.reserve(max + 1).err(),
        Some(HeapError::TooLarge { size: max + 1, max })
    );
}

#[test]
fn heap_full_is_recovered_by_reclaiming() {
    let (_d, heap) = heap(MapVersion::V2, MemoryMode::Rwx, 64 * 1024);
    let a = method(&heap, 1, 60_000);
    heap.free(a).unwrap();
    // No guard is pinned: the failed allocation reclaims and then fits.
    assert_eq!(heap.reserve(60_000).unwrap().address(), a.start());
}

#[test]
fn stats_track_commit_and_use() {
    let (_d, heap) = heap(MapVersion::V2, MemoryMode::Rwx, 1 << 20);
    let s0 = heap.stats();
    assert_eq!(
        (s0.committed, s0.used, s0.free, s0.largest_free),
        (0, 0, 1 << 20, 1 << 20)
    );
    let a = method(&heap, 1, 100);
    let s1 = heap.stats();
    assert_eq!((s1.committed, s1.used, s1.live_blocks), (64 * 1024, 120, 1));
    heap.free(a).unwrap();
    assert_eq!(heap.stats().retired_blocks, 1);
    assert_eq!(heap.try_reclaim(), 120);
    let s2 = heap.stats();
    assert_eq!(
        (
            s2.used,
            s2.reclaimed_bytes,
            s2.retired_blocks,
            s2.live_blocks
        ),
        (0, 120, 0, 0)
    );
}

/// Issue 67, item 2: a JIT reserves an upper bound and learns the code's
/// size at the end. `shrink_to` gives the tail back before the publish:
/// the heap then holds what a reservation of the final size would, lookups
/// past the code find nothing (they named the method through the whole
/// reservation), and the next block is placed in the tail.
#[test]
fn a_reservation_shrunk_to_its_code_gives_the_tail_back() {
    // Several pages, whatever their size: flip mode gives each block whole
    // pages, so the tail given back starts a page past the code.
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    let bound: u64 = (64 << 10).max(4 * page);
    for version in VERSIONS {
        for mode in MODES {
            let (domain, heap) = heap(version, mode, 1 << 20);
            let (_, exact) = self::heap(version, mode, 1 << 20);
            exact
                .reserve(100)
                .unwrap()
                .publish(CodeInfo::new(1, "exact", JitKind::Optimized))
                .unwrap();
            let mut r = heap.reserve(bound).unwrap();
            r.code_mut().fill(0xCC);
            let before = usage(&heap);
            for refused in [0, bound + 1] {
                assert_eq!(
                    r.shrink_to(refused),
                    Err(HeapError::BeyondReservation {
                        size: refused,
                        reserved: bound
                    })
                );
            }
            assert_eq!(usage(&heap), before, "{mode:?}: refused, unchanged");
            r.shrink_to(100).unwrap();
            assert_eq!((r.len(), r.code_mut().len()), (100, 100));
            assert!(r.code_mut().iter().all(|&b| b == 0xCC));
            let code = r
                .publish(CodeInfo::new(1, "shrunk", JitKind::Optimized))
                .unwrap();
            assert_eq!(code.size(), 100);
            assert_eq!(usage(&heap), usage(&exact), "{version:?} {mode:?}");
            let reader = domain.register().unwrap();
            let guard = reader.pin().unwrap();
            let start = code.start();
            for offset in [0, 50, 99] {
                assert_eq!(
                    method_of(heap.find(&guard, start + offset).unwrap()),
                    Some((start, offset as u64, 1)),
                    "{version:?} {mode:?}"
                );
            }
            for offset in [100, 101, 4095, bound as usize - 1] {
                assert_eq!(
                    method_of(heap.find(&guard, start + offset).unwrap()),
                    None,
                    "{version:?} {mode:?}: {offset}"
                );
            }
            let next = method(&heap, 2, 100);
            assert!(
                next.start() < start + bound as usize,
                "{version:?} {mode:?}: {:#x} after {start:#x}",
                next.start()
            );
        }
    }
}
