//! Keeping the agent's signal off the calling thread for a scope.
//!
//! An agent call made on an attached thread takes the agent's locks. If the
//! thread's own timer fired while it held one, and its handler outlasted the
//! period, the thread would stay in its handler with the lock held, and
//! every other caller (the collector, the pprof endpoint, `stop`) would wait
//! on it. So every such call blocks the signal on its thread for its
//! duration, as detaching does; a signal that comes meanwhile is delivered
//! when the call returns, with the overrun it gathered.

use std::marker::PhantomData;

/// The agent's signal, blocked on this thread until the value drops (on
/// the same thread: it is not `Send`).
pub(crate) struct Blocked {
    old: libc::sigset_t,
    _not_send: PhantomData<*const ()>,
}

impl Blocked {
    /// Blocks `signal` on the calling thread.
    pub(crate) fn new(signal: libc::c_int) -> Self {
        let set = set_of(signal);
        // SAFETY: sigset_t is plain storage, filled by pthread_sigmask.
        let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` and `old` are valid sigsets.
        unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old) };
        Self {
            old,
            _not_send: PhantomData,
        }
    }
}

/// The set holding `signal` alone.
pub(crate) fn set_of(signal: libc::c_int) -> libc::sigset_t {
    // SAFETY: sigset_t is plain storage, initialized by sigemptyset.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset; an invalid signal number only makes
    // sigaddset fail, leaving the set empty (the agent's was validated).
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, signal);
    }
    set
}

impl Drop for Blocked {
    fn drop(&mut self) {
        // SAFETY: restores the mask `new` saved, on the thread that saved it
        // (the value is not `Send`).
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut()) };
    }
}
