//! Code that may still be running: a freed method's bytes are reused only after
//! every online executor has passed a quiescent point. Real code runs (emitted
//! for this architecture), and reused bytes are filled with traps (`int3`,
//! `brk`), so running freed code would kill the test with SIGTRAP.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use jitmap::{CodeInfo, CodeRef, ExecutionManager, HeapConfig, JitKind, OwnedHeap};

use jitmap_testkit::arch;

/// Spins `n` iterations, then returns 42.
fn spinner(n: u64) -> Vec<u8> {
    arch::spin_then_return(n, 42)
}

/// Returns 7.
fn seven() -> Vec<u8> {
    arch::returns(7)
}

fn publish(heap: &OwnedHeap, id: u64, code: &[u8]) -> CodeRef {
    let mut r = heap.reserve(code.len() as u64).unwrap();
    r.code_mut().copy_from_slice(code);
    r.publish(CodeInfo::new(id, format!("f{id}"), JitKind::Optimized))
        .unwrap()
}

fn heap(m: &ExecutionManager) -> OwnedHeap {
    m.create_heap(HeapConfig {
        span: 1 << 20,
        ..HeapConfig::default()
    })
    .unwrap()
}

/// Calls the JIT function at `addr`.
fn call(addr: usize) -> u32 {
    // SAFETY: `addr` is the entry of published code that follows the C ABI,
    // takes no arguments and returns a 32-bit value; the executor protocol keeps
    // it mapped and unchanged while this thread may run it.
    let f: extern "C" fn() -> u32 = unsafe { std::mem::transmute(addr) };
    f()
}

fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn freed_code_is_not_reused_while_an_executor_may_run_it() {
    let m = ExecutionManager::new(4);
    let heap = heap(&m);
    // About a quarter of a second of spinning at a few GHz.
    let slow = publish(&heap, 1, &spinner(600_000_000));
    let fast = publish(&heap, 2, &seven());
    let cell = Arc::new(AtomicUsize::new(slow.start()));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Arc::new(AtomicBool::new(false));
    // Quiescent points the executor has begun (counted before each one).
    let quiescing = Arc::new(AtomicU64::new(0));
    let results = Arc::new(AtomicU64::new(0));
    let domain = Arc::clone(m.domain());
    let x = {
        let (cell, stop, started) = (cell.clone(), stop.clone(), started.clone());
        let (quiescing, results) = (quiescing.clone(), results.clone());
        std::thread::spawn(move || {
            let executor = domain.register_executor().unwrap();
            // Acquire: pairs with the Release store of `stop` below.
            while !stop.load(Ordering::Acquire) {
                // Acquire: sees the cell the test thread swapped in (Release) before its free.
                let target = cell.load(Ordering::Acquire);
                // Release: the test thread waits for this flag before swapping the cell.
                started.store(true, Ordering::Release);
                let r = call(target);
                assert!(r == 42 || r == 7, "a call returned {r}");
                // Relaxed: a sum read after `join`, which orders it.
                results.fetch_add(u64::from(r), Ordering::Relaxed);
                // SeqCst: counted before the quiescent point, so a reclaim that relied on it sees the count.
                quiescing.fetch_add(1, Ordering::SeqCst);
                executor.quiescent();
            }
        })
    };
    wait_until("the executor to enter the slow method", || {
        // Acquire: pairs with the executor's Release store of `started`.
        started.load(Ordering::Acquire)
    });
    std::thread::sleep(Duration::from_millis(20));
    // Unlink, then free, while the executor is (almost surely) inside `slow`.
    // Release: the new target is visible to the executor's Acquire load of the cell.
    cell.store(fast.start(), Ordering::Release);
    let (slow_start, slow_size) = (slow.start(), slow.size());
    heap.free(slow).unwrap();
    let reclaimed = heap.try_reclaim();
    // SeqCst: read after the reclaim attempt, in the order the executor counted.
    let passed = quiescing.load(Ordering::SeqCst);
    assert!(
        reclaimed == 0 || passed > 0,
        "freed bytes reclaimed while the executor could be running them"
    );
    if passed == 0 {
        // Still inside: a reservation of the same size must land elsewhere. Fill
        // it with traps and publish it: the canary.
        let mut r = heap.reserve(slow_size).unwrap();
        assert_ne!(
            r.address(),
            slow_start,
            "the running method's bytes were reused"
        );
        arch::trap_fill(r.code_mut());
        let canary = r
            .publish(CodeInfo::new(3, "canary", JitKind::Optimized))
            .unwrap();
        heap.free(canary).unwrap();
    }
    // Once the executor has passed a quiescent point, the bytes come back.
    wait_until("a quiescent point", || {
        // SeqCst: as above.
        quiescing.load(Ordering::SeqCst) >= 2
    });
    wait_until("reclamation", || {
        heap.try_reclaim() > 0 || heap.stats().retired_blocks == 0
    });
    let mut r = heap.reserve(slow_size).unwrap();
    assert_eq!(r.address(), slow_start, "best fit reuses the freed extent");
    arch::trap_fill(r.code_mut());
    let trap = r
        .publish(CodeInfo::new(4, "traps", JitKind::Optimized))
        .unwrap();
    // The executor keeps calling through the cell, now `fast`, never the traps.
    // SeqCst: as above.
    let before = quiescing.load(Ordering::SeqCst);
    wait_until("more calls", || {
        // SeqCst: as above.
        quiescing.load(Ordering::SeqCst) >= before + 100
    });
    // Release: pairs with the executor's Acquire load of `stop`.
    stop.store(true, Ordering::Release);
    x.join().unwrap();
    // SeqCst: read after `join`; as above.
    let calls = quiescing.load(Ordering::SeqCst);
    // Relaxed: read after `join`, which orders it.
    assert_eq!(results.load(Ordering::Relaxed), 42 + 7 * (calls - 1));
    heap.free(trap).unwrap();
}

#[test]
fn offline_and_dropped_executors_do_not_hold_frees() {
    let m = ExecutionManager::new(3);
    let heap = heap(&m);
    let executor = m.register_executor().unwrap();
    let a = publish(&heap, 1, &seven());
    heap.free(a).unwrap();
    assert_eq!(heap.try_reclaim(), 0, "online, not yet quiescent");
    executor.quiescent();
    assert!(heap.try_reclaim() > 0);

    let b = publish(&heap, 2, &seven());
    executor.offline();
    heap.free(b).unwrap();
    assert!(heap.try_reclaim() > 0, "an offline executor holds nothing");
    executor.online();
    let c = publish(&heap, 3, &seven());
    heap.free(c).unwrap();
    assert_eq!(heap.try_reclaim(), 0);
    drop(executor);
    assert!(heap.try_reclaim() > 0, "a dropped executor holds nothing");

    // Executors and readers share the domain's slots.
    let e1 = m.register_executor().unwrap();
    let r1 = m.register_reader().unwrap();
    let e2 = m.register_executor().unwrap();
    assert_eq!(
        m.register_reader().err(),
        Some(jitmap::EpochError::NoSlots { slots: 3 })
    );
    drop((e1, r1, e2));
}
