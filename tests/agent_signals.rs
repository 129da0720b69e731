//! The agent among a host's own signals: a `sample_now` in another signal's
//! handler that interrupts a sample on the same thread, and a host signal
//! still pending when a thread detaches.

use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use jitmap::ExecutionManager;
use jitmap::agent::{Agent, AgentConfig, AttachedThread, Clock};

/// One agent per process, and one host disposition of each signal: the
/// tests take turns.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Installs `handler` (three arguments) for `signal`; returns the disposition
/// it replaced.
fn install(
    signal: i32,
    handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void),
) -> libc::sigaction {
    // SAFETY: zeroed sigactions are valid; the fields used are set.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = handler as *const () as libc::sighandler_t;
    action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
    // SAFETY: as above.
    let mut previous: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: valid storage and a valid disposition.
    unsafe {
        libc::sigemptyset(&mut action.sa_mask);
        assert_eq!(libc::sigaction(signal, &action, &mut previous), 0);
    }
    previous
}

fn restore(signal: i32, previous: &libc::sigaction) {
    // SAFETY: the disposition `sigaction` returned.
    unsafe { libc::sigaction(signal, previous, std::ptr::null_mut()) };
}

/// Sends `signal` to thread `tid` of this process.
fn tgkill(tid: i32, signal: i32) {
    // SAFETY: tgkill has no memory arguments.
    let r = unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, signal) };
    assert_eq!(r, 0);
}

fn set_blocked(signal: i32, blocked: bool) {
    // SAFETY: a valid sigset; changes this thread's mask only.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, signal);
        let how = if blocked {
            libc::SIG_BLOCK
        } else {
            libc::SIG_UNBLOCK
        };
        libc::pthread_sigmask(how, &set, std::ptr::null_mut());
    }
}

/// The attachment a SIGUSR1 handler samples through.
static ATTACHED: AtomicPtr<AttachedThread> = AtomicPtr::new(std::ptr::null_mut());
/// SIGUSR1s handled.
static HANDLED: AtomicU64 = AtomicU64::new(0);

extern "C" fn sample_in_handler(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // Acquire: pairs with the Release store of the pointer.
    let attached = ATTACHED.load(Ordering::Acquire);
    if !attached.is_null() {
        // SAFETY: the pointer is cleared before the attachment drops, on the
        // thread this handler interrupts (the only one signalled).
        unsafe { &*attached }.sample_now();
    }
    // Relaxed: a counter the sender and the sampled thread poll.
    HANDLED.fetch_add(1, Ordering::Relaxed);
}

#[test]
fn sample_now_that_interrupts_a_sample_is_dropped_not_written_into_its_slot() {
    // Enough interrupted samples to catch two producers on one slot, and
    // few enough to arrive within the cap on a machine loaded several times
    // over (5,000 did not, beside stress-ng and a soak).
    const WANTED: u64 = 2_000;
    let _turn = one_at_a_time();
    let previous = install(libc::SIGUSR1, sample_in_handler);
    let manager = ExecutionManager::new(8);
    let agent = Agent::start(
        &manager,
        AgentConfig {
            hz: 10_000,
            clock: Clock::Wall,
            ring_capacity: 4096,
            ..AgentConfig::default()
        },
    )
    .unwrap();
    let attached = agent.attach_current_thread().unwrap();
    let tid = attached.tid() as i32;
    ATTACHED.store(
        std::ptr::from_ref(&attached).cast_mut(),
        // Release: the handler's Acquire load sees a complete attachment.
        Ordering::Release,
    );
    // Relaxed: a counter; the scope below orders the threads that touch it.
    HANDLED.store(0, Ordering::Relaxed);
    let cap = Instant::now() + Duration::from_secs(120);
    std::thread::scope(|s| {
        s.spawn(|| {
            // Relaxed: polling a counter.
            while HANDLED.load(Ordering::Relaxed) < WANTED && Instant::now() < cap {
                tgkill(tid, libc::SIGUSR1);
                std::thread::yield_now();
            }
        });
        // This thread samples itself without pause, so that most SIGUSR1s
        // (and many SIGPROFs) land inside a sample already under way.
        // Relaxed: polling a counter.
        while HANDLED.load(Ordering::Relaxed) < WANTED && Instant::now() < cap {
            attached.sample_now();
        }
    });
    set_blocked(libc::SIGUSR1, true);
    // Release: as the store above (SIGUSR1 is blocked meanwhile anyway).
    ATTACHED.store(std::ptr::null_mut(), Ordering::Release);
    set_blocked(libc::SIGUSR1, false);
    drop(attached);
    let p = agent.stop();
    restore(libc::SIGUSR1, &previous);
    // Relaxed: read after the scope joined every thread that wrote it.
    let handled = HANDLED.load(Ordering::Relaxed);
    assert!(
        handled >= WANTED,
        "{handled} of {WANTED} signals arrived in 120 s"
    );
    // Every sample taken is either in the profile or counted as dropped: two
    // producers on one slot would lose one of them.
    assert_eq!(
        p.samples + p.dropped,
        p.taken,
        "{} samples + {} dropped of {} taken",
        p.samples,
        p.dropped,
        p.taken
    );
    assert!(
        p.dropped > 0,
        "no sample interrupted another: nothing was tested"
    );
}

/// The last SIGPROF the host's handler received: its `si_code` and value.
static HOST_CODE: AtomicI32 = AtomicI32::new(0);
static HOST_VALUE: AtomicU64 = AtomicU64::new(0);
static HOST_SIGNALS: AtomicU64 = AtomicU64::new(0);

extern "C" fn host_sigprof(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: an SA_SIGINFO handler receives a valid siginfo_t.
    let (code, value) = unsafe { ((*info).si_code, (*info).si_value().sival_ptr as u64) };
    // Relaxed: read after the signal was handled, on the same thread.
    HOST_CODE.store(code, Ordering::Relaxed);
    HOST_VALUE.store(value, Ordering::Relaxed);
    HOST_SIGNALS.fetch_add(1, Ordering::Relaxed);
}

/// Queues `signal` with `value` to thread `tid` of this process, as
/// `sigqueue` does for a process (`si_code` `SI_QUEUE`).
fn queue_to_thread(tid: i32, signal: i32, value: u64) {
    // SAFETY: a zeroed siginfo_t is valid storage.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    info.si_signo = signal;
    info.si_code = libc::SI_QUEUE;
    // The rt fields of x86-64 and aarch64 Linux: si_pid at 16, si_uid at 20,
    // si_value at 24.
    let base = std::ptr::from_mut(&mut info).cast::<u8>();
    // SAFETY: each write is inside the 128-byte siginfo_t, at its field.
    unsafe {
        base.add(16).cast::<i32>().write(libc::getpid());
        base.add(20).cast::<u32>().write(libc::getuid());
        base.add(24).cast::<u64>().write_unaligned(value);
    }
    // SAFETY: a complete siginfo_t, read by the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_rt_tgsigqueueinfo,
            libc::getpid(),
            tid,
            signal,
            std::ptr::from_ref(&info),
        )
    };
    assert_eq!(r, 0);
}

#[test]
fn a_host_signal_pending_at_detach_reaches_the_host_handler() {
    let _turn = one_at_a_time();
    let previous = install(libc::SIGPROF, host_sigprof);
    let manager = ExecutionManager::new(8);
    // One sample per CPU second: the agent's own timer stays quiet here, so
    // the pending SIGPROF is the host's alone.
    let agent = Agent::start(
        &manager,
        AgentConfig {
            hz: 1,
            clock: Clock::Cpu,
            ..AgentConfig::default()
        },
    )
    .unwrap();
    let attached = agent.attach_current_thread().unwrap();
    let tid = attached.tid() as i32;
    // Relaxed: the counters are written and read on this thread (by its
    // signal handler), so program order is enough.
    HOST_SIGNALS.store(0, Ordering::Relaxed);
    set_blocked(libc::SIGPROF, true);
    queue_to_thread(tid, libc::SIGPROF, 0x5eed);
    drop(attached); // detaches with the host's signal pending
    assert_eq!(
        HOST_SIGNALS.load(Ordering::Relaxed),
        0,
        "delivered while blocked"
    );
    set_blocked(libc::SIGPROF, false);
    assert_eq!(
        HOST_SIGNALS.load(Ordering::Relaxed),
        1,
        "the host's SIGPROF was swallowed at detach"
    );
    // The host's own siginfo, intact.
    assert_eq!(HOST_CODE.load(Ordering::Relaxed), libc::SI_QUEUE);
    assert_eq!(HOST_VALUE.load(Ordering::Relaxed), 0x5eed);
    drop(agent.stop());
    restore(libc::SIGPROF, &previous);
}
