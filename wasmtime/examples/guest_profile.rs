//! The 1:2:4 WebAssembly guest ([`jitmap_wasmtime::demo`]) profiled by the
//! agent: its report on stdout (or JSON with `--json`), and `report.txt`,
//! `stacks.folded`, `flamegraph.svg` and `profile.pb.gz` in `--out`.
//!
//! ```text
//! cargo run --release -p jitmap-wasmtime --example guest_profile -- \
//!     [--seconds 3] [--hz 1000] [--out jitmap-wasm-profile] [--json] \
//!     [--serve 127.0.0.1:6060] [--jitdump]
//! ```
//!
//! `--serve` serves the agent's profiles while the guest runs
//! (`go tool pprof http://127.0.0.1:6060/debug/pprof/profile?seconds=2`);
//! `--jitdump` has wasmtime write its own jitdump, for `perf inject --jit`.

use std::path::PathBuf;
use std::time::Duration;

use jitmap::ExecutionManager;
use jitmap::agent::{AgentConfig, Clock};
use jitmap_wasmtime::demo::{self, Until};

/// The options, each `--name value` or a bare flag.
struct Options {
    seconds: f64,
    hz: u32,
    out: PathBuf,
    json: bool,
    serve: Option<std::net::SocketAddr>,
    jitdump: bool,
}

fn options() -> Result<Options, String> {
    let mut o = Options {
        seconds: 3.0,
        hz: 1000,
        out: PathBuf::from("jitmap-wasm-profile"),
        json: false,
        serve: None,
        jitdump: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--seconds" => {
                o.seconds = value(&arg)?
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s > 0.0)
                    .ok_or("--seconds needs a positive number")?
            }
            "--hz" => {
                o.hz = value(&arg)?
                    .parse()
                    .ok()
                    .filter(|&hz| (1..=100_000).contains(&hz))
                    .ok_or("--hz needs 1 to 100000")?
            }
            "--out" => o.out = PathBuf::from(value(&arg)?),
            "--serve" => o.serve = Some(value(&arg)?.parse().map_err(|e| format!("--serve: {e}"))?),
            "--json" => o.json = true,
            "--jitdump" => o.jitdump = true,
            other => return Err(format!("unknown option {other}")),
        }
    }
    Ok(o)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let o = match options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("guest_profile: {e}");
            std::process::exit(2);
        }
    };
    let manager = ExecutionManager::new(4);
    let config = AgentConfig {
        hz: o.hz,
        clock: Clock::Cpu,
        ..AgentConfig::default()
    };
    let engine = demo::engine(o.jitdump)?;
    let until = Until::Elapsed(Duration::from_secs_f64(o.seconds));
    let run = demo::run(&manager, &engine, config, until, |agent| {
        if let Some(address) = o.serve {
            let bound = agent.serve(address)?;
            eprintln!("guest_profile: serving profiles at http://{bound}/debug/pprof/profile");
        }
        Ok(())
    })?;
    let p = &run.profile;
    jitmap_demo::output::write_profile(
        p,
        &p.report(20),
        "jitmap agent: wasmtime guest",
        1_000_000_000 / u64::from(o.hz),
        &o.out,
    )?;
    if o.json {
        let json = serde_json::json!({
            "samples": p.samples,
            "unattributed": p.unattributed,
            "calls": run.calls,
            "wrong": run.wrong,
            "methods": jitmap_demo::output::methods_json(p),
        });
        println!("{json}");
    } else {
        println!(
            "{}\nguest: {} calls, {} wrong results; outputs in {}",
            p.report(10),
            run.calls,
            run.wrong,
            o.out.display()
        );
    }
    if run.wrong > 0 {
        std::process::exit(1);
    }
    Ok(())
}
