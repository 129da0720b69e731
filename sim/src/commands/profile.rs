//! `jitmap-sim profile`: the 1:2:4 demo host under the in-process agent (the
//! host itself is `jitmap_testkit::profile`).

use jitmap::agent::Clock;
use jitmap_args::{CliError, CliResult, Hz, OutDir, Outcome, Seconds, dropped_warning, emit};
use jitmap_testkit::demo::DemoBackend;
use jitmap_testkit::profile;

/// Run the demo host (leaf_1x, leaf_2x, leaf_4x under middle and top) under
/// the in-process agent; write report.txt, stacks.folded, flamegraph.svg and
/// profile.pb.gz.
#[derive(clap::Args)]
pub struct Options {
    /// What compiles the demo: iced (hand-assembled) or cranelift
    /// (jitmap-cranelift at opt_level=speed).
    #[arg(long, default_value = "iced")]
    backend: DemoBackend,
    /// Samples per second.
    #[arg(
        long,
        default_value = "1000",
        conflicts_with = "overhead",
        allow_negative_numbers = true
    )]
    hz: Hz,
    /// Seconds to run (with --overhead: seconds per round).
    #[arg(long, default_value = "3", allow_negative_numbers = true)]
    seconds: Seconds,
    /// The sampling clock: cpu (the thread's CPU time) or wall.
    #[arg(long, default_value = "cpu", conflicts_with = "overhead")]
    clock: ClockArg,
    /// Directory for the outputs (created before the run).
    #[arg(long, default_value = "jitmap-profile", conflicts_with = "overhead")]
    out: OutDir,
    /// Print the report as one JSON object.
    #[arg(long, conflicts_with = "overhead")]
    json: bool,
    /// Serve the agent's profiles over HTTP on this loopback address while
    /// the demo runs (`go tool pprof http://ADDR/debug/pprof/profile`).
    #[arg(long, value_name = "ADDR", conflicts_with = "overhead")]
    serve: Option<std::net::SocketAddr>,
    /// Instead of profiling, measure the agent's cost on the demo: its
    /// throughput at 1 kHz and 10 kHz over no agent, in rounds of
    /// --seconds each, side by side.
    #[arg(long)]
    overhead: bool,
}

/// `--clock` values.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum ClockArg {
    Cpu,
    Wall,
}

pub fn run(o: Options) -> CliResult {
    let x86_only = |what: &str| {
        CliError::input(format!(
            "{what} x86-64 code; on this machine use `--backend cranelift`"
        ))
    };
    if o.overhead {
        if !cfg!(target_arch = "x86_64") {
            return Err(x86_only("--overhead runs the iced demo, which is"));
        }
        return overhead(o.seconds);
    }
    let dir = o.out.prepare()?;
    let clock = match o.clock {
        ClockArg::Cpu => Clock::Cpu,
        ClockArg::Wall => Clock::Wall,
    };
    let manager = jitmap::ExecutionManager::new(16);
    let perf = jitmap::perf::PerfOutput::from_env(&manager).map_err(CliError::input)?;
    let serve = super::run::loopback(o.serve)?;
    if !cfg!(target_arch = "x86_64") && o.backend == DemoBackend::Iced {
        return Err(x86_only("the iced demo (the default backend) is"));
    }
    let run = profile::run_with(
        &manager,
        o.backend,
        o.hz.get(),
        clock,
        o.seconds.duration(),
        |agent| {
            if let Some(address) = serve {
                let bound = agent.serve(address)?;
                eprintln!(
                    "jitmap-sim profile: serving profiles at http://{bound}/debug/pprof/profile"
                );
            }
            Ok(())
        },
    )
    .map_err(CliError::failed)?;
    profile::write_outputs(&run, dir)?;
    if o.json {
        emit(&format!("{}\n", profile::json(&run)))?;
    } else {
        emit(&format!(
            "{}\ndemo: {} calls, {} wrong results; outputs in {}\n",
            run.profile.report(10),
            run.calls,
            run.wrong,
            dir.display()
        ))?;
    }
    if let Some(warning) = dropped_warning(run.profile.taken, run.profile.dropped) {
        eprintln!("jitmap-sim profile: {warning}");
    }
    for warning in perf.warnings() {
        eprintln!("jitmap-sim profile: warning: {warning}");
    }
    Ok(Outcome::from_ok(run.wrong == 0))
}

/// `--overhead`: the agent's cost at 1 kHz and 10 kHz, beside an empty
/// handler.
fn overhead(seconds: Seconds) -> CliResult {
    let manager = jitmap::ExecutionManager::new(16);
    let rows = profile::overhead(&manager, &[1000, 10_000], seconds.duration(), 5)
        .map_err(CliError::failed)?;
    for row in rows {
        let list = profile::ratios;
        emit(&format!(
            "{} Hz (wall), throughput over no agent, median of {}: agent (mixed unwinder) {:.4} [{}], \
             agent (frame pointers) {:.4} [{}], empty handler (floor) {:.4} [{}]\n",
            row.hz,
            row.ratios.len(),
            profile::median(&row.ratios),
            list(&row.ratios),
            profile::median(&row.frame_pointer),
            list(&row.frame_pointer),
            profile::median(&row.floor),
            list(&row.floor)
        ))?;
    }
    Ok(Outcome::Passed)
}
