//! `jitmap-sim scale`: jitmap's cost per method at 10,000, 100,000 and
//! 1,000,000 methods, beside a B-tree and a sorted vector; with `--churn N`,
//! the agent's memory while N method versions come and go.

use jitmap_args::{CliError, CliResult, Outcome, emit};
use jitmap_sim::churn;
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
    /// Instead, measure the agent's memory while one thread publishes,
    /// runs and frees this many method versions, sampled at 10 kHz on the
    /// wall clock (the profile's default cap of versions named one by one).
    #[arg(long, conflicts_with = "quick")]
    churn: Option<usize>,
    /// With `--churn`: a version-1 heap, and a call of a 128 KiB method
    /// after each version, whose frames lie deeper than the signal
    /// handler's scan (a steady stream of frames the collector names later).
    #[arg(long, requires = "churn")]
    big_v1: bool,
    /// Make the heaps without transparent huge pages (`HeapConfig::
    /// huge_pages` false): cheaper publishes (no 2 MiB page faults), dearer
    /// finds (page walks).
    #[arg(long, conflicts_with = "churn")]
    no_huge_pages: bool,
    /// First touch this many MiB of fresh memory and give it back: in a
    /// virtual machine, the host's first backing of guest memory otherwise
    /// lands in the publishes timed (BENCHMARKS.md, "A million methods").
    #[arg(long, default_value_t = 0, conflicts_with = "churn")]
    warm_mib: usize,
}

pub fn run(o: Options) -> CliResult {
    if let Some(versions) = o.churn {
        let cap = jitmap::agent::AgentConfig::default().profile_versions;
        let c = churn::churn(versions, 10, 10_000, cap, o.big_v1).map_err(CliError::failed)?;
        if o.json {
            emit(&format!("{}\n", churn::json(&c)))?;
        } else {
            emit(&churn::table(&c))?;
        }
        return Ok(Outcome::Passed);
    }
    let (sizes, finds) = if o.quick {
        (&SIZES[..2], 200_000)
    } else {
        (&SIZES[..], FINDS)
    };
    scale::warm(o.warm_mib).map_err(CliError::failed)?;
    let rows = sizes
        .iter()
        .map(|&n| scale::measure(n, finds, !o.no_huge_pages))
        .collect::<Result<Vec<_>, _>>()
        .map_err(CliError::failed)?;
    if o.json {
        emit(&format!("{}\n", scale::json(&rows)))?;
    } else {
        emit(&scale::table(&rows))?;
    }
    Ok(Outcome::from_ok(rows.iter().all(|r| r.wrong == 0)))
}
