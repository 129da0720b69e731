//! `jitmap-sim`: the JIT-heap simulator and command-line tool.

use std::io::{self, Read, Write};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use jitmap::MapVersion;
use jitmap::agent::{AgentConfig, Clock};
use jitmap::perf::check::{Body, check};
use jitmap::perf::{PerfConfig, PerfMode};
use jitmap_sim::inspect::Report;
use jitmap_sim::spin::Churn;
use jitmap_sim::stress::{self, StressConfig};
use jitmap_sim::tiered::{self, RunConfig, Scenario};
use jitmap_sim::{profile, replay};
use std::time::Duration;

#[derive(Parser)]
#[command(name = "jitmap-sim", version, about = "JIT-heap simulator for jitmap")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// The tiered JIT simulator (the default, as `run`): real code compiled at
    /// two tiers, run, sampled, freed and unloaded, every answer checked.
    Run {
        /// startup, steady, large, unload, abort or mixed.
        #[arg(long, default_value = "mixed")]
        scenario: String,
        /// Seconds to run.
        #[arg(long, default_value_t = 15.0)]
        seconds: f64,
        /// Workload seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Map version of every heap.
        #[arg(long, default_value = "v2")]
        map: MapVersion,
        /// W^X heaps (a write view and an execute view).
        #[arg(long)]
        wx: bool,
        /// Executor threads.
        #[arg(long, default_value_t = 2)]
        threads: usize,
        /// The agent's sampling rate (wall clock).
        #[arg(long, default_value_t = 1000)]
        hz: u32,
        /// Directory for the agent's flamegraph, folded stacks and pprof.
        #[arg(long)]
        out: Option<std::path::PathBuf>,
        /// Print the report as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// The spec's worked example under both maps, then a short stress of each
    /// (what the default command ran before the simulator).
    Spec,
    /// Replay a script of nibble-map operations (see README, "Replay scripts").
    Replay {
        /// Map version, unless the script says `map`.
        #[arg(long, default_value = "v2")]
        map: MapVersion,
        /// Script file, or `-` for standard input.
        file: String,
    },
    /// Measure every lookup structure side by side (floor, v2, v1, heap, manager, B-tree,
    /// sorted vector).
    Compare {
        /// Shorter batches and fewer samples: the same keys in seconds (well under 15 s),
        /// for a smoke run, not for figures.
        #[arg(long)]
        quick: bool,
        /// Print one JSON object instead of the table.
        #[arg(long)]
        json: bool,
        /// Write an SVG of lookup ns against method size.
        #[arg(long, value_name = "FILE.svg")]
        plot: Option<std::path::PathBuf>,
    },
    /// Check a jitdump file: print its header, records and violations.
    JitdumpCheck {
        /// The `jit-<pid>.dump` file.
        file: String,
    },
    /// Resolve addresses in another jitmap host, or list its heaps and live
    /// methods, through its descriptor (reads with process_vm_readv). Exit
    /// status 1 if an address is not resolved, 2 on bad input or an
    /// unreadable process.
    Inspect {
        /// The process to read.
        #[arg(long)]
        pid: i32,
        /// An address to resolve (0x-prefixed hex or decimal); repeatable.
        #[arg(long = "ip", value_parser = jitmap_sim::inspect::parse_address)]
        ips: Vec<u64>,
        /// Resolve every byte of START:LEN (with --dotnet); repeatable.
        #[arg(long = "range", value_parser = jitmap_sim::inspect::parse_range, requires = "dotnet")]
        ranges: Vec<jitmap_sim::inspect::ByteRange>,
        /// List the heaps, images and live methods.
        #[arg(long)]
        list: bool,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
        /// The process is a .NET 8 runtime: read its ExecutionManager's maps.
        #[arg(long)]
        dotnet: bool,
    },
    /// Publish real x86-64 functions with distinct names and run them hot, with
    /// perf output enabled (a demo, and the end-to-end test's workload).
    Spin {
        /// Functions to publish.
        #[arg(long, default_value_t = 8)]
        functions: u32,
        /// Seconds to run.
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        /// Perf output; defaults to JITMAP_PERF, or jitdump if that is unset.
        #[arg(long)]
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
        #[arg(long, default_value_t = 0)]
        pad: usize,
        /// Pad each name with `_` to at least this many bytes (at most 4096).
        #[arg(long, default_value_t = 0)]
        name_width: usize,
    },
    /// Run the demo host (leaf_1x, leaf_2x, leaf_4x under middle and top) under
    /// the in-process agent; write report.txt, stacks.folded, flamegraph.svg and
    /// profile.pb.gz.
    Profile {
        /// Samples per second.
        #[arg(long, default_value_t = 1000)]
        hz: u32,
        /// Seconds to run.
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
        /// The sampling clock: cpu (the thread's CPU time) or wall.
        #[arg(long, default_value = "cpu")]
        clock: ClockArg,
        /// Directory for the outputs.
        #[arg(long, default_value = "jitmap-profile")]
        out: std::path::PathBuf,
        /// Print the report as one JSON object.
        #[arg(long)]
        json: bool,
        /// Instead of profiling, measure the agent's cost on the demo: its
        /// throughput at 1 kHz and 10 kHz over no agent, in rounds of
        /// --seconds each, side by side.
        #[arg(long)]
        overhead: bool,
    },
    /// Profile a jitmap host from outside with eBPF: every frame resolved in
    /// the kernel through its descriptor; writes the agent's outputs. Needs a
    /// build with `--features ebpf`, and root (or CAP_BPF and CAP_PERFMON).
    /// Exit status 2 on bad input or missing privileges.
    EbpfProfile {
        /// The host's process id.
        #[arg(long, required_unless_present = "overhead")]
        pid: Option<i32>,
        /// Samples per second of CPU time, per CPU.
        #[arg(long, default_value_t = 1000)]
        hz: u32,
        /// Seconds to profile (fewer if the host exits; Ctrl-C ends it early,
        /// with its outputs).
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        /// Directory for report.txt, stacks.folded, flamegraph.svg and profile.pb.gz.
        #[arg(long)]
        out: Option<std::path::PathBuf>,
        /// Print the report as one JSON object.
        #[arg(long)]
        json: bool,
        /// Instead of profiling a host, measure the program's cost on the demo
        /// host run here: throughput at 1 kHz and 10 kHz over no program, in
        /// rounds of --seconds each, side by side.
        #[arg(long, conflicts_with = "pid")]
        overhead: bool,
    },
    /// Writers publish, abort and free code while readers check every lookup.
    Stress {
        /// Map version.
        #[arg(long, default_value = "v2")]
        map: MapVersion,
        /// Use a W^X double mapping instead of one RWX mapping.
        #[arg(long)]
        wx: bool,
        /// Threads in all: a third write (at least one), the rest read.
        #[arg(long, default_value_t = 4)]
        threads: usize,
        /// Seconds to run.
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        /// Workload seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

/// `--clock` values.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum ClockArg {
    Cpu,
    Wall,
}

/// The spec's worked example, replayed when no command is given.
const SPEC_EXAMPLE: &str = "\
# Code at 304 (0x130), 1024 bytes long.
heap 0x1000
set 304 1024
dump
find 1300
find 306
find 302
";

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Replay { map, file }) => run_replay(&file, map),
        Some(Command::JitdumpCheck { file }) => run_jitdump_check(&file),
        Some(Command::Inspect {
            pid,
            ips,
            ranges,
            list,
            json,
            dotnet,
        }) => {
            if dotnet {
                let inspection = jitmap_sim::inspect::run_dotnet(pid, &ips, &ranges, list);
                print_inspection("inspect --dotnet", pid, inspection, json)
            } else {
                let inspection = jitmap_sim::inspect::run(pid, &ips, list);
                print_inspection("inspect", pid, inspection, json)
            }
        }
        Some(Command::Compare { quick, json, plot }) => run_compare(quick, json, plot.as_deref()),
        Some(Command::Spin {
            functions,
            seconds,
            perf,
            churn,
            unique_names,
            gdb,
            map,
            pad,
            name_width,
        }) => {
            let churn = match (churn, unique_names) {
                (false, _) => Churn::Off,
                (true, false) => Churn::On,
                (true, true) => Churn::UniqueNames,
            };
            let layout = jitmap_sim::spin::Layout {
                functions,
                version: map,
                pad,
                name_width,
            };
            run_spin(layout, seconds, perf, churn, gdb)
        }
        Some(Command::Profile {
            hz,
            seconds,
            clock,
            out,
            json,
            overhead,
        }) => {
            if overhead {
                run_overhead(seconds)
            } else {
                run_profile(hz, seconds, clock, &out, json)
            }
        }
        Some(Command::EbpfProfile {
            pid,
            hz,
            seconds,
            out,
            json,
            overhead,
        }) => run_ebpf(pid, hz, seconds, out.as_deref(), json, overhead),
        Some(Command::Stress {
            map,
            wx,
            threads,
            seconds,
            seed,
        }) => {
            let writers = (threads / 3).max(1);
            run_stress(&[StressConfig {
                version: map,
                wx,
                writers,
                readers: threads.saturating_sub(writers).max(1),
                duration: Duration::from_secs_f64(seconds.max(0.0)),
                seed,
            }])
        }
        Some(Command::Spec) => run_spec(),
        Some(Command::Run {
            scenario,
            seconds,
            seed,
            map,
            wx,
            threads,
            hz,
            out,
            json,
        }) => run_tiered(
            &scenario,
            seconds,
            seed,
            map,
            wx,
            threads,
            hz,
            out.as_deref(),
            json,
        ),
        None => run_tiered(
            "mixed",
            15.0,
            1,
            MapVersion::V2,
            false,
            2,
            1000,
            None,
            false,
        ),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("jitmap-sim: {e}");
            ExitCode::from(2)
        }
    }
}

fn run_replay(file: &str, map: MapVersion) -> io::Result<ExitCode> {
    let script = if file == "-" {
        let mut s = String::new();
        io::stdin().read_to_string(&mut s)?;
        s
    } else {
        std::fs::read_to_string(file)?
    };
    let mut out = io::stdout().lock();
    let ok = replay::run(&script, map, &mut out)?;
    out.flush()?;
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn run_compare(quick: bool, json: bool, plot: Option<&std::path::Path>) -> io::Result<ExitCode> {
    let report = jitmap_sim::compare::run(quick).map_err(io::Error::other)?;
    let mut out = io::stdout().lock();
    if json {
        writeln!(out, "{}", report.json())?;
    } else {
        write!(out, "{}", report.table())?;
    }
    if let Some(path) = plot {
        report
            .plot(path)
            .map_err(|e| io::Error::other(e.to_string()))?;
        if !json {
            writeln!(out, "plot written to {}", path.display())?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints an inspection (text or JSON): exit status 0 when every asked address
/// resolved, 1 when one did not, 2 when the process could not be read.
fn print_inspection(
    command: &str,
    pid: i32,
    inspection: Result<impl Report, jitmap::remote::RemoteError>,
    json: bool,
) -> io::Result<ExitCode> {
    let inspection = match inspection {
        Ok(inspection) => inspection,
        Err(e) => {
            eprintln!("jitmap-sim {command}: process {pid}: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    let mut out = io::stdout().lock();
    if json {
        writeln!(out, "{}", inspection.json())?;
    } else {
        write!(out, "{}", inspection.text())?;
    }
    Ok(if inspection.all_resolved() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn run_jitdump_check(file: &str) -> io::Result<ExitCode> {
    let bytes = std::fs::read(file)?;
    let report = check(&bytes);
    let mut out = io::stdout().lock();
    if let Some(h) = report.header {
        writeln!(
            out,
            "header version={} size={} elf_mach={} pid={} timestamp={} flags={:#x}",
            h.version, h.total_size, h.elf_mach, h.pid, h.timestamp, h.flags
        )?;
    }
    for r in &report.records {
        let what = match &r.body {
            Body::Load {
                tid,
                code_addr,
                code_size,
                code_index,
                name,
                ..
            } => {
                format!(
                    "load tid={tid} addr={code_addr:#x} size={code_size} index={code_index} name={name}"
                )
            }
            Body::Move {
                old_addr,
                new_addr,
                code_size,
                code_index,
                ..
            } => {
                format!("move {old_addr:#x} -> {new_addr:#x} size={code_size} index={code_index}")
            }
            Body::DebugInfo { code_addr, rows } => {
                format!("debug-info addr={code_addr:#x} rows={}", rows.len())
            }
            Body::UnwindingInfo {
                eh_frame,
                eh_frame_hdr,
                mapped_size,
            } => format!(
                "unwinding-info eh_frame={} eh_frame_hdr={} mapped={mapped_size}",
                eh_frame.len(),
                eh_frame_hdr.len()
            ),
            Body::Close => "close".to_owned(),
            Body::Unknown { id } => format!("unknown id={id}"),
        };
        writeln!(
            out,
            "record offset={} size={} timestamp={} {what}",
            r.offset, r.size, r.timestamp
        )?;
    }
    for v in &report.violations {
        writeln!(out, "violation {v}")?;
    }
    writeln!(
        out,
        "records={} violations={} clean_bytes={}",
        report.records.len(),
        report.violations.len(),
        report.clean_len
    )?;
    Ok(if report.violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn run_spin(
    layout: jitmap_sim::spin::Layout,
    seconds: f64,
    perf: Option<PerfMode>,
    churn: Churn,
    gdb: bool,
) -> io::Result<ExitCode> {
    if !cfg!(target_arch = "x86_64") {
        eprintln!("jitmap-sim spin: the demo functions are x86-64 machine code");
        return Ok(ExitCode::from(2));
    }
    if layout.pad > 1 << 20 || layout.name_width > 4096 {
        eprintln!("jitmap-sim spin: --pad must be at most 1048576, --name-width at most 4096");
        return Ok(ExitCode::from(2));
    }
    let mut config = PerfConfig::from_env().map_err(io::Error::other)?;
    if let Some(mode) = perf {
        config.mode = mode;
    } else if std::env::var_os("JITMAP_PERF").is_none() {
        config.mode = PerfMode::JitDump;
    }
    let manager = jitmap::ExecutionManager::new(4);
    let output = config
        .install(manager.listeners())
        .map_err(io::Error::other)?;
    let report = jitmap_sim::spin::run(
        &manager,
        layout,
        Duration::from_secs_f64(seconds.max(0.0)),
        churn,
        gdb,
    )
    .map_err(io::Error::other)?;
    let mut out = io::stdout().lock();
    writeln!(
        out,
        "spin functions={} calls={} wrong={} moves={} republishes={}",
        report.functions, report.calls, report.wrong, report.moves, report.republishes
    )?;
    if let Some(j) = &output.jitdump {
        writeln!(out, "jitdump {}", j.path().display())?;
    }
    if let Some(m) = &output.perf_map {
        writeln!(out, "perf-map {}", m.path().display())?;
    }
    Ok(if report.wrong == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn run_profile(
    hz: u32,
    seconds: f64,
    clock: ClockArg,
    dir: &std::path::Path,
    json: bool,
) -> io::Result<ExitCode> {
    if !cfg!(target_arch = "x86_64") {
        eprintln!("jitmap-sim profile: the demo functions are x86-64 machine code");
        return Ok(ExitCode::from(2));
    }
    if !(seconds.is_finite() && seconds > 0.0 && seconds <= 3600.0) {
        eprintln!("jitmap-sim profile: --seconds must be in (0, 3600]");
        return Ok(ExitCode::from(2));
    }
    let clock = match clock {
        ClockArg::Cpu => Clock::Cpu,
        ClockArg::Wall => Clock::Wall,
    };
    let manager = std::sync::Arc::new(jitmap::ExecutionManager::new(16));
    let _perf = manager.perf_from_env().map_err(io::Error::other)?;
    let run = match profile::run(&manager, hz, clock, Duration::from_secs_f64(seconds)) {
        Ok(run) => run,
        Err(e) => {
            eprintln!("jitmap-sim profile: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    profile::write_outputs(&run, dir)?;
    let mut out = io::stdout().lock();
    if json {
        writeln!(out, "{}", profile::json(&run))?;
    } else {
        write!(out, "{}", run.profile.report(10))?;
        writeln!(
            out,
            "\ndemo: {} calls, {} wrong results; outputs in {}",
            run.calls,
            run.wrong,
            dir.display()
        )?;
    }
    Ok(if run.wrong == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The tiered simulator; a progress bar on a terminal.
#[allow(clippy::too_many_arguments)] // one per command-line option
fn run_tiered(
    scenario: &str,
    seconds: f64,
    seed: u64,
    map: MapVersion,
    wx: bool,
    threads: usize,
    hz: u32,
    out: Option<&std::path::Path>,
    json: bool,
) -> io::Result<ExitCode> {
    use std::io::IsTerminal;
    let bad = |what: String| {
        eprintln!("jitmap-sim run: {what}");
        Ok(ExitCode::from(2))
    };
    if !cfg!(target_arch = "x86_64") {
        return bad("the simulator's JIT emits x86-64 code".into());
    }
    let scenario = match scenario.parse::<Scenario>() {
        Ok(s) => s,
        Err(e) => return bad(e),
    };
    if !(seconds.is_finite() && seconds > 0.0 && seconds <= 3600.0) {
        return bad(format!("--seconds must be in (0, 3600], not {seconds}"));
    }
    if let Err(e) = (AgentConfig {
        hz,
        ..AgentConfig::default()
    })
    .validate()
    {
        return bad(format!("--hz: {e}"));
    }
    let config = RunConfig {
        scenario,
        duration: Duration::from_secs_f64(seconds),
        seed,
        version: map,
        wx,
        threads,
        hz,
    };
    if let Err(e) = config.validate() {
        return bad(e);
    }
    let bar = (!json && io::stderr().is_terminal()).then(|| {
        let bar = indicatif::ProgressBar::new(1000);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {elapsed}/{duration}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar.set_message(format!("jitmap-sim run {scenario}"));
        bar
    });
    let progress = |f: f64| {
        if let Some(bar) = &bar {
            bar.set_position((f.clamp(0.0, 1.0) * 1000.0) as u64);
        }
    };
    let report = match tiered::run(config, out, &progress) {
        Ok(r) => r,
        Err(e) => {
            if let Some(bar) = &bar {
                bar.abandon();
            }
            eprintln!("jitmap-sim run: {e}");
            return Ok(ExitCode::FAILURE);
        }
    };
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let mut stdout = io::stdout().lock();
    if json {
        writeln!(stdout, "{}", report.json())?;
    } else {
        write!(stdout, "{}", report.text())?;
        if let Some(dir) = out {
            writeln!(stdout, "agent outputs in {}", dir.display())?;
        }
    }
    Ok(if report.wrong == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn run_overhead(seconds: f64) -> io::Result<ExitCode> {
    if !(seconds.is_finite() && seconds > 0.0 && seconds <= 60.0) {
        eprintln!("jitmap-sim profile --overhead: --seconds must be in (0, 60]");
        return Ok(ExitCode::from(2));
    }
    let manager = std::sync::Arc::new(jitmap::ExecutionManager::new(16));
    let rows = profile::overhead(
        &manager,
        &[1000, 10_000],
        Duration::from_secs_f64(seconds),
        5,
    )
    .map_err(|e| io::Error::other(e.to_string()))?;
    let mut out = io::stdout().lock();
    for row in rows {
        let ratios: Vec<String> = row.ratios.iter().map(|r| format!("{r:.4}")).collect();
        let floor: Vec<String> = row.floor.iter().map(|r| format!("{r:.4}")).collect();
        writeln!(
            out,
            "{} Hz (wall), throughput over no agent, median of {}: agent {:.4} [{}], \
             empty handler (floor) {:.4} [{}]",
            row.hz,
            row.ratios.len(),
            profile::median(&row.ratios),
            ratios.join(" "),
            profile::median(&row.floor),
            floor.join(" ")
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `ebpf-profile`: exit status 2 on bad input, missing privileges, or a build
/// without the `ebpf` feature.
#[cfg(feature = "ebpf")]
fn run_ebpf(
    pid: Option<i32>,
    hz: u32,
    seconds: f64,
    out: Option<&std::path::Path>,
    json: bool,
    overhead: bool,
) -> io::Result<ExitCode> {
    use jitmap_sim::ebpf;
    let fail = |e: &dyn std::fmt::Display| {
        eprintln!("jitmap-sim ebpf-profile: {e}");
        Ok(ExitCode::from(2))
    };
    if !(seconds.is_finite() && seconds > 0.0 && seconds <= 3600.0) {
        return fail(&"--seconds must be in (0, 3600]");
    }
    let duration = Duration::from_secs_f64(seconds);
    if overhead {
        let rows = match ebpf::overhead(&[1000, 10_000], duration, 5) {
            Ok(rows) => rows,
            Err(e) => return fail(&e),
        };
        let mut stdout = io::stdout().lock();
        for row in rows {
            let list = |v: &[f64]| {
                v.iter()
                    .map(|r| format!("{r:.4}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            let median = profile::median;
            writeln!(
                stdout,
                "{} Hz (cpu-clock, every CPU), throughput over no program, median of {}: \
                 profiling {:.4} [{}], taking stacks only {:.4} [{}], attached but \
                 profiling no process (floor) {:.4} [{}]; ns per sample in the kernel: \
                 {:.0} profiling, {:.0} taking stacks only",
                row.hz,
                row.ratios.len(),
                median(&row.ratios),
                list(&row.ratios),
                median(&row.stack_only),
                list(&row.stack_only),
                median(&row.floor),
                list(&row.floor),
                median(&row.ns_per_sample),
                median(&row.stack_only_ns),
            )?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let Some(pid) = pid else {
        return fail(&"--pid is required");
    };
    let run = match ebpf::run(&ebpf::Options { pid, hz, duration }, stop_on_sigint()) {
        Ok(run) => run,
        Err(e) => return fail(&e),
    };
    if let Some(dir) = out {
        run.write_outputs(dir)?;
    }
    let mut stdout = io::stdout().lock();
    if json {
        writeln!(stdout, "{}", run.json())?;
    } else {
        write!(stdout, "{}", run.report(10))?;
        if let Some(dir) = out {
            writeln!(stdout, "\noutputs in {}", dir.display())?;
        }
    }
    Ok(ExitCode::SUCCESS)
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

/// `ebpf-profile` in a build without the `ebpf` feature: says how to get it.
#[cfg(not(feature = "ebpf"))]
fn run_ebpf(
    _pid: Option<i32>,
    _hz: u32,
    _seconds: f64,
    _out: Option<&std::path::Path>,
    _json: bool,
    _overhead: bool,
) -> io::Result<ExitCode> {
    eprintln!(
        "jitmap-sim ebpf-profile: this jitmap-sim was built without the `ebpf` feature; \
         build it with `cargo build --release -p jitmap-sim --features ebpf` (needs clang)"
    );
    Ok(ExitCode::from(2))
}

fn run_stress(configs: &[StressConfig]) -> io::Result<ExitCode> {
    let mut out = io::stdout().lock();
    let mut wrong = 0;
    for config in configs {
        let r = stress::run(*config).map_err(io::Error::other)?;
        writeln!(
            out,
            "stress map={} wx={} writers={} readers={} seconds={:.1}: lookups={} exact={} wrong={} \
             publishes={} aborts={} frees={} reclaimed_bytes={}",
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
        )?;
        wrong += r.wrong;
    }
    Ok(if wrong == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The spec example under both maps, then a short stress of each.
fn run_spec() -> io::Result<ExitCode> {
    let mut ok = true;
    {
        let mut out = io::stdout().lock();
        for version in [MapVersion::V1, MapVersion::V2] {
            writeln!(out, "# nibble map {version}: spec example")?;
            ok &= replay::run(SPEC_EXAMPLE, version, &mut out)?;
        }
        writeln!(out, "# concurrent stress, both maps")?;
    }
    let configs: Vec<StressConfig> = [MapVersion::V1, MapVersion::V2]
        .into_iter()
        .map(|version| StressConfig {
            version,
            wx: false,
            writers: 1,
            readers: 2,
            duration: Duration::from_secs(2),
            seed: 1,
        })
        .collect();
    let stressed = run_stress(&configs)?;
    Ok(if ok { stressed } else { ExitCode::FAILURE })
}
