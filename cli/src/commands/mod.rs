//! One module per subcommand of `jitmap`: its options and its run.

pub mod inspect;
pub mod jitdump_check;
pub mod profile;
