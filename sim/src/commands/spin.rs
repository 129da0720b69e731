//! `jitmap-sim spin`: the demo host for perf, `jitmap inspect` and
//! `jitmap profile` (the host itself is `jitmap_testkit::spin`).

use jitmap::MapVersion;
use jitmap::perf::{PerfConfig, PerfMode};
use jitmap_args::{CliError, CliResult, Outcome, Seconds, emit};
use jitmap_testkit::spin::{self, Churn, Layout};

/// The most functions `spin` publishes.
const MAX_FUNCTIONS: u32 = 100_000;

/// Publish real x86-64 functions with distinct names and run them hot, with
/// perf output enabled (a demo, and the end-to-end tests' workload).
#[derive(clap::Args)]
pub struct Options {
    /// Functions to publish, 1 to 100000.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_FUNCTIONS)))]
    functions: u32,
    /// Seconds to run.
    #[arg(long, default_value = "5", allow_negative_numbers = true)]
    seconds: Seconds,
    /// Perf output: jitdump, map, both or off; defaults to JITMAP_PERF, or
    /// jitdump if that is unset.
    #[arg(long, value_parser = perf_mode)]
    perf: Option<PerfMode>,
    /// Each round, move one function and republish another.
    #[arg(long)]
    churn: bool,
    /// With --churn, give each republished function a name of its own.
    #[arg(long, requires = "churn")]
    unique_names: bool,
    /// Announce the functions to gdb through its JIT interface.
    #[arg(long)]
    gdb: bool,
    /// The heap's map version.
    #[arg(long, default_value = "v2")]
    map: MapVersion,
    /// NOP bytes before each function's hot loop (at most 1 MiB), to put
    /// the samples deep inside the method.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=1 << 20))]
    pad: u64,
    /// Instead of the named functions, run JIT code that calls a native
    /// leaf built without frame pointers (`jitmap_testkit::frameless`): the
    /// stack a frame-pointer walk cuts short.
    #[arg(long, conflicts_with_all = ["churn", "gdb", "functions", "pad"])]
    frameless: bool,
    /// Pad each name with `_` to at least this many bytes (at most 4096).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=4096))]
    name_width: u64,
}

/// `--perf`'s values, with a message that names the option (the library's
/// own parser speaks of `JITMAP_PERF`).
fn perf_mode(s: &str) -> Result<PerfMode, String> {
    match s.parse() {
        Ok(mode) if !s.is_empty() => Ok(mode),
        _ => Err(format!("must be jitdump, map, both or off, not `{s}`")),
    }
}

pub fn run(o: Options) -> CliResult {
    let span = spin::heap_span(o.functions, o.pad as usize);
    if span >= jitmap::nibble::encoding::MAX_SPAN {
        return Err(CliError::input(format!(
            "--functions {} with --pad {} need a heap of {span} bytes; a heap spans less than 4 GiB",
            o.functions, o.pad
        )));
    }
    let churn = match (o.churn, o.unique_names) {
        (false, _) => Churn::Off,
        (true, false) => Churn::On,
        (true, true) => Churn::UniqueNames,
    };
    let layout = Layout {
        functions: o.functions,
        version: o.map,
        pad: o.pad as usize,
        name_width: o.name_width as usize,
    };
    if !cfg!(target_arch = "x86_64") {
        return Err(CliError::input(
            "the spin functions are x86-64 machine code (on this machine, `jitmap-sim run` and `profile --backend cranelift` run)",
        ));
    }
    let mut config = PerfConfig::from_env().map_err(CliError::input)?;
    if let Some(mode) = o.perf {
        config.mode = mode;
    } else if std::env::var_os("JITMAP_PERF").is_none() {
        config.mode = PerfMode::JitDump;
    }
    let manager = jitmap::ExecutionManager::new(4);
    let output = config
        .install(manager.listeners())
        .map_err(|e| CliError::Io(std::io::Error::other(e)))?;
    let (mut text, wrong) = if o.frameless {
        let calls = jitmap_testkit::frameless::run(&manager, o.seconds.duration(), || {})
            .map_err(CliError::failed)?;
        (format!("spin frameless calls={calls}\n"), 0)
    } else {
        let report = spin::run(&manager, layout, o.seconds.duration(), churn, o.gdb)
            .map_err(CliError::failed)?;
        let text = format!(
            "spin functions={} calls={} wrong={} moves={} republishes={}\n",
            report.functions, report.calls, report.wrong, report.moves, report.republishes
        );
        (text, report.wrong)
    };
    if let Some(j) = &output.jitdump {
        text += &format!("jitdump {}\n", j.path().display());
    }
    if let Some(m) = &output.perf_map {
        text += &format!("perf-map {}\n", m.path().display());
    }
    emit(&text)?;
    for warning in output.warnings() {
        eprintln!("jitmap-sim spin: warning: {warning}");
    }
    Ok(Outcome::from_ok(wrong == 0))
}
