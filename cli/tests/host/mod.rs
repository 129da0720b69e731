//! The tool's tests point `jitmap` at live jitmap hosts in other processes.
//! Each such test binary is its own host: started with `JITMAP_TEST_HOST`
//! set, its `main` runs the demo host that names (`spin` or `profile`, from
//! `jitmap-testkit`, the code `jitmap-sim spin` and `jitmap-sim profile` run)
//! and exits, instead of running the tests. So the tests need no other
//! crate's binary, and the hosts are the test binary itself, but for the
//! stripped copy [`stripped`] makes.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use jitmap::agent::Clock;
use jitmap::perf::PerfConfig;
use jitmap::{ExecutionManager, MapVersion};
use jitmap_testkit::spin::{Churn, Layout};

/// The variable that makes a test binary a host.
const HOST: &str = "JITMAP_TEST_HOST";

/// The test binary's own file: the host's executable (its process name is
/// the file name's first 15 bytes).
pub fn executable() -> PathBuf {
    std::env::current_exe().expect("the test binary knows its path")
}

/// This test binary run as the `spin` host with `spin`'s options
/// (`--functions`, `--seconds`, `--churn`, `--unique-names`, `--map`,
/// `--pad`, `--name-width`); perf output as `JITMAP_PERF` says.
pub fn spin(args: &[&str]) -> Command {
    let mut command = Command::new(executable());
    as_host(&mut command, "spin").args(args);
    command
}

/// A copy of [`executable`] in `dir`, stripped of its symbol tables as
/// `strip = true` and distribution packages leave a host: no symbol names
/// the descriptor (this crate's test executables do not export it), and
/// readers find it by its section alone (asserted).
pub fn stripped(dir: &std::path::Path) -> PathBuf {
    use object::{Object, ObjectSection, ObjectSymbol};
    let copy = dir.join("stripped-host");
    let out = Command::new("strip")
        .arg("-o")
        .arg(&copy)
        .arg(executable())
        .output()
        .expect("binutils' strip");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let data = std::fs::read(&copy).unwrap();
    let elf = object::File::parse(&*data).unwrap();
    let named = elf
        .symbols()
        .chain(elf.dynamic_symbols())
        .filter(|s| s.name() == Ok(jitmap::remote::process::DESCRIPTOR_SYMBOL))
        .count();
    assert_eq!(named, 0, "{copy:?} still names the descriptor");
    let section = elf
        .section_by_name(jitmap::remote::process::DESCRIPTOR_SECTION)
        .expect("the descriptor's section");
    assert_eq!(
        section.size(),
        size_of::<jitmap::remote::Descriptor>() as u64
    );
    copy
}

/// Makes the processes `command` starts (itself, or what it runs, as
/// `perf record -- EXECUTABLE` does) the `kind` host when they run
/// [`executable`].
pub fn as_host<'a>(command: &'a mut Command, kind: &str) -> &'a mut Command {
    command.env(HOST, kind)
}

/// Runs `tests` as the test binary's tests (libtest's command line and
/// output), unless this process was started as a host: then it runs the
/// host and exits with its status.
pub fn main(tests: &[(&'static str, fn())]) {
    if let Ok(kind) = std::env::var(HOST) {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let code = match kind.as_str() {
            "spin" => run_spin(&args),
            "profile" => run_profile(&args),
            "wasm" => run_wasm(&args),
            other => Err(format!("no host {other:?}")),
        };
        match code {
            Ok(()) => std::process::exit(0),
            Err(e) => {
                eprintln!("test host {kind}: {e}");
                std::process::exit(2)
            }
        }
    }
    let trials = tests
        .iter()
        .map(|&(name, test)| {
            libtest_mimic::Trial::test(name, move || {
                test();
                Ok(())
            })
        })
        .collect();
    libtest_mimic::run(&libtest_mimic::Arguments::from_args(), trials).exit();
}

/// The value after each `--name` in `args`, and the bare flags.
struct Flags<'a>(&'a [String]);

impl Flags<'_> {
    fn has(&self, flag: &str) -> bool {
        self.0.iter().any(|a| a == flag)
    }

    fn value<T: std::str::FromStr>(&self, flag: &str, default: T) -> Result<T, String> {
        match self.0.iter().position(|a| a == flag) {
            None => Ok(default),
            Some(i) => self
                .0
                .get(i + 1)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{flag} needs a value")),
        }
    }
}

/// `jitmap-sim spin`'s host.
fn run_spin(args: &[String]) -> Result<(), String> {
    let flags = Flags(args);
    let layout = Layout {
        functions: flags.value("--functions", 8)?,
        version: flags.value("--map", MapVersion::V2)?,
        pad: flags.value("--pad", 0)?,
        name_width: flags.value("--name-width", 0)?,
    };
    let churn = match (flags.has("--churn"), flags.has("--unique-names")) {
        (false, _) => Churn::Off,
        (true, false) => Churn::On,
        (true, true) => Churn::UniqueNames,
    };
    let seconds: f64 = flags.value("--seconds", 5.0)?;
    let manager = ExecutionManager::new(4);
    let config = PerfConfig::from_env().map_err(|e| e.to_string())?;
    let _output = config
        .install(manager.listeners())
        .map_err(|e| e.to_string())?;
    let duration = Duration::from_secs_f64(seconds);
    if flags.has("--inlined") {
        // Native code only: a function whose work is in helpers inlined
        // into it.
        let until = std::time::Instant::now() + duration;
        while std::time::Instant::now() < until {
            std::hint::black_box(jitmap_testkit::inlined::spin(std::hint::black_box(200_000)));
        }
        println!("spin inlined");
        return Ok(());
    }
    if flags.has("--frameless") {
        let calls =
            jitmap_testkit::frameless::run(&manager, duration, || {}).map_err(|e| e.to_string())?;
        println!("spin frameless calls={calls}");
        return Ok(());
    }
    let report = jitmap_testkit::spin::run(&manager, layout, duration, churn, false)
        .map_err(|e| e.to_string())?;
    println!("spin functions={} wrong={}", report.functions, report.wrong);
    Ok(())
}

/// `jitmap-sim profile --json`'s host, on the wall clock.
fn run_profile(args: &[String]) -> Result<(), String> {
    let flags = Flags(args);
    let hz: u32 = flags.value("--hz", 1000)?;
    let seconds: f64 = flags.value("--seconds", 3.0)?;
    let out: PathBuf = flags.value("--out", PathBuf::from("jitmap-profile"))?;
    let backend: jitmap_testkit::demo::DemoBackend =
        flags.value("--backend", Default::default())?;
    let manager = ExecutionManager::new(16);
    let _perf = jitmap::perf::PerfOutput::from_env(&manager).map_err(|e| e.to_string())?;
    let duration = Duration::from_secs_f64(seconds);
    let run = jitmap_testkit::profile::run(&manager, backend, hz, Clock::Wall, duration)
        .map_err(|e| e.to_string())?;
    jitmap_testkit::profile::write_outputs(&run, &out).map_err(|e| e.to_string())?;
    println!("{}", jitmap_testkit::profile::json(&run));
    Ok(())
}

/// The WebAssembly guest (`jitmap_wasmtime::demo`, the `guest_profile`
/// example's) profiled by the agent on the wall clock, with wasmtime
/// writing its own jitdump for `perf inject`; `profile --json`'s options
/// and output.
fn run_wasm(args: &[String]) -> Result<(), String> {
    use jitmap::agent::AgentConfig;
    use jitmap_wasmtime::demo::{self, Until};
    let flags = Flags(args);
    let hz: u32 = flags.value("--hz", 1000)?;
    let seconds: f64 = flags.value("--seconds", 3.0)?;
    let out: PathBuf = flags.value("--out", PathBuf::from("jitmap-profile"))?;
    let manager = ExecutionManager::new(4);
    // wasmtime writes its own `jit-<pid>.dump` into the working directory
    // (for perf); jitmap's jitdump would take the same name there. So the
    // host writes jitmap's perf map only, when asked.
    let _perf = (std::env::var("JITMAP_PERF").as_deref() == Ok("map"))
        .then(|| jitmap::perf::PerfOutput::from_env(&manager))
        .transpose()
        .map_err(|e| e.to_string())?;
    let engine = demo::engine(true).map_err(|e| e.to_string())?;
    let config = AgentConfig {
        hz,
        clock: Clock::Wall,
        ..AgentConfig::default()
    };
    let until = Until::Elapsed(Duration::from_secs_f64(seconds));
    let run = demo::run(&manager, &engine, config, until, |_| Ok(())).map_err(|e| e.to_string())?;
    let run = jitmap_testkit::profile::ProfileRun {
        profile: run.profile,
        calls: run.calls,
        wrong: run.wrong,
        period_ns: 1_000_000_000 / u64::from(hz),
    };
    jitmap_testkit::profile::write_outputs(&run, &out).map_err(|e| e.to_string())?;
    println!("{}", jitmap_testkit::profile::json(&run));
    Ok(())
}
