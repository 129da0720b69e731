//! What a JIT host needs beyond lookups: owned handles, listing live code,
//! return-address lookups and telling a moved block's old reference apart.

use std::sync::Arc;

use jitmap::heap::StubKind;
use jitmap::{CodeInfo, CodeRef, ExecutionManager, HeapConfig, HeapError, JitKind, OwnedHeap};

fn config() -> HeapConfig {
    HeapConfig {
        span: 1 << 20,
        ..HeapConfig::default()
    }
}

fn publish(heap: &jitmap::CodeHeap, id: u64, size: u64) -> CodeRef {
    let mut r = heap.reserve(size).unwrap();
    r.code_mut().fill(0x90);
    r.publish(CodeInfo::new(id, format!("m{id}"), JitKind::Baseline))
        .unwrap()
}

/// A runtime keeps its manager and heaps in one struct: no borrowed lifetime.
struct Runtime {
    heaps: Vec<OwnedHeap>,
    manager: ExecutionManager,
}

#[test]
fn owned_heaps_live_next_to_their_manager() {
    let manager = ExecutionManager::new(4);
    let mut rt = Runtime {
        heaps: (0..3)
            .map(|_| manager.create_heap(config()).unwrap())
            .collect(),
        manager,
    };
    let a = publish(&rt.heaps[1], 5, 100);
    let reader = rt.manager.register_reader().unwrap();
    {
        let g = rt.manager.pin(&reader).unwrap();
        let b = g.find(a.start() + 99).unwrap();
        assert_eq!((b.method_id(), b.offset()), (5, 99));
    }
    let mut bases: Vec<usize> = rt.heaps.iter().map(|h| h.base()).collect();
    bases.sort();
    let listed: Vec<usize> = rt.manager.heaps().iter().map(|h| h.base()).collect();
    assert_eq!(listed, bases);
    let weak = Arc::downgrade(rt.heaps[1].heap());
    rt.heaps.remove(1);
    assert_eq!(rt.manager.heaps().len(), 2);
    drop(reader);
    rt.manager.try_reclaim_sections();
    assert!(weak.upgrade().is_none(), "unmapped once unregistered");
    // The manager lives as long as a handle of it (the runtime's, or a
    // heap's) does, and no longer: then its reader domain is gone too.
    let domain = Arc::downgrade(rt.manager.domain());
    let handle = rt.manager.clone();
    drop(rt);
    assert!(domain.upgrade().is_some(), "held by the clone");
    drop(handle);
    assert!(domain.upgrade().is_none());
}

#[test]
fn live_blocks_list_exactly_what_is_published() {
    let m = ExecutionManager::new(2);
    let h1 = m.create_heap(config()).unwrap();
    let h2 = m.create_heap(config()).unwrap();
    let a = publish(&h1, 1, 64);
    let b = publish(&h1, 2, 300);
    let stub = h1
        .reserve(32)
        .unwrap()
        .publish_stub(StubKind::new(3).unwrap())
        .unwrap();
    let c = publish(&h2, 4, 16);
    let gone = publish(&h2, 5, 16);
    h2.free(gone).unwrap();
    let moved = h1.move_block(a).unwrap();
    let listed: Vec<(usize, u64, Option<u64>, Option<String>)> = m
        .live_blocks()
        .into_iter()
        .map(|l| {
            (
                l.code.start(),
                l.code.size(),
                l.info.as_ref().map(|i| i.method_id),
                l.info.map(|i| i.name.clone()),
            )
        })
        .collect();
    let mut expected = vec![
        (b.start(), 300, Some(2), Some("m2".to_owned())),
        (stub.start(), 32, None, None),
        (moved.start(), 64, Some(1), Some("m1".to_owned())),
    ];
    expected.sort();
    let mut second = vec![(c.start(), 16, Some(4), Some("m4".to_owned()))];
    if h2.base() < h1.base() {
        second.extend(expected);
        expected = second;
    } else {
        expected.extend(second);
    }
    assert_eq!(listed, expected);
    // A listed reference frees its block.
    let first = h1.live_blocks()[0].code;
    h1.free(first).unwrap();
    assert_eq!(h1.live_blocks().len(), 2);
}

#[test]
fn freeing_a_moved_blocks_old_reference_names_the_move() {
    let m = ExecutionManager::new(1);
    let heap = m.create_heap(config()).unwrap();
    let a = publish(&heap, 1, 64);
    let moved = heap.move_block(a).unwrap();
    assert_eq!(
        heap.free(a),
        Err(HeapError::Moved {
            start: a.start(),
            to: moved.start()
        })
    );
    assert_eq!(
        heap.move_block(a),
        Err(HeapError::Moved {
            start: a.start(),
            to: moved.start()
        })
    );
    heap.free(moved).unwrap();
    assert_eq!(
        heap.free(moved),
        Err(HeapError::DoubleFree {
            start: moved.start()
        })
    );
    assert_eq!(heap.stats().live_blocks, 0);
}

/// A method whose last instruction is a call (to a function that never returns):
/// its return address is the first byte past the method.
#[test]
fn return_addresses_are_looked_up_one_byte_back() {
    let m = ExecutionManager::new(1);
    let heap = m.create_heap(config()).unwrap();
    let caller = publish(&heap, 1, 32); // ends with a 5-byte call at 27..32
    let next = {
        let mut r = heap.reserve(16).unwrap();
        r.code_mut().fill(0xC3);
        r.publish(CodeInfo::new(2, "next", JitKind::Baseline))
            .unwrap()
    };
    let ra = caller.start() + 32;
    let reader = m.register_reader().unwrap();
    let g = m.pin(&reader).unwrap();
    assert!(g.find(ra).is_none_or(|b| b.method_id() == 2));
    let frame = g.find_return_address(ra).unwrap();
    assert_eq!((frame.method_id(), frame.offset()), (1, 31));
    let inside = g.find_return_address(next.start() + 1).unwrap();
    assert_eq!((inside.method_id(), inside.offset()), (2, 0));
    assert!(g.find_return_address(0).is_none());
}

#[test]
fn debug_output_shows_addresses_in_hex() {
    let m = ExecutionManager::new(1);
    let heap = m.create_heap(config()).unwrap();
    let a = publish(&heap, 1, 0x40);
    heap.free(a).unwrap();
    let err = heap.free(a).unwrap_err();
    assert_eq!(
        format!("{err:?}"),
        format!("DoubleFree {{ start: {:#x} }}", a.start())
    );
    assert!(
        format!("{a:?}").starts_with(&format!("CodeRef {{ start: {:#x}, size: 0x40, ", a.start()))
    );
    assert_eq!(
        format!("{:?}", jitmap::range::RangeError::NotFound { begin: 4096 }),
        "NotFound { begin: 0x1000 }"
    );
}
