//! The handler's back-off: a thread whose handler cannot keep up with its
//! timer samples at a longer period instead of never leaving its handler.
//!
//! A timer whose period is shorter than signal delivery plus the handler
//! keeps its thread in the handler: the next expiration is pending when the
//! handler returns, and no instruction of the thread's own runs. The agent
//! refuses periods under [`super::MIN_PERIOD`] outright, and each thread's
//! handler watches itself. A signal is late when its walk took more than a
//! quarter of the period, or, on the wall clock, when it arrived with an
//! overrun (expirations that came while it was still pending) less than a
//! period after the thread's previous handler returned: the thread was
//! kept in its handlers. A thread that waited for a CPU comes back with an
//! overrun too, but after a gap of a period or more; that signal is on
//! time (its sample counts every period it stands for). After two
//! late signals in a row the handler re-arms its own timer at twice the
//! period (`timer_settime` is async-signal-safe), up to [`MAX_BACKOFF`]
//! times the configured one; after [`ON_TIME_TO_RECOVER`] on time in a row
//! it halves it again, down to the configured period, so a passing spike of
//! load does not slow the profile for good. A CPU-clock timer's overruns say
//! nothing about the handler (the kernel checks such timers on its tick),
//! so only slow walks back it off.
//!
//! Each sample's weight is in configured periods: one signal at twice the
//! period stands for two. On the wall clock the handler's own time is not
//! billed to the frame it interrupted: a sample stands for the periods since
//! the previous signal less the whole periods the previous handler took
//! (at least one), since those expirations came while it ran; after a
//! re-arm, whose period starts when the handler returns, nothing is taken
//! off. A thread that waited for a CPU inside its handler was in the
//! agent's code, not its own: that wait is the handler's too. (On the CPU
//! clock the handler's CPU time is billed, at most a quarter of a period a
//! signal once backed off: wall time is no measure of the CPU a preempted
//! handler used.) A re-arm starts the new period from that moment,
//! so the part of a period that had passed is not counted: a thread that
//! backs off and recovers again and again counts a few percent fewer
//! periods than it ran. The profile reports the longest period any thread
//! reached ([`super::Profile::slowest_period`]).
//!
//! The handler re-arms only while the timer is its to re-arm (`armed`).
//! Whoever deletes the timer from another thread (`Agent::stop`) first
//! withdraws that ([`Pace::withdraw`]), then waits for the record's handlers
//! (the registry's slot count): the registry's SeqCst fences on both sides
//! make either the handler see the withdrawal, or the deleting thread see
//! the handler in flight and wait for it, so no handler re-arms a deleted
//! timer.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};

use super::timer::{self, Timer};

/// The most a thread's period grows: 1024 times the configured one.
pub(crate) const MAX_BACKOFF: u64 = 1024;

/// Late signals in a row that double a thread's period.
const LATE_TO_BACK_OFF: u32 = 2;

/// Signals on time in a row that halve a backed-off thread's period.
pub(crate) const ON_TIME_TO_RECOVER: u32 = 64;

/// One attached thread's timer, as its handler sees it.
pub(crate) struct Pace {
    /// The configured period.
    base_ns: u64,
    /// The timers run on the wall clock (overruns then mean a late handler).
    wall: bool,
    /// The period in force, a power of two times `base_ns`.
    period_ns: AtomicU64,
    /// The longest period in force so far.
    longest_ns: AtomicU64,
    /// The thread's timer (its `timer_t`), for the handler to re-arm.
    timer: AtomicUsize,
    /// When the thread's previous handler returned (CLOCK_MONOTONIC ns; 0:
    /// none yet).
    last_end_ns: AtomicU64,
    /// How long the thread's previous handler took (ns).
    last_took_ns: AtomicU64,
    /// Whether the handler may re-arm `timer`: set once it is armed,
    /// withdrawn before it is deleted.
    armed: AtomicBool,
    /// Late signals in a row (positive), or signals on time in a row
    /// (negative), as the handler last counted them.
    streak: AtomicI32,
}

impl Pace {
    /// A thread's pace before its timer is armed, at `base_ns`.
    pub(crate) fn new(base_ns: u64, wall: bool) -> Self {
        Self {
            base_ns,
            wall,
            period_ns: AtomicU64::new(base_ns),
            longest_ns: AtomicU64::new(base_ns),
            last_end_ns: AtomicU64::new(0),
            last_took_ns: AtomicU64::new(0),
            timer: AtomicUsize::new(0),
            armed: AtomicBool::new(false),
            streak: AtomicI32::new(0),
        }
    }

    /// Arms `timer` at the configured period and lets the handler re-arm it.
    /// Call on the thread the timer signals, with the agent's signal blocked,
    /// so that its handler does not run before this returns.
    pub(crate) fn arm(&self, timer: &Timer) -> Result<(), super::AgentError> {
        // Relaxed: the handler runs on this thread, after this returns and
        // the signal is unblocked; program order publishes both.
        self.timer.store(timer.id() as usize, Ordering::Relaxed);
        self.armed.store(true, Ordering::Relaxed);
        timer.set(self.base_ns)
    }

    /// Takes the timer back from the handler. The caller then issues a
    /// SeqCst fence (the registry's wait does not) and waits for the
    /// thread's handlers before it deletes the timer.
    pub(crate) fn withdraw(&self) {
        // Relaxed: the caller's SeqCst fence orders it before the wait for
        // handlers in flight; a handler's fence orders its load after its
        // count (the registry's handshake).
        self.armed.store(false, Ordering::Relaxed);
    }

    /// The period in force now, in nanoseconds.
    pub(crate) fn period_ns(&self) -> u64 {
        // Relaxed: read by this thread's handler, or as a statistic.
        self.period_ns.load(Ordering::Relaxed)
    }

    /// The longest period in force so far, in nanoseconds.
    pub(crate) fn longest_ns(&self) -> u64 {
        // Relaxed: a statistic, exact once the handler has stopped running.
        self.longest_ns.load(Ordering::Relaxed)
    }

    /// Whether the handler has backed this thread off at some point.
    pub(crate) fn backed_off(&self) -> bool {
        self.longest_ns() > self.base_ns
    }

    /// In the handler, for a signal with `overrun` coalesced expirations:
    /// the configured periods the sample stands for, less, on the wall
    /// clock, the whole ones the previous handler took (at least one).
    #[inline]
    pub(crate) fn weight(&self, overrun: u32) -> u32 {
        let factor = (self.period_ns() / self.base_ns.max(1)).max(1);
        let mut weight = (u64::from(overrun) + 1).saturating_mul(factor);
        if self.wall {
            // Relaxed: only this thread's handler reads and writes it.
            let handler = self.last_took_ns.load(Ordering::Relaxed) / self.base_ns.max(1);
            weight = weight.saturating_sub(handler).max(1);
        }
        u32::try_from(weight).unwrap_or(u32::MAX)
    }

    /// In the handler that began at `began_ns` and walked until `ended_ns`,
    /// for a signal with `overrun` coalesced expirations: re-arms the timer
    /// at twice the period if the handler cannot keep up, or at half a
    /// backed-off one once it keeps up again. The caller is counted in
    /// flight in the registry (its fence orders the `armed` load).
    #[inline]
    pub(crate) fn after_sample(&self, overrun: u32, began_ns: u64, ended_ns: u64) {
        let period = self.period_ns();
        let took_ns = ended_ns.saturating_sub(began_ns);
        // Relaxed: only this thread's handler reads and writes it.
        let last_end = self.last_end_ns.swap(ended_ns, Ordering::Relaxed);
        // Relaxed: as above.
        self.last_took_ns.store(took_ns, Ordering::Relaxed);
        // Less than a period of the thread's own since its previous
        // handler: an overrun then means handlers that cannot keep up, not
        // a thread that waited for a CPU.
        let crowded = last_end != 0 && began_ns.saturating_sub(last_end) < period;
        let late = took_ns > period / 4 || (self.wall && overrun > 0 && crowded);
        // Relaxed, here and below: only this thread's handler reads and
        // writes the streak (the signal does not nest).
        let streak = self.streak.load(Ordering::Relaxed);
        let streak = match (late, streak) {
            (true, s) => s.max(0).saturating_add(1),
            (false, s) => s.min(0).saturating_sub(1),
        };
        self.streak.store(streak, Ordering::Relaxed);
        let next = if streak >= LATE_TO_BACK_OFF as i32 {
            period.saturating_mul(2)
        } else if streak <= -(ON_TIME_TO_RECOVER as i32) {
            period / 2
        } else {
            return;
        };
        let next = next.clamp(self.base_ns, self.base_ns.saturating_mul(MAX_BACKOFF));
        // Relaxed: the registry's fence in `enter` orders it after this
        // handler's count, which a withdrawing thread waits for.
        if next == period || !self.armed.load(Ordering::Relaxed) {
            return;
        }
        // Relaxed: as `arm`.
        let id = self.timer.load(Ordering::Relaxed) as libc::timer_t;
        if timer::set_period(id, next) {
            self.period_ns.store(next, Ordering::Relaxed);
            self.longest_ns.fetch_max(next, Ordering::Relaxed);
            self.streak.store(0, Ordering::Relaxed);
            // The new period runs from now: none of this handler's time is
            // in the next signal's periods. Relaxed: only this thread's
            // handler reads and writes it.
            self.last_took_ns.store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_weighs_its_overrun_times_the_backed_off_factor() {
        let pace = Pace::new(1000, true);
        assert_eq!((pace.weight(0), pace.weight(3)), (1, 4));
        pace.period_ns.store(8000, Ordering::Relaxed);
        assert_eq!((pace.weight(0), pace.weight(3)), (8, 32));
        assert!(!pace.backed_off());
        pace.longest_ns.store(8000, Ordering::Relaxed);
        assert!(pace.backed_off());
        pace.period_ns.store(1000 * MAX_BACKOFF, Ordering::Relaxed);
        assert_eq!(pace.weight(u32::MAX), u32::MAX);
    }

    /// On the wall clock the previous handler's whole periods come off the
    /// next sample's weight (it stands for one at least); on the CPU clock
    /// they do not. (On the old code a 2.5-period handler at eight times
    /// the period billed all eight to the interrupted frame.)
    #[test]
    fn the_previous_handlers_whole_periods_are_not_billed_on_the_wall_clock() {
        let wall = Pace::new(1000, true);
        let cpu = Pace::new(1000, false);
        for pace in [&wall, &cpu] {
            pace.after_sample(0, 10_000, 12_500);
            // Relaxed: one thread, the test's.
            pace.period_ns.store(8000, Ordering::Relaxed);
        }
        assert_eq!((wall.weight(0), wall.weight(1)), (6, 14));
        assert_eq!((cpu.weight(0), cpu.weight(1)), (8, 16));
        // Relaxed: as above.
        wall.period_ns.store(1000, Ordering::Relaxed);
        assert_eq!((wall.weight(0), wall.weight(3)), (1, 2));
    }

    /// A handler that re-arms the timer starts a whole new period when it
    /// returns: the next sample loses none of its periods to it. (On the
    /// first fix the 2.5-period handler that doubled the period took two
    /// periods off the next sample: it weighed 1, not 2.) The timer's
    /// period is 10 s: it never fires in the test (and its signal, SIGURG,
    /// is ignored by default).
    #[test]
    fn a_re_arm_takes_nothing_off_the_next_sample() {
        let base = 10_000_000_000;
        let pace = Pace::new(base, true);
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() } as u32;
        let timer = Timer::create(
            super::super::Clock::Wall,
            libc::SIGURG,
            std::ptr::null(),
            tid,
        )
        .unwrap();
        pace.arm(&timer).unwrap();
        // Two walks of 2.5 periods in a row: late twice, backed off.
        pace.after_sample(0, 0, 25_000_000_000);
        pace.after_sample(0, 100_000_000_000, 125_000_000_000);
        assert_eq!(pace.period_ns(), 2 * base);
        assert_eq!(pace.weight(0), 2);
        pace.withdraw();
    }

    #[test]
    fn an_unarmed_pace_never_backs_off_but_counts_its_streak() {
        // Not armed: no timer to re-arm, however late the signals.
        let pace = Pace::new(1000, true);
        pace.after_sample(0, 0, 100);
        assert_eq!(pace.streak.load(Ordering::Relaxed), -1);
        // An overrun 500 ns after the previous handler: kept in handlers.
        pace.after_sample(5, 600, 650);
        // A walk over a quarter of the period.
        pace.after_sample(0, 700, 1_000_700);
        assert_eq!(pace.period_ns(), 1000);
        assert_eq!(pace.streak.load(Ordering::Relaxed), 2);
        // An overrun after a gap of periods: the thread waited for a CPU.
        pace.after_sample(5, 5_000_000, 5_000_050);
        assert_eq!(pace.streak.load(Ordering::Relaxed), -1);
        // A CPU clock's overruns are not late.
        let cpu = Pace::new(1000, false);
        cpu.after_sample(0, 0, 10);
        cpu.after_sample(5, 20, 30);
        assert_eq!(cpu.streak.load(Ordering::Relaxed), -2);
    }
}
