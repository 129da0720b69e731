//! `jitmap-sim replay FILE|-`.

use jitmap::MapVersion;
use jitmap_args::{CliResult, Outcome, emit, read_input};

/// Replay a script of nibble-map operations (the format: docs/guide/simulator.md, "Replay scripts").
/// Exit status 1 if a line failed.
#[derive(clap::Args)]
pub struct Options {
    /// Map version, unless the script says `map`.
    #[arg(long, default_value = "v2")]
    map: MapVersion,
    /// Script file, or `-` for standard input.
    file: String,
}

pub fn run(o: Options) -> CliResult {
    let script = read_input(&o.file)?;
    let mut out = Vec::new();
    let ok = jitmap_sim::replay::run(&script, o.map, &mut out)?;
    emit(&String::from_utf8_lossy(&out))?;
    Ok(Outcome::from_ok(ok))
}
