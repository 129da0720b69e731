//! The jitmap simulator's library half: workload generators and drivers shared by
//! the `jitmap-sim` binary, the tests, the loom models, the fuzz targets and the
//! benches.

pub mod compare;
pub mod demo;
#[cfg(feature = "ebpf")]
pub mod ebpf;
pub mod fixture;
pub mod inspect;
pub mod jitcode;
pub mod model;
pub mod profile;
pub mod replay;
pub mod rng;
pub mod spin;
pub mod stress;
pub mod tiered;
pub mod workload;
