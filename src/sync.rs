//! Atomics facade: `std` atomics in normal builds, loom's under `--cfg loom`.
//!
//! Every concurrent protocol in the crate imports its atomics from here, so the loom
//! models in `loom-tests/` exercise the library's real code, not a copy of it.

#[cfg(loom)]
pub use loom::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, fence};

#[cfg(not(loom))]
pub use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, fence};

pub use std::sync::atomic::Ordering;

#[cfg(loom)]
pub use loom::thread::yield_now;

#[cfg(not(loom))]
pub use std::thread::yield_now;

/// `true` when the named defect is seeded; always `false` outside loom builds.
macro_rules! defect {
    ($name:ident) => {{
        #[cfg(loom)]
        {
            $crate::defect::on($crate::defect::Defect::$name)
        }
        #[cfg(not(loom))]
        {
            false
        }
    }};
}
pub(crate) use defect;
