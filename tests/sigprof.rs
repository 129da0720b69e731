//! Nested pinning from a real SIGPROF handler: the handler pins and looks up while
//! the interrupted thread is inside its own pins and lookups. A freed block must
//! stay unreclaimed until the outer guard drops.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

mod common;
mod signals;

use jitmap::heap::{BlockKind, JitKind};
use jitmap::{CodeHeap, CodeInfo, Reader};

static HEAP: AtomicPtr<CodeHeap> = AtomicPtr::new(std::ptr::null_mut());
static READER: AtomicPtr<Reader> = AtomicPtr::new(std::ptr::null_mut());
static LIVE_IP: AtomicUsize = AtomicUsize::new(0);
static LIVE_START: AtomicUsize = AtomicUsize::new(0);
static FREED_IP: AtomicUsize = AtomicUsize::new(0);
static HANDLED: AtomicUsize = AtomicUsize::new(0);
static BAD: AtomicUsize = AtomicUsize::new(0);

/// Exact method id and start of the block at `ip`, or None.
fn method_at(heap: &CodeHeap, guard: &jitmap::Guard<'_>, ip: usize) -> Option<(u64, usize)> {
    heap.find(guard, ip).unwrap().and_then(|b| match b.kind() {
        BlockKind::Method(h) => Some((h.method_id(), b.start())),
        BlockKind::Stub(_) => None,
    })
}

extern "C" fn on_sigprof(_: libc::c_int) {
    let (heap, reader) = (HEAP.load(Ordering::Acquire), READER.load(Ordering::Acquire));
    if heap.is_null() || reader.is_null() {
        return;
    }
    // SAFETY: both pointers are set by the test thread (which this handler
    // interrupts) before signals are sent, and cleared before the objects drop.
    let (heap, reader) = unsafe { (&*heap, &*reader) };
    let Ok(guard) = reader.pin() else {
        BAD.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let live = method_at(heap, &guard, LIVE_IP.load(Ordering::Relaxed));
    if live != Some((2, LIVE_START.load(Ordering::Relaxed))) {
        BAD.fetch_add(1, Ordering::Relaxed);
    }
    if heap
        .find(&guard, FREED_IP.load(Ordering::Relaxed))
        .unwrap()
        .is_some()
    {
        BAD.fetch_add(1, Ordering::Relaxed);
    }
    drop(guard);
    HANDLED.fetch_add(1, Ordering::Relaxed);
}

#[test]
fn sigprof_handler_nests_without_ending_outer_protection() {
    let (domain, heap) = common::small_heap(4);
    let publish = |id, size| {
        let mut r = heap.reserve(size).unwrap();
        r.code_mut().fill(0xCC);
        r.publish(CodeInfo::new(id, format!("m{id}"), JitKind::Baseline))
            .unwrap()
    };
    let freed = publish(1, 3000);
    let live = publish(2, 5000);
    let reader = domain.register().unwrap();

    let outer = reader.pin().unwrap();
    let BlockKind::Method(freed_header) = heap
        .find(&outer, freed.start() + 100)
        .unwrap()
        .unwrap()
        .kind()
    else {
        panic!("expected a method")
    };
    heap.free(freed).unwrap();

    LIVE_IP.store(live.start() + 4999, Ordering::Relaxed);
    LIVE_START.store(live.start(), Ordering::Relaxed);
    FREED_IP.store(freed.start() + 100, Ordering::Relaxed);
    HEAP.store(&heap as *const _ as *mut _, Ordering::Release);
    READER.store(&reader as *const _ as *mut _, Ordering::Release);

    // SAFETY: installs a handler that only touches atomics and lock-free lookups.
    unsafe { signals::install_sigprof(on_sigprof) };

    // SAFETY: pthread_self has no preconditions.
    let target = unsafe { libc::pthread_self() };
    let done = AtomicBool::new(false);
    let cycles = AtomicUsize::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            // Each signal waits for the one before it to be handled (a
            // pending one would absorb it), and the sender goes on until the
            // test thread has also run its own lookups 100 times: events,
            // not time, so a loaded machine only makes it slower.
            let cap = Instant::now() + Duration::from_secs(120);
            // Relaxed: counters polled; the scope's join orders the rest.
            let handled = || HANDLED.load(Ordering::Relaxed);
            for _ in 0..300 {
                let before = handled();
                // SAFETY: `target` is the test thread, alive until this scope ends.
                unsafe { libc::pthread_kill(target, libc::SIGPROF) };
                while handled() == before && Instant::now() < cap {
                    std::thread::yield_now();
                }
            }
            // Relaxed: as above.
            while cycles.load(Ordering::Relaxed) < 100 && Instant::now() < cap {
                std::thread::yield_now();
            }
            done.store(true, Ordering::Release);
        });
        while !done.load(Ordering::Acquire) {
            let inner = reader.pin().unwrap();
            assert_eq!(
                method_at(&heap, &inner, live.start() + 17),
                Some((2, live.start()))
            );
            assert_eq!(method_at(&heap, &inner, freed.start()), None);
            drop(inner);
            assert_eq!(
                method_at(&heap, &outer, live.start()),
                Some((2, live.start()))
            );
            // Relaxed: a progress counter.
            cycles.fetch_add(1, Ordering::Relaxed);
        }
    });

    // SAFETY: restores the default disposition before the handler's data drops.
    unsafe { libc::signal(libc::SIGPROF, libc::SIG_DFL) };
    HEAP.store(std::ptr::null_mut(), Ordering::Release);
    READER.store(std::ptr::null_mut(), Ordering::Release);

    assert!(
        HANDLED.load(Ordering::Relaxed) >= 300,
        "handled {}",
        HANDLED.load(Ordering::Relaxed)
    );
    assert!(cycles.into_inner() >= 100);
    assert_eq!(BAD.load(Ordering::Relaxed), 0);
    assert_eq!(
        heap.try_reclaim(),
        0,
        "the outer guard still protects the freed block"
    );
    assert_eq!((freed_header.method_id(), freed_header.name()), (1, "m1"));
    drop(outer);
    // The extent: the prefix and the code, padded to 16 bytes past the start of
    // the 32-byte bucket holding the last code byte (offset 3015 → 3008 + 16).
    assert_eq!(heap.try_reclaim(), 3024);
}

#[test]
fn nested_guards_release_only_at_the_outermost_drop() {
    let (domain, heap) = common::small_heap(1);
    let r = heap
        .reserve(100)
        .unwrap()
        .publish(CodeInfo::new(1, "a", JitKind::Baseline))
        .unwrap();
    let reader = domain.register().unwrap();
    let outer = reader.pin().unwrap();
    heap.free(r).unwrap();
    for _ in 0..3 {
        let inner = reader.pin().unwrap();
        let innermost = reader.pin().unwrap();
        drop(innermost);
        drop(inner);
        assert_eq!(heap.try_reclaim(), 0);
    }
    drop(outer);
    // Extent: 16-byte prefix + 100 bytes of code, rounded up to 8.
    assert_eq!(heap.try_reclaim(), 120);
}
