//! The simulator's library half: what simulates or measures jitmap itself,
//! shared by the `jitmap-sim` binary, its tests and the benches.
//!
//! - [`tiered`]: the tiered JIT simulator, the main job (`jitmap-sim run`);
//! - [`stress`]: writers against readers on one heap, every lookup checked;
//! - [`replay`]: scripts of nibble-map operations;
//! - [`compare`] and [`fixture`]: every lookup structure timed side by side;
//! - [`scale`]: the cost per method at 10,000 to 1,000,000 methods.
//!
//! The demo hosts (`spin`, the 1:2:4 profile demo) live in `jitmap-testkit`,
//! which the `jitmap` tool's tests use too.

pub mod churn;
pub mod compare;
pub mod fixture;
pub mod replay;
pub mod scale;
pub mod stress;
pub mod tiered;
