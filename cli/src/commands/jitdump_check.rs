//! `jitmap jitdump-check FILE`.

use jitmap_args::{CliResult, Outcome, emit};

/// Check a jitdump file the way perf reads it: print its header, records and
/// violations. Exit status 1 if it has a violation.
#[derive(clap::Args)]
pub struct Options {
    /// The `jit-<pid>.dump` file.
    file: std::path::PathBuf,
}

pub fn run(o: Options) -> CliResult {
    let bytes = fs_err::read(&o.file)?;
    let report = jitmap::perf::check::check(&bytes);
    emit(&jitmap_cli::jitdump::render(&report))?;
    Ok(Outcome::from_ok(report.violations.is_empty()))
}
