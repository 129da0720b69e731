//! A thread held inside a method while the host moves it: the old copy
//! keeps running until the thread's next quiescent point, and every sample
//! taken there after the move names the moved method, never the version
//! that held those bytes before it, never nothing.
//!
//! On the old collector only current starts were searched for a frame the
//! handler could not name: these samples ended as `[unattributed]`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use jitmap::agent::{Agent, AgentConfig, Clock, SampleFrame};
use jitmap::events::monotonic_ns;
use jitmap::{CodeInfo, ExecutionManager, HeapConfig, JitKind};

#[test]
fn a_thread_held_in_a_moved_methods_old_copy_is_sampled_as_that_method() {
    // `fn(flag: *const u64)`: spins until `*flag` is not zero.
    let spin = jitmap_testkit::arch::spin_until_set();
    let manager = ExecutionManager::new(8);
    let heap = manager
        .create_heap(HeapConfig {
            span: 1 << 20,
            ..HeapConfig::default()
        })
        .unwrap();
    // A version that held the bytes before: published, freed, reclaimed.
    let mut r = heap.reserve(spin.len() as u64).unwrap();
    r.code_mut().copy_from_slice(&spin);
    let earlier = r
        .publish(CodeInfo::new(1, "earlier", JitKind::Optimized))
        .unwrap();
    heap.free(earlier).unwrap();
    let cap = Instant::now() + Duration::from_secs(120);
    while heap.stats().retired_blocks > 0 && Instant::now() < cap {
        heap.try_reclaim();
        std::thread::yield_now();
    }

    let agent = Agent::start(
        &manager,
        AgentConfig {
            clock: Clock::Wall,
            keep_samples: true,
            ..AgentConfig::default()
        },
    )
    .unwrap();
    let mut r = heap.reserve(spin.len() as u64).unwrap();
    r.code_mut().copy_from_slice(&spin);
    let held = r
        .publish(CodeInfo::new(2, "held", JitKind::Optimized))
        .unwrap();
    assert_eq!(held.start(), earlier.start(), "the same bytes, reused");
    let old = held.start()..held.start() + spin.len();

    let release = Arc::new(AtomicU64::new(0));
    let entered = Arc::new(AtomicBool::new(false));
    std::thread::scope(|s| {
        let runner = {
            let (release, entered, agent, manager) = (&release, &entered, &agent, &manager);
            s.spawn(move || {
                // An executor: the old copy's bytes stay until its next
                // quiescent point, after the call returns.
                let executor = manager.register_executor().unwrap();
                let attached = agent.attach_current_thread().unwrap();
                // SAFETY: `spin` is a complete function of one pointer
                // argument; this thread is an online executor, so its
                // bytes stay while it runs them.
                let spin: extern "C" fn(*const AtomicU64) =
                    unsafe { std::mem::transmute(held.start()) };
                // Release: the main thread moves the method once it sees this.
                entered.store(true, Ordering::Release);
                spin(Arc::as_ptr(release));
                drop(attached);
                executor.quiescent();
            })
        };
        // Acquire: pairs with the runner's store.
        while !entered.load(Ordering::Acquire) && Instant::now() < cap {
            std::thread::yield_now();
        }
        let moved = heap.move_block(held).unwrap();
        assert_ne!(moved.start(), held.start());
        let moved_at = monotonic_ns();

        // Samples taken in the old copy after the move: each names `held`.
        let (mut named, mut other) = (0, Vec::new());
        while named < 50 && other.is_empty() && Instant::now() < cap {
            let kept = agent.take_kept().unwrap();
            for sample in kept.samples.iter().filter(|s| s.begin_ns > moved_at) {
                let leaf = sample.frames[0];
                let addr = match leaf {
                    SampleFrame::Jit { addr, .. } | SampleFrame::Unattributed { addr } => addr,
                    _ => continue,
                };
                if !old.contains(&addr) {
                    continue;
                }
                match leaf {
                    SampleFrame::Jit { method, offset, .. }
                        if kept.method(method).map(|m| m.name.as_str()) == Some("held")
                            && offset as usize == addr - old.start =>
                    {
                        named += 1
                    }
                    _ => other.push(format!(
                        "{leaf:?} {:?}",
                        match leaf {
                            SampleFrame::Jit { method, .. } => kept.method(method).cloned(),
                            _ => None,
                        }
                    )),
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Release: the runner returns from the old copy.
        release.store(1, Ordering::Release);
        runner.join().unwrap();
        assert_eq!(
            other,
            Vec::<String>::new(),
            "samples in the old copy named otherwise"
        );
        assert!(
            named >= 50,
            "only {named} samples in the old copy after the move"
        );
    });
    drop(agent.stop());
}
