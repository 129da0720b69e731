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
//! It is `publish = false`: an embedding runtime never needs it, and
//! `cargo test -p jitmap` builds it without the simulator or the tools.

pub mod demo;
#[cfg(feature = "cranelift")]
pub mod demo_cranelift;
pub mod e2e;
pub mod frameless;
pub mod inlined;
pub mod jitcode;
pub mod model;
pub mod profile;
pub mod rng;
pub mod signal_alloc;
pub mod spin;
pub mod workload;
