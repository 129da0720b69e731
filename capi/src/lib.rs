//! jitmap's C ABI, for JIT compilers and runtimes written in C and C++.
//!
//! The header is `include/jitmap.h`, generated from this crate by cbindgen
//! (`cargo test -p jitmap-capi --test header` fails when the committed copy
//! differs). Build and install (`capi/install.sh`) give `libjitmap.so`,
//! `libjitmap.a`, the header and a pkg-config file.
//!
//! # Shape
//! - Handles (`jitmap_manager *`, `jitmap_heap *`, ...) are opaque. They are
//!   not addresses: each is a slot and generation in a table, so NULL, a
//!   pointer the library never gave out, a handle of another kind, a
//!   destroyed one and a double destroy are each a status
//!   ([`handles`]).
//! - Every call that can fail returns a [`jitmap_status`]; a failed call
//!   changes nothing. `jitmap_last_error_message` says more, except after
//!   the async-signal-safe calls, which touch no thread-local.
//! - A handle is destroyed only when nothing uses it: a manager outlives its
//!   heaps, readers, executors and agent, a heap its pending reservations,
//!   a reader its pinned guards. Destroying one still in use is refused with
//!   `JITMAP_STATUS_IN_USE`.
//! - The async-signal-safe calls are marked so in the header: pin, find,
//!   find the return address, unpin, the executor's quiescent points, the
//!   probes, `jitmap_status_name`. They take no lock and allocate nothing;
//!   the one system call among them is the probes' `write` to the agent's
//!   eventfd when a thread's probe ring passes half full.
//!
//! The Rust items here are the C functions themselves, callable from Rust
//! too (the benches compare them with the Rust API):
//!
//! ```
//! use jitmap_capi::*;
//! let mut manager = std::ptr::null_mut();
//! // SAFETY: the output points to a local.
//! let created = unsafe { jitmap_manager_create(8, &mut manager) };
//! assert_eq!(created, jitmap_status::JITMAP_STATUS_OK);
//! assert_eq!(jitmap_manager_destroy(manager), jitmap_status::JITMAP_STATUS_OK);
//! assert_eq!(jitmap_manager_destroy(manager), jitmap_status::JITMAP_STATUS_DESTROYED);
//! ```
#![allow(non_camel_case_types)]
#![warn(missing_docs)]

mod agent;
mod handles;
mod heap;
mod lookup;
mod manager;
mod status;
mod table;
mod types;
mod version;

pub use agent::*;
pub use heap::*;
pub use lookup::*;
pub use manager::*;
pub use status::{jitmap_last_error_message, jitmap_status, jitmap_status_name};
pub use types::*;
pub use version::*;

use status::Failure;

// The handle types: opaque to C, which keeps pointers to them. (Written
// out, not by a macro: cbindgen reads the source as it is.)

/// An execution manager: the process's lookup of code addresses, its
/// reader registry and its grace periods. Owns nothing a host must free
/// first; destroyed last.
pub struct jitmap_manager {
    _private: [u8; 0],
}

/// A code heap of a manager.
pub struct jitmap_heap {
    _private: [u8; 0],
}

/// Space reserved in a heap, not yet visible to any lookup; published
/// or aborted exactly once.
pub struct jitmap_reservation {
    _private: [u8; 0],
}

/// A thread's reader: pins guards for lookups. Used by the thread that
/// registered it and its signal handlers.
pub struct jitmap_reader {
    _private: [u8; 0],
}

/// A thread that runs JIT code: declares quiescent points. Used by the
/// thread that registered it.
pub struct jitmap_executor {
    _private: [u8; 0],
}

/// The in-process sampling profiler.
pub struct jitmap_agent {
    _private: [u8; 0],
}

/// A thread attached to the agent. Detached by the same thread.
pub struct jitmap_thread {
    _private: [u8; 0],
}

/// A stopped agent's profile, written in any of four formats.
pub struct jitmap_profile {
    _private: [u8; 0],
}

/// A table of call counters for tiered compilation.
pub struct jitmap_counters {
    _private: [u8; 0],
}

/// What JIT code passes to the entry and value probes: the attached
/// thread's record (`jitmap_thread_probe_context`).
pub struct jitmap_probe_context {
    _private: [u8; 0],
}

/// One method's call counter (`jitmap_counters_cell`), what JIT code
/// passes to `jitmap_probe_count`.
pub struct jitmap_counter_cell {
    _private: [u8; 0],
}

/// A handle's bits.
fn bits<T>(handle: *const T) -> usize {
    handle as usize
}

/// Refuses a NULL pointer before any work, so that a call given one changes
/// nothing.
fn required<T>(pointer: *const T) -> Result<(), Failure> {
    if pointer.is_null() {
        Err(jitmap_status::JITMAP_STATUS_NULL_POINTER.into())
    } else {
        Ok(())
    }
}

/// A NUL-terminated UTF-8 string from C.
///
/// # Safety
/// `s` is NULL or points to a NUL-terminated string.
unsafe fn utf8<'a>(s: *const std::ffi::c_char, what: &str) -> Result<&'a str, Failure> {
    required(s)?;
    // SAFETY: not NULL, and NUL-terminated by the caller's contract.
    unsafe { std::ffi::CStr::from_ptr(s) }
        .to_str()
        .map_err(|_| {
            Failure::new(
                jitmap_status::JITMAP_STATUS_BAD_ARGUMENT,
                format!("{what} is not UTF-8"),
            )
        })
}

/// A C array of `count` items; NULL is allowed when `count` is 0.
///
/// # Safety
/// `items` is NULL or points to `count` initialised items that outlive `'a`.
unsafe fn slice<'a, T>(items: *const T, count: usize, what: &str) -> Result<&'a [T], Failure> {
    if count == 0 {
        return Ok(&[]);
    }
    if items.is_null() {
        return Err(Failure::new(
            jitmap_status::JITMAP_STATUS_NULL_POINTER,
            format!("{what} is NULL with a count of {count}"),
        ));
    }
    // SAFETY: not NULL, `count` items by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(items, count) })
}

/// A value that one thread uses: its creator. Every use checks the calling
/// thread, so the value is never touched by two threads, and the handle
/// table (which needs `Send + Sync`) may hold it.
struct ThreadBound<T> {
    value: T,
    owner: libc::pthread_t,
}

// SAFETY: `get` hands the value only to the thread that made it; the table
// moves the box between threads but only that thread, or the one destroying
// it after every use has ended, touches the value.
unsafe impl<T> Send for ThreadBound<T> {}
// SAFETY: as above: `get` refuses every other thread.
unsafe impl<T> Sync for ThreadBound<T> {}

impl<T> ThreadBound<T> {
    fn new(value: T) -> Self {
        Self {
            value,
            // SAFETY: pthread_self has no precondition.
            owner: unsafe { libc::pthread_self() },
        }
    }

    /// The value, on its own thread. Async-signal-safe: `pthread_self`
    /// reads the thread pointer, with no system call.
    fn get(&self) -> Result<&T, jitmap_status> {
        // SAFETY: pthread_self and pthread_equal have no precondition.
        if unsafe { libc::pthread_equal(self.owner, libc::pthread_self()) } != 0 {
            Ok(&self.value)
        } else {
            Err(jitmap_status::JITMAP_STATUS_WRONG_THREAD)
        }
    }
}
