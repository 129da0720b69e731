//! `jitmap-sim scale`: jitmap's cost per method at 10,000, 100,000 and
//! 1,000,000 methods, beside a B-tree and a sorted vector.

use jitmap_args::{CliError, CliResult, Outcome, emit};
use jitmap_sim::scale::{self, FINDS, SIZES};

/// Measure jitmap's cost per method as a runtime grows (publish ns, heap
/// and resident bytes per method, exact find ns over a floor) at 10 k,
/// 100 k and 1 M methods, beside a BTreeMap and a sorted Vec.
#[derive(clap::Args)]
pub struct Options {
    /// 10,000 and 100,000 methods and 200,000 finds: a smoke run in
    /// seconds, not figures.
    #[arg(long)]
    quick: bool,
    /// Print one JSON array instead of the table.
    #[arg(long)]
    json: bool,
}

pub fn run(o: Options) -> CliResult {
    let (sizes, finds) = if o.quick {
        (&SIZES[..2], 200_000)
    } else {
        (&SIZES[..], FINDS)
    };
    let rows = sizes
        .iter()
        .map(|&n| scale::measure(n, finds))
        .collect::<Result<Vec<_>, _>>()
        .map_err(CliError::failed)?;
    if o.json {
        emit(&format!("{}\n", scale::json(&rows)))?;
    } else {
        emit(&scale::table(&rows))?;
    }
    Ok(Outcome::from_ok(rows.iter().all(|r| r.wrong == 0)))
}
