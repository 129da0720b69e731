//! One POSIX timer per attached thread, delivering the agent's signal to that
//! thread alone, with a pointer to its record as the signal's value.

use super::AgentError;
use super::Clock;

/// A created timer; deleted on drop.
pub(crate) struct Timer(libc::timer_t);

// SAFETY: a timer id is a process-wide kernel handle; any thread may arm or
// delete it.
unsafe impl Send for Timer {}

impl Timer {
    /// Creates a timer on `clock` that sends `signal` to thread `tid` with
    /// `value` as its `sigev_value`. `Clock::Cpu` counts the *calling* thread's
    /// CPU time, so the caller must be thread `tid`.
    pub(crate) fn create(
        clock: Clock,
        signal: libc::c_int,
        value: *const libc::c_void,
        tid: u32,
    ) -> Result<Self, AgentError> {
        let clock_id = match clock {
            Clock::Cpu => libc::CLOCK_THREAD_CPUTIME_ID,
            Clock::Wall => libc::CLOCK_MONOTONIC,
        };
        // SAFETY: all-zero is a valid sigevent; the fields that matter are set below.
        let mut event: libc::sigevent = unsafe { std::mem::zeroed() };
        event.sigev_notify = libc::SIGEV_THREAD_ID;
        event.sigev_signo = signal;
        event.sigev_value = libc::sigval {
            sival_ptr: value.cast_mut(),
        };
        event.sigev_notify_thread_id = tid as libc::c_int;
        let mut id: libc::timer_t = std::ptr::null_mut();
        // SAFETY: `event` and `id` are valid for the call.
        if unsafe { libc::timer_create(clock_id, &mut event, &mut id) } != 0 {
            return Err(AgentError::os("timer_create"));
        }
        Ok(Self(id))
    }

    /// Fires every `interval_ns` nanoseconds (0 disarms).
    pub(crate) fn set(&self, interval_ns: u64) -> Result<(), AgentError> {
        if !set_period(self.0, interval_ns) {
            return Err(AgentError::os("timer_settime"));
        }
        Ok(())
    }

    /// The kernel's handle, for the handler's back-off ([`set_period`]).
    pub(crate) fn id(&self) -> libc::timer_t {
        self.0
    }
}

/// Re-arms timer `id` to fire every `interval_ns` nanoseconds from now (0
/// disarms); false if the kernel refused. Async-signal-safe: one
/// `timer_settime`, which signal-safety(7) lists.
pub(crate) fn set_period(id: libc::timer_t, interval_ns: u64) -> bool {
    let ts = libc::timespec {
        tv_sec: (interval_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (interval_ns % 1_000_000_000) as libc::c_long,
    };
    let spec = libc::itimerspec {
        it_interval: ts,
        it_value: ts,
    };
    // SAFETY: `spec` is valid; no old value wanted. A stale id makes the
    // kernel refuse the call (EINVAL), which the caller sees.
    unsafe { libc::timer_settime(id, 0, &spec, std::ptr::null_mut()) == 0 }
}

impl Drop for Timer {
    fn drop(&mut self) {
        // SAFETY: `self.0` is a live timer, deleted once. It fails only for an
        // invalid id, which this type never holds.
        unsafe { libc::timer_delete(self.0) };
    }
}
