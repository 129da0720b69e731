//! `jitmap profile --pid PID` (formerly `ebpf-profile`): the eBPF profiler.

use jitmap_args::{CliResult, Hz, OutDir, Seconds};

/// Profile a jitmap host or a .NET 8 process from outside with eBPF: every
/// frame resolved in the kernel through the host's descriptor or CoreCLR's
/// own code maps; writes the agent's outputs. Needs a build with
/// `--features ebpf`, and root (or CAP_BPF and CAP_PERFMON). Exit status 2
/// on bad input or missing privileges; 3 when the profile was written but a
/// CoreCLR that could not be read, or of a version whose layout is unknown,
/// left its managed frames unresolved.
#[derive(clap::Args)]
#[command(visible_alias = "ebpf-profile")]
pub struct Options {
    /// The process id: a jitmap host, a .NET 8 process, or both. Required,
    /// unless --overhead.
    #[arg(long, required_unless_present = "overhead")]
    pid: Option<i32>,
    /// Samples per second of CPU time, per CPU.
    #[arg(long, default_value = "1000", allow_negative_numbers = true)]
    hz: Hz,
    /// Seconds to profile (fewer if the host exits; Ctrl-C ends it early,
    /// with its outputs).
    #[arg(long, default_value = "5", allow_negative_numbers = true)]
    seconds: Seconds,
    /// Stop once this many samples have arrived (--seconds still caps the
    /// profile): as many samples on a busy machine as on an idle one.
    #[arg(long, conflicts_with = "overhead")]
    samples: Option<u64>,
    /// Directory for report.txt, stacks.folded, flamegraph.svg and
    /// profile.pb.gz. Without it (the default), only the report is printed.
    #[arg(long, conflicts_with = "overhead")]
    out: Option<OutDir>,
    /// Print the report as one JSON object.
    #[arg(long, conflicts_with = "overhead")]
    json: bool,
    /// Step native frames by their objects' `.eh_frame` (loaded into the
    /// kernel for every object the host maps, kept current across dlopen
    /// and dlclose), so code built without frame pointers is walked; `off`
    /// steps them by the frame pointer only.
    #[arg(long, value_enum, default_value = "on", conflicts_with = "overhead")]
    native_unwind: Switch,
    /// The most native rows loaded (16 bytes each; the default is 32 MiB).
    /// An object whose rows do not fit is left out, and the report says so.
    #[arg(long, default_value_t = 1 << 21, conflicts_with = "overhead")]
    native_rows: u32,
    /// Resolve a .NET 8 process's managed frames in the kernel through
    /// CoreCLR's own code maps (its RangeSectionMap and nibble maps) and
    /// name them from their assemblies' metadata; `off` steps them as
    /// unknown code.
    #[arg(long, value_enum, default_value = "on", conflicts_with = "overhead")]
    dotnet: Switch,
    /// Instead of profiling a host, measure the program's cost on the demo
    /// host run here: throughput at 1 kHz and 10 kHz over no program, in
    /// rounds of --seconds each, side by side.
    #[arg(long, conflicts_with_all = ["pid", "hz"])]
    overhead: bool,
}

/// On or off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Switch {
    /// On.
    On,
    /// Off.
    Off,
}

/// Runs the profile, or the overhead measurement.
#[cfg(feature = "ebpf")]
pub fn run(o: Options) -> CliResult {
    use jitmap_args::{CliError, Outcome, dropped_warning, emit};
    use jitmap_cli::ebpf;
    let duration = o.seconds.duration();
    if o.overhead {
        let rows = ebpf::overhead(&[1000, 10_000], duration, 5).map_err(CliError::input)?;
        let list = jitmap_demo::output::ratios;
        let median = jitmap_demo::output::median;
        for row in rows {
            emit(&format!(
                "{} Hz (cpu-clock, every CPU), throughput over no program, median of {}: \
                 profiling {:.4} [{}], taking stacks only {:.4} [{}], attached but \
                 profiling no process (floor) {:.4} [{}], profiling without native rows \
                 {:.4} [{}]; ns per sample in the kernel: {:.0} profiling, {:.0} without \
                 native rows, {:.0} taking stacks only\n",
                row.hz,
                row.ratios.len(),
                median(&row.ratios),
                list(&row.ratios),
                median(&row.stack_only),
                list(&row.stack_only),
                median(&row.floor),
                list(&row.floor),
                median(&row.no_native),
                list(&row.no_native),
                median(&row.ns_per_sample),
                median(&row.no_native_ns),
                median(&row.stack_only_ns),
            ))?;
        }
        return Ok(Outcome::Passed);
    }
    let out = o.out.as_ref().map(OutDir::prepare).transpose()?;
    let pid = o.pid.ok_or_else(|| CliError::input("--pid is required"))?;
    let options = ebpf::Options {
        pid,
        hz: o.hz.get(),
        duration,
        samples: o.samples,
        native_rows: (o.native_unwind == Switch::On).then_some(o.native_rows),
        dotnet: o.dotnet == Switch::On,
    };
    // On stderr, so that a caller (or a test) knows when sampling began.
    let mut attached = || eprintln!("jitmap profile: sampling process {pid}");
    let run = ebpf::run(&options, stop_on_sigint(), &mut attached).map_err(CliError::input)?;
    if let Some(dir) = out {
        run.write_outputs(dir)?;
    }
    if o.json {
        emit(&format!("{}\n", run.json()))?;
    } else {
        emit(&run.report(10))?;
        if let Some(dir) = out {
            emit(&format!("\noutputs in {}\n", dir.display()))?;
        }
    }
    let c = &run.counts;
    let dropped = c.stale_samples + run.kernel.lost;
    if let Some(warning) = dropped_warning(c.samples + c.empty_samples + dropped, dropped) {
        eprintln!("jitmap profile: {warning}");
    }
    if let ebpf::DotnetStatus::Refused { .. } | ebpf::DotnetStatus::Unreadable { .. } = run.dotnet {
        eprintln!("jitmap profile: {}", run.dotnet);
        return Ok(Outcome::Partial);
    }
    Ok(Outcome::Passed)
}

/// A flag that SIGINT sets (and no longer kills the process), so that Ctrl-C
/// ends a profile early with its outputs written.
#[cfg(feature = "ebpf")]
fn stop_on_sigint() -> &'static std::sync::atomic::AtomicBool {
    use std::sync::atomic::{AtomicBool, Ordering};
    static STOP: AtomicBool = AtomicBool::new(false);
    extern "C" fn on_sigint(_: libc::c_int) {
        // Relaxed: a flag the profile loop polls; an atomic store is
        // async-signal-safe.
        STOP.store(true, Ordering::Relaxed);
    }
    // SAFETY: a zeroed sigaction is valid; the handler only stores to an
    // atomic, which is async-signal-safe; SA_RESTART keeps the profile's
    // system calls going. If sigaction fails, SIGINT keeps its default.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_sigint as *const () as libc::sighandler_t;
        action.sa_flags = libc::SA_RESTART;
        libc::sigaction(libc::SIGINT, &action, std::ptr::null_mut());
    }
    &STOP
}

/// `profile` in a build without the `ebpf` feature: says how to get it.
#[cfg(not(feature = "ebpf"))]
pub fn run(_: Options) -> CliResult {
    Err(jitmap_args::CliError::input(
        "this jitmap was built without the `ebpf` feature; install it with \
         `cargo install --path cli --locked --features ebpf` (needs clang)",
    ))
}
