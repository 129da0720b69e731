//! The C ABI's async-signal-safe calls allocate nothing in a signal handler:
//! a SIGPROF handler on a worker thread calls every one of them (pin, find,
//! find with the method's info, find the return address, unpin, the executor's quiescent point, the three
//! probes, a status's name) thousands of times, under the
//! counting allocator of the Rust API's own torture test, which counts heap
//! calls made with SIGPROF blocked (as it is while its handler runs).

use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use jitmap_capi::*;
use jitmap_testkit::signal_alloc::{self, SignalCounting};

#[global_allocator]
static GLOBAL: SignalCounting = SignalCounting;

/// What the handler uses, set before the first signal.
static READER: AtomicUsize = AtomicUsize::new(0);
static EXECUTOR: AtomicUsize = AtomicUsize::new(0);
static CONTEXT: AtomicUsize = AtomicUsize::new(0);
static CELL: AtomicUsize = AtomicUsize::new(0);
static METHOD: AtomicUsize = AtomicUsize::new(0);
/// The worker thread, which the signals target.
static WORKER: AtomicUsize = AtomicUsize::new(0);
/// Handler runs, and runs whose every answer was right.
static RUNS: AtomicU64 = AtomicU64::new(0);
static RIGHT: AtomicU64 = AtomicU64::new(0);

fn ok(status: jitmap_status) {
    assert_eq!(status, jitmap_status::JITMAP_STATUS_OK);
}

extern "C" fn on_sigprof(_: libc::c_int) {
    // Relaxed (all loads here): METHOD and CELL were stored before the
    // worker was spawned, the others by the worker itself before its first
    // signal, and this handler runs on the worker.
    let reader = READER.load(Ordering::Relaxed) as *mut jitmap_reader;
    let executor = EXECUTOR.load(Ordering::Relaxed) as *mut jitmap_executor;
    let context = CONTEXT.load(Ordering::Relaxed) as *const jitmap_probe_context;
    let cell = CELL.load(Ordering::Relaxed) as *const jitmap_counter_cell;
    let method = METHOD.load(Ordering::Relaxed);
    let mut right = true;
    // SAFETY: the guard and block are locals; the handles and pointers are
    // live until the worker that takes this signal is joined.
    unsafe {
        let mut guard = std::mem::MaybeUninit::<jitmap_guard>::uninit();
        right &= jitmap_pin(reader, guard.as_mut_ptr()) == jitmap_status::JITMAP_STATUS_OK;
        let guard = guard.as_mut_ptr();
        let mut info = std::mem::MaybeUninit::<jitmap_method_info>::uninit();
        right &= jitmap_guard_find_info(guard, method + 3, info.as_mut_ptr())
            == jitmap_status::JITMAP_STATUS_OK;
        let i = info.assume_init();
        right &= (i.block.method_id, i.block.start, i.block.offset, i.line) == (9, method, 3, 12);
        let mut block = std::mem::MaybeUninit::<jitmap_block>::uninit();
        right &= jitmap_guard_find(guard, method + 3, block.as_mut_ptr())
            == jitmap_status::JITMAP_STATUS_OK;
        let b = block.assume_init();
        right &= (b.method_id, b.start, b.offset, b.name_len) == (9, method, 3, 6);
        right &= jitmap_guard_find_return_address(guard, method + 1, block.as_mut_ptr())
            == jitmap_status::JITMAP_STATUS_OK;
        right &= jitmap_guard_find(guard, 0x1000, block.as_mut_ptr())
            == jitmap_status::JITMAP_STATUS_NOT_FOUND;
        right &= jitmap_unpin(guard) == jitmap_status::JITMAP_STATUS_OK;
        right &= jitmap_executor_quiescent(executor) == jitmap_status::JITMAP_STATUS_OK;
        jitmap_probe_enter(context, 9);
        jitmap_probe_value(context, 9, 42);
        jitmap_probe_count(cell);
        right &= !jitmap_status_name(3).is_null();
    }
    // Relaxed: counters read after the worker is joined.
    RUNS.fetch_add(1, Ordering::Relaxed);
    if right {
        RIGHT.fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn the_signal_safe_calls_allocate_nothing_in_a_handler() {
    // The detector sees a heap call made with SIGPROF blocked.
    signal_alloc::check_mask(true);
    signal_alloc::with_sigprof_blocked(|| drop(std::hint::black_box(vec![1u8; 64])));
    assert!(signal_alloc::take_while_blocked() >= 1);

    // SAFETY (the calls below): outputs point to locals.
    let mut m = null_mut();
    ok(unsafe { jitmap_manager_create(8, &mut m) });
    let mut config = std::mem::MaybeUninit::uninit();
    unsafe { jitmap_heap_config_default(config.as_mut_ptr()) };
    let mut config = unsafe { config.assume_init() };
    config.span = 1 << 20;
    let mut heap = null_mut();
    ok(unsafe { jitmap_heap_create(m, &config, &mut heap) });
    let mut r = null_mut();
    ok(unsafe { jitmap_heap_reserve(heap, 16, 0, &mut r, null_mut()) });
    let mut write = null_mut();
    ok(unsafe { jitmap_reservation_code(r, &mut write, null_mut(), null_mut()) });
    // SAFETY: the reservation's 16 writable bytes.
    unsafe { write.write_bytes(0xC3, 16) };
    let row = jitmap_debug_row {
        offset: 0,
        line: 12,
        column: 1,
        file: c"host.c".as_ptr(),
    };
    let info = jitmap_code_info {
        method_id: 9,
        name: c"probed".as_ptr(),
        debug: &row,
        debug_count: 1,
        ..Default::default()
    };
    let mut code = std::mem::MaybeUninit::uninit();
    // SAFETY: the info and the output are locals.
    ok(unsafe { jitmap_reservation_publish(r, &info, code.as_mut_ptr()) });
    // SAFETY: written by the publish that returned OK.
    let code = unsafe { code.assume_init() };
    // Relaxed (the stores below): read by the worker's handler, which
    // starts after them (the spawn orders them).
    METHOD.store(code.start, Ordering::Relaxed);
    let mut counters = null_mut();
    // SAFETY (the calls below): outputs point to locals.
    ok(unsafe { jitmap_counters_create(1, 1_000_000, &mut counters) });
    let mut cell = std::ptr::null();
    ok(unsafe { jitmap_counters_cell(counters, 0, &mut cell) });
    CELL.store(cell as usize, Ordering::Relaxed);
    let mut agent_config = std::mem::MaybeUninit::uninit();
    unsafe { jitmap_agent_config_default(agent_config.as_mut_ptr()) };
    // SAFETY: written by the call above.
    let mut agent_config = unsafe { agent_config.assume_init() };
    // The agent's own timers use another signal, rarely: this test's
    // handler owns SIGPROF.
    agent_config.signal = libc::SIGUSR2;
    agent_config.hz = 1;
    let mut agent = null_mut();
    // SAFETY: the config and the output are locals.
    ok(unsafe { jitmap_agent_start(m, &agent_config, &mut agent) });

    // SAFETY: installs a handler that only makes async-signal-safe calls.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_sigprof as *const () as usize;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGPROF, &action, null_mut());
    }
    let ready = AtomicBool::new(false);
    let stop = AtomicBool::new(false);
    let (m_bits, agent_bits) = (m as usize, agent as usize);
    std::thread::scope(|s| {
        let worker = s.spawn(|| {
            let (m, agent) = (
                m_bits as *mut jitmap_manager,
                agent_bits as *mut jitmap_agent,
            );
            let (mut reader, mut executor, mut thread) = (null_mut(), null_mut(), null_mut());
            // SAFETY: outputs point to locals.
            unsafe {
                ok(jitmap_reader_register(m, &mut reader));
                ok(jitmap_executor_register(m, &mut executor));
                ok(jitmap_agent_attach(agent, &mut thread));
                let mut context = std::ptr::null();
                ok(jitmap_thread_probe_context(thread, &mut context));
                // Relaxed (the four stores): the handler that reads them runs
                // on this thread, after them in its order; the main thread
                // reads WORKER after `ready`'s Release.
                CONTEXT.store(context as usize, Ordering::Relaxed);
            }
            READER.store(reader as usize, Ordering::Relaxed);
            // SAFETY: pthread_self has no precondition.
            WORKER.store(unsafe { libc::pthread_self() } as usize, Ordering::Relaxed);
            EXECUTOR.store(executor as usize, Ordering::Relaxed);
            let before = signal_alloc::thread_heap_calls();
            // Release: the handles above are stored before the signals start.
            ready.store(true, Ordering::Release);
            // Acquire: pairs with the main thread's Release after its last
            // signal was handled.
            while !stop.load(Ordering::Acquire) {
                std::hint::spin_loop();
            }
            let during = signal_alloc::thread_heap_calls() - before;
            ok(jitmap_thread_detach(thread));
            ok(jitmap_executor_destroy(executor));
            ok(jitmap_reader_destroy(reader));
            during
        });
        // Acquire: pairs with the worker's Release.
        while !ready.load(Ordering::Acquire) {
            std::hint::spin_loop();
        }
        // Relaxed: stored before `ready`'s Release.
        let target = WORKER.load(Ordering::Relaxed) as libc::pthread_t;
        for _ in 0..5_000 {
            let runs = RUNS.load(Ordering::Relaxed);
            // SAFETY: the worker is alive until `stop`.
            unsafe { libc::pthread_kill(target, libc::SIGPROF) };
            // Relaxed: waits for the handler's count to move.
            while RUNS.load(Ordering::Relaxed) == runs {
                std::hint::spin_loop();
            }
        }
        // Release: every handler run happened before the worker stops.
        stop.store(true, Ordering::Release);
        // Every heap call the worker made between ready and stop was made
        // in the handler, and there were none.
        assert_eq!(worker.join().unwrap(), 0);
    });
    signal_alloc::check_mask(false);
    assert_eq!(signal_alloc::take_while_blocked(), 0);
    // Relaxed (both): the worker that counted them is joined.
    assert_eq!(RUNS.load(Ordering::Relaxed), 5_000);
    assert_eq!(RIGHT.load(Ordering::Relaxed), 5_000);

    let mut profile = null_mut();
    // SAFETY: outputs point to locals.
    unsafe {
        ok(jitmap_agent_stop(agent, &mut profile));
        ok(jitmap_profile_destroy(profile));
        ok(jitmap_counters_destroy(counters));
        ok(jitmap_heap_free(heap, code));
    }
    ok(jitmap_heap_destroy(heap));
    ok(jitmap_manager_destroy(m));
}
