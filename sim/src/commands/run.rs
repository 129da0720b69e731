//! `jitmap-sim run`, the main job and the default: the tiered JIT simulator.

use std::io::IsTerminal;

use jitmap::{MapVersion, MemoryMode};
use jitmap_args::{
    CliError, CliResult, Hz, OutDir, Outcome, Seconds, Threads, dropped_warning, emit,
};
use jitmap_sim::tiered::{self, Backend, Progress, RunConfig, Scenario};

/// The tiered JIT simulator (the default, as `run`): real code compiled at
/// two tiers, run, sampled, freed and unloaded, every answer checked. Exit
/// status 1 on any wrong answer.
#[derive(clap::Args)]
pub struct Options {
    /// startup, steady, large, unload, abort or mixed.
    #[arg(long, default_value = "mixed")]
    scenario: Scenario,
    /// What compiles the methods: cranelift (jitmap-cranelift; tier 0 at
    /// opt_level=none, tier 1 at speed) or iced (hand-assembled shapes).
    #[arg(long, default_value = "cranelift")]
    backend: Backend,
    /// Seconds to run.
    #[arg(long, default_value = "15", allow_negative_numbers = true)]
    seconds: Seconds,
    /// Workload seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Map version of every heap.
    #[arg(long, default_value = "v2")]
    map: MapVersion,
    /// W^X heaps (a write view and an execute view).
    #[arg(long, conflicts_with = "flip")]
    wx: bool,
    /// Flip-on-publish heaps: writable until published, then read-execute.
    #[arg(long)]
    flip: bool,
    /// Executor threads.
    #[arg(long, default_value = "2", allow_negative_numbers = true)]
    threads: Threads,
    /// The agent's sampling rate (wall clock).
    #[arg(long, default_value = "1000", allow_negative_numbers = true)]
    hz: Hz,
    /// Directory for the agent's flamegraph, folded stacks and pprof (created
    /// before the run).
    #[arg(long)]
    out: Option<OutDir>,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
    /// After --seconds, run on until every event the scenario makes has
    /// happened (tier-ups, and aborts, unloads and de-optimizations where it
    /// makes them), for at most 300 s more.
    #[arg(long)]
    until_events: bool,
    /// Serve the agent's profiles over HTTP on this loopback address while
    /// the run lasts (`go tool pprof http://ADDR/debug/pprof/profile`).
    #[arg(long, value_name = "ADDR")]
    serve: Option<std::net::SocketAddr>,
}

impl Default for Options {
    /// What `jitmap-sim` with no subcommand runs: the `mixed` scenario for
    /// 15 s, the same as `run`'s defaults.
    fn default() -> Self {
        use clap::FromArgMatches;
        let command = <Self as clap::Args>::augment_args(clap::Command::new("run"));
        let matches = command.get_matches_from(["run"]);
        Self::from_arg_matches(&matches).expect("run's defaults parse")
    }
}

pub fn run(o: Options) -> CliResult {
    if !cfg!(target_arch = "x86_64") && o.backend == Backend::Iced {
        return Err(CliError::input(
            "the iced backend emits x86-64 code; on this machine use `--backend cranelift` (the default)",
        ));
    }
    let out = o.out.as_ref().map(OutDir::prepare).transpose()?;
    let (hz, notice) = o.hz.for_agent();
    if let Some(notice) = notice {
        eprintln!("jitmap-sim run: {notice}");
    }
    let config = RunConfig {
        scenario: o.scenario,
        backend: o.backend,
        duration: o.seconds.duration(),
        seed: o.seed,
        version: o.map,
        mode: match (o.wx, o.flip) {
            (true, _) => MemoryMode::WriteXorExecute,
            (_, true) => MemoryMode::FlipOnPublish,
            _ => MemoryMode::Rwx,
        },
        threads: o.threads.get(),
        hz,
        serve: loopback(o.serve)?,
        until_events: o.until_events,
    };
    let bar = (!o.json && std::io::stderr().is_terminal()).then(|| {
        let bar = indicatif::ProgressBar::new(1000);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {elapsed}/{duration}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar.set_message(format!("jitmap-sim run {} ({})", o.scenario, o.backend));
        bar
    });
    // Without a terminal (a log, CI), a line a second instead of the bar.
    let printed = std::sync::atomic::AtomicU64::new(0);
    let total = o.seconds.duration().as_secs();
    let progress = |p: &Progress| {
        if let Some(bar) = &bar {
            bar.set_position((p.fraction.clamp(0.0, 1.0) * 1000.0) as u64);
        } else if !o.json {
            let second = p.elapsed.as_secs();
            // Relaxed: only the run's own loop calls this.
            if second > printed.load(std::sync::atomic::Ordering::Relaxed) {
                printed.store(second, std::sync::atomic::Ordering::Relaxed);
                eprintln!(
                    "jitmap-sim run: {second}/{total} s: {} publishes, {} tier-ups, {} lookups checked, {} wrong",
                    p.publishes, p.tier_ups, p.lookups, p.wrong
                );
            }
        }
    };
    let report = tiered::run(config, out, &progress);
    match &bar {
        Some(bar) if report.is_err() => bar.abandon(),
        Some(bar) => bar.finish_and_clear(),
        None => {}
    }
    let report = report.map_err(CliError::failed)?;
    if o.json {
        emit(&format!("{}\n", report.json()))?;
    } else {
        emit(&report.text())?;
        if let Some(dir) = out {
            emit(&format!("agent outputs in {}\n", dir.display()))?;
        }
    }
    if let Some(warning) = dropped_warning(report.signals_taken, report.signals_dropped) {
        eprintln!("jitmap-sim run: {warning}");
    }
    Ok(Outcome::from_ok(report.wrong == 0))
}

/// `--serve`'s address, which must be loopback: the tools never expose a
/// process's profiles to the network (a host that wants to calls
/// `Agent::serve_exposed` itself).
pub fn loopback(
    address: Option<std::net::SocketAddr>,
) -> Result<Option<std::net::SocketAddr>, CliError> {
    match address {
        Some(a) if !a.ip().is_loopback() => Err(CliError::input(format!(
            "--serve {a}: only a loopback address is served (127.0.0.1 or [::1])"
        ))),
        other => Ok(other),
    }
}
