//! A jitmap host built the way users build theirs, for the profilers' tests
//! to profile from outside: the eBPF tests build it without forced frame
//! pointers (`RUSTFLAGS=-Cforce-frame-pointers=no`, in a target directory
//! of its own) and start it.
//!
//! - `jitmap-host demo SECONDS OUT`: the 1:2:4 demo under the in-process
//!   agent at 1 kHz (its mixed walk) for SECONDS, then the agent's outputs
//!   in OUT and its JSON on stdout.
//! - `jitmap-host frameless SECONDS`: `spin --frameless`'s workload.
//! - `jitmap-host plt SECONDS`: JIT code calls a C helper whose loop calls
//!   through a PLT entry ([`jitmap_testkit::plt`]).
//! - `jitmap-host trampoline SECONDS`: calls through a frameless stub
//!   ([`jitmap_testkit::trampoline`]).
//! - `jitmap-host dlopen-churn SECONDS`: two libraries loaded and unloaded
//!   in turn ([`jitmap_testkit::dlopen_churn`]).
//! - `jitmap-host overlay SECONDS`: many small libraries loaded and held for
//!   5 s, unloaded, then a large one loaded over their addresses (it prints
//!   `overlaid=N`, how many of their code ranges start inside its own below
//!   its hot function) and run ([`jitmap_testkit::overlay`]).
//!
//! Each prints `ready` once its code is in place (the demo and `frameless`
//! and `trampoline` once published, `plt` and `dlopen-churn` once their
//! libraries are built, `overlay` once its small libraries are loaded).

use std::path::PathBuf;
use std::time::Duration;

use jitmap::ExecutionManager;
use jitmap::agent::Clock;
use jitmap_testkit::demo::DemoBackend;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Err(e) = run(&args) {
        eprintln!("jitmap-host: {e}");
        std::process::exit(2);
    }
}

fn run(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let seconds = |i: usize| -> Result<Duration, Box<dyn std::error::Error>> {
        let s: f64 = args.get(i).ok_or("SECONDS is missing")?.parse()?;
        Ok(Duration::from_secs_f64(s))
    };
    match args.first().map(String::as_str) {
        Some("demo") => {
            let duration = seconds(1)?;
            let out = PathBuf::from(args.get(2).ok_or("OUT is missing")?);
            let manager = ExecutionManager::new(16);
            let run = jitmap_testkit::profile::run_with(
                &manager,
                DemoBackend::Iced,
                1000,
                Clock::Wall,
                duration,
                |_| {
                    println!("ready");
                    Ok(())
                },
            )?;
            jitmap_testkit::profile::write_outputs(&run, &out)?;
            println!("{}", jitmap_testkit::profile::json(&run));
        }
        Some("frameless") => {
            let manager = ExecutionManager::new(4);
            // Ready once the leaf is loaded: a profiler that attaches then
            // finds its unwind rows in its first read of the maps.
            let calls =
                jitmap_testkit::frameless::run(&manager, seconds(1)?, || println!("ready"))?;
            println!("calls={calls}");
        }
        Some("plt") => {
            let manager = ExecutionManager::new(4);
            let calls = jitmap_testkit::plt::run(&manager, seconds(1)?, || println!("ready"))?;
            println!("calls={calls}");
        }
        Some("trampoline") => {
            let manager = ExecutionManager::new(4);
            let calls =
                jitmap_testkit::trampoline::run(&manager, seconds(1)?, || println!("ready"))?;
            println!("calls={calls}");
        }
        Some("dlopen-churn") => {
            println!("ready");
            let loads = jitmap_testkit::dlopen_churn::run(seconds(1)?)?;
            println!("loads={loads}");
        }
        Some("overlay") => {
            let calls = jitmap_testkit::overlay::run(
                Duration::from_secs(5),
                seconds(1)?,
                || println!("ready"),
                |n| println!("overlaid={n}"),
            )?;
            println!("calls={calls}");
        }
        _ => {
            return Err(
                "usage: jitmap-host demo|frameless|plt|trampoline|dlopen-churn|overlay SECONDS [OUT]"
                    .into(),
            );
        }
    }
    Ok(())
}
