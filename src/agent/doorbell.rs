//! The collector's doorbell: an `eventfd` that a ring's producer writes when
//! its ring fills to its bell level, so that the collector can sleep long
//! between passes and still drain every ring before it fills.
//!
//! Each pass costs the collector a wake-up whatever it drains (on the 2-vCPU
//! VM of BENCHMARKS.md, about 50 µs of its thread's CPU for the timed wait
//! and 25 µs for an empty pass), so the collector waits
//! [`super::AgentConfig::collect_every`] (250 ms by default) and is rung
//! sooner only when a thread samples or probes fast enough to need it.
//! Ringing is one `write(2)`, which signal-safety(7) lists; a producer rings
//! at most once each time its ring fills from empty to the bell.
//!
//! A probe ring's bell is at half full. A sample ring's is set from the
//! thread's rate ([`sample_bell`]): as late as leaves the collector
//! [`SAMPLE_BELL_SLACK`] to answer before the ring fills, between half
//! and three quarters full, so that at low rates a pass drains more
//! samples for its wake-up.
//!
//! The descriptor is close-on-exec, and lives as long as any thread's
//! record does. A child forked from an attached thread inherits it and the
//! thread's record: a probe called in the child writes this eventfd (or
//! whatever file the child has put at its number since). A forked child
//! runs no timer of the agent's and should call no probe.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use super::AgentError;

/// The time a sample ring's bell leaves the collector to answer it before
/// the ring fills, at the thread's configured rate: a wake-up and a
/// scheduler's latency on a loaded machine, with room to spare.
pub(crate) const SAMPLE_BELL_SLACK: Duration = Duration::from_millis(32);

/// The bell level of a sample ring of `capacity` records whose thread is
/// sampled `hz` times a second: the free slots left when it rings hold
/// [`SAMPLE_BELL_SLACK`] of samples, but no fewer than a quarter of the
/// ring and no more than half. A backed-off thread samples
/// slower than `hz`, which only leaves more time.
///
/// At 1 kHz a ring of 256 rings at 192 samples; from 4 kHz, at 128.
pub(crate) fn sample_bell(capacity: usize, hz: u32) -> usize {
    let slack = u64::from(hz) * SAMPLE_BELL_SLACK.as_nanos() as u64;
    let free = usize::try_from(slack.div_ceil(1_000_000_000)).unwrap_or(usize::MAX);
    // At most half (rounded down, so that the bell is never earlier than a
    // ring's default, half rounded up); at least a quarter, within that.
    let most = capacity / 2;
    let free = free.clamp(capacity.div_ceil(4).min(most), most);
    capacity.saturating_sub(free).max(1)
}

/// An `eventfd`, non-blocking and closed on exec.
#[derive(Debug)]
pub(crate) struct Doorbell {
    fd: OwnedFd,
}

impl Doorbell {
    /// A doorbell no one has rung.
    pub(crate) fn new() -> Result<Self, AgentError> {
        // SAFETY: plain system call; the flags are valid.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(AgentError::os("eventfd"));
        }
        // SAFETY: `fd` is a new descriptor this process owns and nothing
        // else closes.
        Ok(Self {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Rings: the next (or current) [`Doorbell::wait`] returns at once.
    /// Async-signal-safe: one `write(2)`, and `errno` is left as it was
    /// (the probes call this from JIT code, between the host's own calls).
    pub(crate) fn ring(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: `__errno_location` is the calling thread's errno, always
        // valid; reading and restoring it is what a handler must do around
        // a system call.
        let errno = unsafe { *libc::__errno_location() };
        // SAFETY: the descriptor is open for as long as `self` lives; 8
        // readable bytes. A full counter (EAGAIN, after 2^64 - 2 rings) or
        // any other failure leaves the doorbell rung or the collector on its
        // timer: nothing to do about it here.
        unsafe { libc::write(self.fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = errno };
    }

    /// Waits until the doorbell is rung or `timeout` passes, then clears
    /// it. True if it was rung.
    pub(crate) fn wait(&self, timeout: Duration) -> bool {
        let mut poll = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let timeout = libc::timespec {
            tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
            // Under 10^9: fits every c_long.
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: one valid pollfd and a valid timeout; no signal mask. An
        // interrupted or failed wait returns early: the collector makes a
        // pass sooner, nothing worse.
        unsafe { libc::ppoll(&mut poll, 1, &timeout, std::ptr::null()) };
        let mut count = [0u8; 8];
        // SAFETY: 8 writable bytes; non-blocking, so an unrung doorbell
        // returns EAGAIN at once.
        let read = unsafe { libc::read(self.fd.as_raw_fd(), count.as_mut_ptr().cast(), 8) };
        read == 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bell leaves 32 ms of samples free, within a quarter to a half
    /// of the ring; a ring of one rings at its one record.
    #[test]
    fn a_sample_ring_rings_with_its_slack_left_within_a_quarter_and_a_half() {
        let cases = [
            // (capacity, hz, bell): 1 kHz needs 32 free, a quarter is 64.
            (256, 1000, 192),
            (256, 100, 192),
            // 3 kHz: 96 free.
            (256, 3000, 160),
            // 4 kHz and above: 128 or more, capped at half.
            (256, 4000, 128),
            (256, 10_000, 128),
            (64, 1000, 32),
            (3, 1000, 2),
            (1, 1000, 1),
            (1, 10_000, 1),
        ];
        for (capacity, hz, bell) in cases {
            assert_eq!(
                sample_bell(capacity, hz),
                bell,
                "capacity {capacity} at {hz} Hz"
            );
        }
    }

    #[test]
    fn a_ring_ends_the_wait_once_and_keeps_errno() {
        let bell = Doorbell::new().unwrap();
        // Unrung: the wait runs out (1 ms) and says so.
        assert!(!bell.wait(Duration::from_millis(1)));
        // SAFETY: this thread's errno.
        unsafe { *libc::__errno_location() = libc::EINTR };
        bell.ring();
        bell.ring();
        // SAFETY: as above.
        assert_eq!(unsafe { *libc::__errno_location() }, libc::EINTR);
        // Rung twice before the wait: one wait clears both, at once (a
        // minute's timeout would hang the test if it did not).
        assert!(bell.wait(Duration::from_secs(60)));
        assert!(!bell.wait(Duration::from_millis(1)));
    }
}
