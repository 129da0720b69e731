//! `jitmap-sim compare`: every lookup structure timed side by side.

use jitmap_args::{CliError, CliResult, OutFile, Outcome, emit};

/// Measure every lookup structure side by side (floor, v2, v1, heap, manager,
/// B-tree, sorted vector).
#[derive(clap::Args)]
pub struct Options {
    /// Shorter batches and fewer samples: the same keys in seconds (well under 15 s),
    /// for a smoke run, not for figures.
    #[arg(long)]
    quick: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Write an SVG of lookup ns against method size (created before the run).
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<OutFile>,
}

pub fn run(o: Options) -> CliResult {
    let plot = o.plot.as_ref().map(OutFile::prepare).transpose()?;
    let report = jitmap_sim::compare::run(o.quick).map_err(CliError::failed)?;
    if o.json {
        emit(&format!("{}\n", report.json()))?;
    } else {
        emit(&report.table())?;
    }
    if let Some(path) = plot {
        report
            .plot(path)
            .map_err(|e| CliError::Io(std::io::Error::other(format!("{}: {e}", path.display()))))?;
        if !o.json {
            emit(&format!("plot written to {}\n", path.display()))?;
        }
    }
    Ok(Outcome::Passed)
}
