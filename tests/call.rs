//! Typed calls into published code: a `CallCell` that JIT code calls through
//! (`jmp [cell]`) and Rust code through `get`, swapped between versions while
//! threads call it, each old version freed under executors' quiescent points.
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use jitmap::{
    CallCell, CodeInfo, CodeRef, ExecutionManager, FnPtr, HeapConfig, JitKind, OwnedHeap,
};

type Answer = extern "C" fn() -> u32;

/// A function that returns `value`, for this architecture.
fn returns(heap: &OwnedHeap, value: u32) -> CodeRef {
    let code = jitmap_testkit::arch::returns(value as u16);
    let mut r = heap.reserve(code.len() as u64).unwrap();
    r.code_mut().copy_from_slice(&code);
    r.publish(CodeInfo::new(
        u64::from(value),
        "answer",
        JitKind::Optimized,
    ))
    .unwrap()
}

/// JIT code that tail-calls through a cell.
fn through(heap: &OwnedHeap, cell: usize) -> CodeRef {
    let code = jitmap_testkit::arch::jump_through(cell);
    let mut r = heap.reserve(code.len() as u64).unwrap();
    r.code_mut().copy_from_slice(&code);
    r.publish(CodeInfo::new(0, "through", JitKind::Optimized))
        .unwrap()
}

#[test]
fn a_call_cell_swapped_under_callers_always_calls_a_live_version() {
    let manager = ExecutionManager::new(8);
    let heap = manager
        .create_heap(HeapConfig {
            span: 1 << 20,
            ..HeapConfig::default()
        })
        .unwrap();
    let first = returns(&heap, 1);
    // SAFETY: `returns` writes a complete C function taking nothing.
    let cell = Arc::new(CallCell::<Answer>::new(unsafe { first.entry() }));
    let jit = through(&heap, cell.address());
    // SAFETY: `through` tail-calls the cell's target, an `Answer`.
    let via_jit: Answer = unsafe { jit.entry() };
    assert_eq!(via_jit(), 1);

    let stop = Arc::new(AtomicBool::new(false));
    // Each caller's calls: the swaps wait for both to be calling, and go on
    // until both have called through swaps, so a loaded machine that runs
    // the callers late still tests them.
    let calls: Arc<[AtomicU64; 2]> = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let callers: Vec<_> = (0..2)
        .map(|i| {
            let (cell, stop, calls) = (Arc::clone(&cell), Arc::clone(&stop), Arc::clone(&calls));
            let executor = manager.register_executor().unwrap();
            std::thread::spawn(move || {
                // Relaxed: a stop flag; no data rides on it.
                while !stop.load(Ordering::Relaxed) {
                    let got = if i == 0 { (cell.get())() } else { via_jit() };
                    assert!(got == 1 || got == 2, "called freed or torn code: {got}");
                    // Relaxed: a progress counter.
                    calls[i].fetch_add(1, Ordering::Relaxed);
                    // Between top-level calls into JIT code.
                    executor.quiescent();
                }
            })
        })
        .collect();
    // Relaxed: progress counters, polled.
    let called =
        |at_least: [u64; 2]| (0..2).all(|i| calls[i].load(Ordering::Relaxed) >= at_least[i]);
    let cap = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !called([1, 1]) && std::time::Instant::now() < cap {
        std::thread::yield_now();
    }
    assert!(called([1, 1]), "the callers never ran");
    // Relaxed: as above.
    let before = [0, 1].map(|i| calls[i].load(Ordering::Relaxed));
    let mut live = first;
    let mut round = 0u32;
    // 2,000 swaps, and more until each caller has made 100 calls among them.
    while round < 2_000 || (!called(before.map(|c| c + 100)) && std::time::Instant::now() < cap) {
        let next = returns(&heap, 1 + (round + 1) % 2);
        // SAFETY: as above.
        let old = cell.set(unsafe { next.entry() });
        assert_eq!(old.address(), live.start());
        // The old version is reused only after both callers pass a quiescent
        // point, so a caller still inside it finishes there.
        heap.free(live).unwrap();
        live = next;
        round += 1;
    }
    assert!(
        called(before.map(|c| c + 100)),
        "the callers did not call through the swaps"
    );
    // Relaxed: a stop flag.
    stop.store(true, Ordering::Relaxed);
    for c in callers {
        c.join().unwrap();
    }
    // The last version returns what the round count says.
    let last = 1 + round % 2;
    assert_eq!((cell.get())(), last);
    assert_eq!(via_jit(), last);
    // Two thousand versions freed, two live (the last and the trampoline):
    // the heap did not grow with the swaps.
    heap.try_reclaim();
    assert_eq!(heap.stats().live_blocks, 2);
}
