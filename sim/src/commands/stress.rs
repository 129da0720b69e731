//! `jitmap-sim stress`: writers against readers on one heap.

use jitmap::MapVersion;
use jitmap_args::{CliError, CliResult, Outcome, Seconds, Threads, emit};
use jitmap_sim::stress::{self, StressConfig};

/// Writers reserve, publish, abort and free code (methods up to 1 MiB) while
/// readers check every lookup against a shadow model. Exit status 1 on any
/// wrong answer.
#[derive(clap::Args)]
pub struct Options {
    /// Map version.
    #[arg(long, default_value = "v2")]
    map: MapVersion,
    /// Use a W^X double mapping instead of one RWX mapping.
    #[arg(long)]
    wx: bool,
    /// Threads in all, 2 to 64: a third write (at least one), the rest read.
    #[arg(long, default_value = "4", allow_negative_numbers = true)]
    threads: Threads,
    /// Seconds to run.
    #[arg(long, default_value = "5", allow_negative_numbers = true)]
    seconds: Seconds,
    /// Workload seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

pub fn run(o: Options) -> CliResult {
    let threads = o.threads.get();
    if threads < 2 {
        return Err(CliError::input(format!(
            "--threads must be at least 2 (a writer and a reader), not {threads}"
        )));
    }
    let writers = (threads / 3).max(1);
    run_configs(&[StressConfig {
        version: o.map,
        wx: o.wx,
        writers,
        readers: threads - writers,
        duration: o.seconds.duration(),
        seed: o.seed,
    }])
}

/// Runs each configuration in turn and prints its line: failed if any
/// lookup was wrong.
pub fn run_configs(configs: &[StressConfig]) -> CliResult {
    let mut wrong = 0;
    for config in configs {
        let r = stress::run(*config).map_err(CliError::failed)?;
        emit(&format!(
            "stress map={} wx={} writers={} readers={} seconds={:.1}: lookups={} exact={} wrong={} \
             publishes={} aborts={} frees={} reclaimed_bytes={}\n",
            config.version,
            config.wx,
            config.writers,
            config.readers,
            config.duration.as_secs_f64(),
            r.lookups,
            r.exact,
            r.wrong,
            r.publishes,
            r.aborts,
            r.frees,
            r.reclaimed
        ))?;
        wrong += r.wrong;
    }
    Ok(Outcome::from_ok(wrong == 0))
}
