//! `jitmap-sim profile`: the 1:2:4 demo host under the in-process agent (the
//! host itself is `jitmap_testkit::profile`).

use jitmap::agent::Clock;
use jitmap_args::{CliError, CliResult, Hz, OutDir, Outcome, Seconds, dropped_warning, emit};
use jitmap_testkit::demo::DemoBackend;
use jitmap_testkit::{overhead, profile};

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
    /// Seconds to run (with --overhead: about the seconds of one
    /// measurement: the demo calls no agent makes in that time are the fixed
    /// work every measurement does).
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
    /// Instead of profiling, measure the agent's cost on the demo: the
    /// process's CPU time for a fixed count of calls at 100 Hz, 1 kHz and
    /// 10 kHz on both clocks, over no agent, beside an empty handler on the
    /// same timer; --rounds rounds in a shuffled order, with medians and
    /// 95 % bootstrap intervals.
    #[arg(long)]
    overhead: bool,
    /// Rounds of --overhead (each measures the four configurations once).
    #[arg(long, default_value = "20", requires = "overhead")]
    rounds: usize,
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
        return overhead(o.seconds, o.rounds);
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
    let (hz, notice) = o.hz.for_agent();
    if let Some(notice) = notice {
        eprintln!("jitmap-sim profile: {notice}");
    }
    let run = profile::run_with(
        &manager,
        o.backend,
        hz,
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
fn overhead(seconds: Seconds, rounds: usize) -> CliResult {
    if rounds < 2 {
        return Err(CliError::input("--rounds must be at least 2"));
    }
    let manager = jitmap::ExecutionManager::new(16);
    let rows = overhead::measure(
        &manager,
        &[Clock::Cpu, Clock::Wall],
        &[100, 1000, 10_000],
        seconds.duration(),
        rounds,
    )
    .map_err(CliError::failed)?;
    let show = |i: &overhead::Interval| format!("{:.4} [{:.4}, {:.4}]", i.median, i.low, i.high);
    let percent = |i: &overhead::Interval| {
        format!(
            "{:+.2} % [{:+.2}, {:+.2}]",
            100.0 * i.median,
            100.0 * i.low,
            100.0 * i.high
        )
    };
    let micros = |i: &overhead::Interval| format!("{:.2} [{:.2}, {:.2}]", i.median, i.low, i.high);
    emit(&format!(
        "CPU time over no agent, median of {rounds} rounds [95 % bootstrap interval]\n"
    ))?;
    for row in &rows {
        let clock = match row.clock {
            Clock::Cpu => "cpu",
            Clock::Wall => "wall",
        };
        emit(&format!(
            "{clock} {} Hz: empty handler {}, frame pointers {}, mixed {}; the agent beyond the empty handler {}, {} µs of CPU a sample; the agent's own CPU {} µs a sample over its run, {} in steady state\n",
            row.hz,
            show(&row.empty),
            show(&row.frame_pointers),
            show(&row.mixed),
            percent(&row.beyond_empty),
            micros(&row.per_sample_us),
            micros(&row.agent_cpu_us),
            micros(&row.steady_cpu_us)
        ))?;
    }
    if let Some(row) = rows.iter().find(|r| r.clock == Clock::Wall && r.hz == 1000) {
        let holds = row.beyond_empty.median <= 0.003 && row.beyond_empty.high < 0.005;
        emit(&format!(
            "at most 0.3 % beyond an empty handler at 1 kHz (wall), the interval's top under 0.5 %: {} ({:+.2} %, at most {:+.2} %)\n",
            if holds { "holds" } else { "not shown" },
            100.0 * row.beyond_empty.median,
            100.0 * row.beyond_empty.high
        ))?;
        let holds = row.steady_cpu_us.high <= 2.0;
        emit(&format!(
            "at most 2 µs of the agent's own CPU a sample at 1 kHz (wall) in steady state, as the agent counts it (its handlers' walks and its collector's passes): {} ({:.2} µs, at most {:.2}; over each run, its first and last passes included: {:.2})\n",
            if holds { "holds" } else { "not shown" },
            row.steady_cpu_us.median,
            row.steady_cpu_us.high,
            row.agent_cpu_us.median
        ))?;
    }
    Ok(Outcome::Passed)
}
