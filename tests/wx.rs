//! W^X done right: an unpredictable writable alias, a flip mode with no alias at
//! all, and patching of published code with the cache and cross-core handling.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use jitmap_testkit::arch;

use jitmap::{CodeHeap, CodeInfo, CodeRef, Domain, HeapConfig, HeapError, JitKind, MemoryMode};

fn heap(mode: MemoryMode) -> CodeHeap {
    CodeHeap::new(
        HeapConfig {
            span: 1 << 20,
            mode,
            ..HeapConfig::default()
        },
        &Domain::new(2),
    )
    .unwrap()
}

/// A function that returns `value`, for this architecture.
fn returns(heap: &CodeHeap, value: u32) -> CodeRef {
    let code = arch::returns(value as u16);
    let mut r = heap.reserve(code.len() as u64).unwrap();
    r.code_mut().copy_from_slice(&code);
    r.publish(CodeInfo::new(u64::from(value), "ret", JitKind::Optimized))
        .unwrap()
}

fn call(addr: usize) -> u32 {
    // SAFETY: `addr` is a published C function taking nothing and returning
    // a 32-bit value; the caller keeps its heap alive.
    let f: extern "C" fn() -> u32 = unsafe { std::mem::transmute(addr) };
    f()
}

/// The permissions `/proc/self/maps` shows for the page holding `addr`.
/// The modes that patch published code and run it again, on this target.
fn patch_modes() -> Vec<MemoryMode> {
    arch::rewrite_modes()
        .iter()
        .copied()
        .filter(|&m| m != MemoryMode::FlipOnPublish)
        .collect()
}

fn permissions(addr: usize) -> String {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    for line in maps.lines() {
        let (range, rest) = line.split_once(' ').unwrap();
        let (lo, hi) = range.split_once('-').unwrap();
        let (lo, hi) = (
            usize::from_str_radix(lo, 16).unwrap(),
            usize::from_str_radix(hi, 16).unwrap(),
        );
        if (lo..hi).contains(&addr) {
            return rest[..4].to_owned();
        }
    }
    panic!("{addr:#x} is not mapped");
}

#[test]
fn the_writable_view_is_not_at_a_predictable_address() {
    let heaps: Vec<CodeHeap> = (0..8).map(|_| heap(MemoryMode::WriteXorExecute)).collect();
    let mut deltas = Vec::new();
    for h in &heaps {
        let code = returns(h, 1);
        let write = h.write_address(code).unwrap();
        assert_eq!(permissions(code.start()), "r-xs");
        assert_eq!(permissions(write), "rw-s");
        let delta = write.abs_diff(code.start());
        assert!(delta > 1 << 32, "alias {delta:#x} bytes from the code");
        deltas.push(write.wrapping_sub(code.start()));
    }
    deltas.sort();
    deltas.dedup();
    assert_eq!(deltas.len(), 8, "every alias at its own offset");
    let rwx = heap(MemoryMode::Rwx);
    let code = returns(&rwx, 1);
    assert_eq!(rwx.write_address(code), Ok(code.start()));
}

#[test]
fn flip_mode_pages_are_writable_until_published_then_executable() {
    let h = heap(MemoryMode::FlipOnPublish);
    let nine = arch::returns(9);
    let mut r = h.reserve(nine.len() as u64).unwrap();
    let at = r.address();
    assert_eq!(permissions(at), "rw-p");
    r.code_mut().copy_from_slice(&nine);
    let code = r
        .publish(CodeInfo::new(9, "nine", JitKind::Optimized))
        .unwrap();
    assert_eq!(permissions(at), "r-xp");
    assert_eq!(call(code.start()), 9);
    // Its neighbour, on its own page, is still writable while reserved.
    let next = h.reserve(6).unwrap();
    assert_eq!(next.address() / 4096, at / 4096 + 1);
    assert_eq!(permissions(next.address()), "rw-p");
    drop(next);
    assert_eq!(
        h.patch(code, |b| arch::set_returned(b, 10)),
        Err(HeapError::NotPatchable { start: at })
    );
    assert_eq!(
        h.write_address(code),
        Err(HeapError::NotPatchable { start: at })
    );
    // Lookups work from the executable pages.
    let reader = h.domain().register().unwrap();
    {
        let g = reader.pin().unwrap();
        let last = nine.len() - 1;
        let b = h.find(&g, at + last).unwrap().unwrap();
        assert_eq!(
            (b.start(), b.offset() as usize, b.size() as usize),
            (at, last, nine.len())
        );
    }
    // Reuse flips the pages back.
    h.free(code).unwrap();
    h.try_reclaim();
    let again = h.reserve(6).unwrap();
    assert_eq!(again.address(), at);
    assert_eq!(permissions(at), "rw-p");
}

#[test]
fn published_code_is_patched_while_another_thread_runs_it() {
    // Patching is refused in flip mode; its modes here are the ones that
    // may run rewritten bytes on this target (`arch::rewrite_modes`).
    for mode in patch_modes() {
        let h = Arc::new(heap(mode));
        let code = returns(&h, 1);
        let patched = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let after = Arc::new(AtomicU64::new(0));
        let runner = {
            let (patched, stop, after) = (patched.clone(), stop.clone(), after.clone());
            let start = code.start();
            std::thread::spawn(move || {
                // Acquire: pairs with the Release store of `stop`.
                while !stop.load(Ordering::Acquire) {
                    // Acquire: pairs with the Release store after `patch` returned.
                    let was_patched = patched.load(Ordering::Acquire);
                    let r = call(start);
                    assert!(r == 1 || r == 2, "torn code returned {r}");
                    if was_patched {
                        assert_eq!(r, 2, "stale code ran after the patch returned");
                        // Relaxed: a progress counter; the test thread only polls it.
                        after.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(10));
        h.patch(code, |bytes| arch::set_returned(bytes, 2)).unwrap();
        // Release: orders the completed patch before the runner's Acquire load.
        patched.store(true, Ordering::Release);
        // Relaxed: as in the runner.
        while after.load(Ordering::Relaxed) < 1000 {
            std::thread::yield_now();
        }
        // Release: pairs with the runner's Acquire load of `stop`.
        stop.store(true, Ordering::Release);
        runner.join().unwrap();
        assert_eq!(call(code.start()), 2);
        // A freed block can no longer be patched, and nothing is written.
        h.free(code).unwrap();
        assert_eq!(
            h.patch(code, |b| arch::set_returned(b, 3)),
            Err(HeapError::DoubleFree {
                start: code.start()
            })
        );
    }
}

/// A patch closure that calls back into its heap (a lookup of live blocks, a
/// patch of another block, a free of its own block) finishes: the closure
/// runs with no lock held. The free wins, so the outer patch writes nothing
/// and says why. A deadlock fails the test instead of hanging it.
#[test]
fn a_patch_closure_may_call_back_into_its_heap() {
    // Patching is refused in flip mode; its modes here are the ones that
    // may run rewritten bytes on this target (`arch::rewrite_modes`).
    for mode in patch_modes() {
        let h = Arc::new(heap(mode));
        let (first, second) = (returns(&h, 1), returns(&h, 2));
        let (done, finished) = std::sync::mpsc::channel();
        let worker = Arc::clone(&h);
        std::thread::spawn(move || {
            let nested = worker.patch(first, |bytes| {
                assert_eq!(worker.live_blocks().len(), 2);
                worker.patch(second, |b| arch::set_returned(b, 20)).unwrap();
                arch::set_returned(bytes, 10);
            });
            let freed = worker.patch(second, |bytes| {
                worker.free(second).unwrap();
                arch::set_returned(bytes, 30);
            });
            done.send((nested, freed)).unwrap();
        });
        let (nested, freed) = finished
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("a patch closure that calls into its heap deadlocked");
        assert_eq!(nested, Ok(()));
        assert_eq!(
            freed,
            Err(HeapError::DoubleFree {
                start: second.start()
            })
        );
        assert_eq!(call(first.start()), 10);
        assert_eq!(h.live_blocks().len(), 1);
    }
}

/// A patch closure that panics after changing bytes leaves the live code as
/// it was (it only ever edits a copy), and the heap stays usable.
#[test]
fn a_panicking_patch_closure_changes_nothing() {
    // Patching is refused in flip mode; its modes here are the ones that
    // may run rewritten bytes on this target (`arch::rewrite_modes`).
    for mode in patch_modes() {
        let h = heap(mode);
        let code = returns(&h, 7);
        // SAFETY: the block is live; its six bytes are readable code.
        let live = || unsafe { std::slice::from_raw_parts(code.start() as *const u8, 6) }.to_vec();
        let before = live();
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            h.patch(code, |bytes| {
                arch::set_returned(bytes, 99);
                panic!("the host's patch failed halfway");
            })
        }));
        assert!(panicked.is_err());
        assert_eq!(live(), before);
        assert_eq!(call(code.start()), 7);
        h.patch(code, |bytes| arch::set_returned(bytes, 8)).unwrap();
        assert_eq!(call(code.start()), 8);
    }
}

/// Code rewritten in place through the write address, as a C JIT rewrites
/// a constant, is made visible by `make_visible`; an unchanged patch makes
/// its block coherent too (it used to return at once, with no cache
/// maintenance and no cross-core sync). Each counts one core sync; a
/// refused call changes nothing and syncs nothing.
#[test]
fn code_written_in_place_is_made_visible_and_an_unchanged_patch_still_syncs() {
    for mode in patch_modes() {
        let h = heap(mode);
        let code = returns(&h, 7);
        let syncs = || h.stats().core_syncs;
        let start = syncs();
        h.patch(code, |_| {}).unwrap();
        assert_eq!(syncs(), start + 1, "{mode:?}: an unchanged patch");
        // Rewritten in place through the write address, after the old code
        // ran: the function's bytes, its constant changed.
        assert_eq!(call(code.start()), 7, "{mode:?}");
        let mut bytes = arch::returns(7);
        arch::set_returned(&mut bytes, 42);
        let write = h.write_address(code).unwrap() as *mut u8;
        // SAFETY: the block is live and `bytes.len()` long; nothing else
        // writes it.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), write, bytes.len()) };
        h.make_visible(code, 0..code.size()).unwrap();
        assert_eq!(syncs(), start + 2);
        assert_eq!(call(code.start()), 42, "{mode:?}");
        // Refused: past the end, reversed, a freed block.
        let size = code.size();
        assert_eq!(
            h.make_visible(code, size..size + 1),
            Err(HeapError::OutsideBlock {
                start: code.start(),
                begin: size,
                end: size + 1,
                size,
            })
        );
        assert!(matches!(
            h.make_visible(code, std::ops::Range { start: 3, end: 2 }),
            Err(HeapError::OutsideBlock {
                begin: 3,
                end: 2,
                ..
            })
        ));
        h.free(code).unwrap();
        assert!(matches!(
            h.make_visible(code, 0..1),
            Err(HeapError::DoubleFree { .. })
        ));
        assert_eq!(syncs(), start + 2);
    }
    // Flip mode has no writable alias.
    let h = heap(MemoryMode::FlipOnPublish);
    let code = returns(&h, 7);
    assert_eq!(
        h.write_address(code),
        Err(HeapError::NotPatchable {
            start: code.start()
        })
    );
    assert_eq!(
        h.make_visible(code, 0..1),
        Err(HeapError::NotPatchable {
            start: code.start()
        })
    );
    assert_eq!(h.stats().core_syncs, 0);
}
