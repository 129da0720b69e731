//! A host's own POSIX timers on the agent's signal, carrying values of their
//! own: a pointer to unmapped memory, and a pointer to a decoy that holds the
//! agent's record magic in every word. The agent's handler must read neither,
//! must pass both kinds of signal on to the handler the host had installed
//! before the agent, must keep sampling its own timers, and must allocate
//! nothing on either path (a counting allocator watches).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use jitmap::ExecutionManager;
use jitmap::agent::{Agent, AgentConfig, Clock};
use jitmap_testkit::signal_alloc::{
    SignalCounting, check_mask, take_while_blocked, with_sigprof_blocked,
};

/// Counts heap calls made inside a SIGPROF handler.
#[global_allocator]
static GLOBAL: SignalCounting = SignalCounting;

/// The agent's record magic ("jitmapth"), the decoy's every word.
const MAGIC: u64 = 0x6a69_746d_6170_7468;

/// Signals the host's own handler received, by the value they carried.
static TO_UNMAPPED: AtomicU64 = AtomicU64::new(0);
static TO_DECOY: AtomicU64 = AtomicU64::new(0);
static TO_OTHER: AtomicU64 = AtomicU64::new(0);
static UNMAPPED: AtomicUsize = AtomicUsize::new(0);
static DECOY: AtomicUsize = AtomicUsize::new(0);

extern "C" fn host_handler(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: an SA_SIGINFO handler receives a valid siginfo_t.
    let value = unsafe { (*info).si_value().sival_ptr } as usize;
    // Relaxed: counters read after every timer is gone.
    let counter = if value == UNMAPPED.load(Ordering::Relaxed) {
        &TO_UNMAPPED
    } else if value == DECOY.load(Ordering::Relaxed) {
        &TO_DECOY
    } else {
        &TO_OTHER
    };
    counter.fetch_add(1, Ordering::Relaxed);
}

/// A POSIX timer of the host's, sending SIGPROF with `value` to this thread
/// every millisecond of wall time.
struct HostTimer(libc::timer_t);

impl HostTimer {
    fn arm(value: usize) -> Self {
        // SAFETY: a zeroed sigevent is valid; the fields used are set.
        let mut event: libc::sigevent = unsafe { std::mem::zeroed() };
        event.sigev_notify = libc::SIGEV_THREAD_ID;
        event.sigev_signo = libc::SIGPROF;
        event.sigev_value = libc::sigval {
            sival_ptr: value as *mut libc::c_void,
        };
        // SAFETY: gettid has no preconditions.
        event.sigev_notify_thread_id = unsafe { libc::gettid() };
        let mut timer: libc::timer_t = std::ptr::null_mut();
        // SAFETY: valid event and out pointer.
        assert_eq!(
            unsafe { libc::timer_create(libc::CLOCK_MONOTONIC, &mut event, &mut timer) },
            0
        );
        let period = libc::timespec {
            tv_sec: 0,
            tv_nsec: 1_000_000,
        };
        let spec = libc::itimerspec {
            it_interval: period,
            it_value: period,
        };
        // SAFETY: a timer just created, a valid spec.
        assert_eq!(
            unsafe { libc::timer_settime(timer, 0, &spec, std::ptr::null_mut()) },
            0
        );
        Self(timer)
    }
}

impl Drop for HostTimer {
    fn drop(&mut self) {
        // SAFETY: the timer was created by `arm` and is deleted once.
        unsafe { libc::timer_delete(self.0) };
    }
}

#[test]
fn a_hosts_own_timers_on_the_agents_signal_are_passed_on_never_read() {
    // The host's handler, installed before the agent.
    // SAFETY: a zeroed sigaction is valid; the handler only touches atomics.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = host_handler as *const () as libc::sighandler_t;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        assert_eq!(
            libc::sigaction(libc::SIGPROF, &action, std::ptr::null_mut()),
            0
        );
    }
    // A page that is mapped, then unmapped: its address faults if read.
    // SAFETY: an anonymous private mapping, unmapped at once.
    let unmapped = unsafe {
        let page = libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(page, libc::MAP_FAILED);
        assert_eq!(libc::munmap(page, 4096), 0);
        page as usize
    };
    // The decoy: the record magic in every word, wherever a record keeps it.
    let decoy: Box<[u64; 64]> = Box::new([MAGIC; 64]);
    // Relaxed: set before the timers exist.
    UNMAPPED.store(unmapped, Ordering::Relaxed);
    DECOY.store(decoy.as_ptr() as usize, Ordering::Relaxed);

    let manager = ExecutionManager::new(4);
    let config = AgentConfig {
        hz: 1000,
        clock: Clock::Wall,
        ..AgentConfig::default()
    };
    let agent = Agent::start(&manager, config).unwrap();
    let attached = agent.attach_current_thread().unwrap();
    // The detector itself sees an allocation with SIGPROF blocked; then it
    // watches the handlers (only this thread's timers fire, and the
    // collector thread, which allocates, never has SIGPROF blocked).
    check_mask(true);
    with_sigprof_blocked(|| drop(std::hint::black_box(vec![1u8; 64])));
    assert_eq!(take_while_blocked(), 2, "alloc and free seen");
    let foreign = [
        HostTimer::arm(unmapped),
        HostTimer::arm(decoy.as_ptr() as usize),
    ];
    // Until each foreign timer has reached the host's handler 500 times
    // (half a second at their rate on an idle machine), at most a minute.
    let deadline = Instant::now() + Duration::from_secs(60);
    // Relaxed: counters polled; the final reads below follow the timers' deletion.
    let arrived =
        || TO_UNMAPPED.load(Ordering::Relaxed) >= 500 && TO_DECOY.load(Ordering::Relaxed) >= 500;
    let mut x = 1u64;
    while !arrived() && Instant::now() < deadline {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
    }
    drop(foreign);
    check_mask(false);
    assert_eq!(take_while_blocked(), 0, "a handler allocated");
    drop(attached);
    let profile = agent.stop();

    // Relaxed: every timer is deleted; the counts are final.
    let (to_unmapped, to_decoy, to_other) = (
        TO_UNMAPPED.load(Ordering::Relaxed),
        TO_DECOY.load(Ordering::Relaxed),
        TO_OTHER.load(Ordering::Relaxed),
    );
    // Both kinds of foreign signal reached the host's handler, 500 each
    // (and a few more before the timers were deleted).
    assert!(
        to_unmapped >= 500,
        "{to_unmapped} signals to the unmapped value"
    );
    assert!(to_decoy >= 500, "{to_decoy} signals to the decoy");
    // The agent's own timer signals never did.
    assert_eq!(to_other, 0);
    // The decoy was never written as a record (a sample bumps its counters).
    assert!(decoy.iter().all(|&w| w == MAGIC));
    // The agent sampled its own timer only, at the foreign timers' rate:
    // about 500 signals (fewer if its own coalesced more), never the
    // thousand foreign ones on top.
    assert!(
        (125..=700).contains(&profile.taken),
        "taken {} (foreign: {to_unmapped} + {to_decoy})",
        profile.taken
    );
    assert_eq!(profile.samples + profile.dropped, profile.taken);
}
