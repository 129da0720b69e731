//! One module per subcommand of `jitmap-sim`: its options and its run.

pub mod compare;
pub mod profile;
pub mod replay;
pub mod run;
pub mod scale;
pub mod spec;
pub mod spin;
pub mod stress;
