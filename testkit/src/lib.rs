//! What jitmap's tests, benches and its two binaries (`jitmap`, `jitmap-sim`)
//! share, in one place so that none of them keeps a copy:
//!
//! - the demo JIT hosts: [`spin`] (named functions in hot loops, for perf,
//!   `jitmap inspect` and `jitmap ebpf`) and the 1:2:4 profile demo
//!   ([`demo`], run under the agent by [`profile`]; with the `cranelift`
//!   feature also compiled by Cranelift, in `demo_cranelift`), with
//!   [`jitcode`] for the agent's benchmarks;
//! - the test helpers: a seeded [`rng`], the nibble-map [`model`] and its
//!   [`workload`]s, [`e2e`] for the tests that run real outside tools, and
//!   [`signal_alloc`], the counting allocator that proves a signal handler
//!   allocates nothing.
//!
//! The 1:2:4 demo, the rng and the profile writers are the published
//! `jitmap-demo` crate's (the `jitmap` binary runs the demo too), re-exported
//! here. This crate is `publish = false`: an embedding runtime never needs it, and
//! `cargo test -p jitmap` builds it without the simulator or the tools.

pub use jitmap_demo::demo;
#[cfg(feature = "cranelift")]
pub use jitmap_demo::demo_cranelift;
pub mod arch;
pub mod dlopen_churn;
pub mod e2e;
pub mod frameless;
pub mod inlined;
pub mod jitcode;
pub mod model;
pub mod overhead;
pub mod overlay;
pub mod plt;
pub mod profile;
pub use jitmap_demo::rng;
pub mod signal_alloc;
pub mod spin;
pub mod trampoline;
pub mod workload;
