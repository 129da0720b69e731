//! `jitmap-sim`: the JIT-heap simulator and command-line tool.

use std::io::{self, Read, Write};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use jitmap::MapVersion;
use jitmap_sim::replay;

#[derive(Parser)]
#[command(name = "jitmap-sim", version, about = "JIT-heap simulator for jitmap")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Replay a script of nibble-map operations (see README, "Replay scripts").
    Replay {
        /// Map version, unless the script says `map`.
        #[arg(long, default_value = "v2")]
        map: MapVersion,
        /// Script file, or `-` for standard input.
        file: String,
    },
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
        None => run_default(),
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

fn run_default() -> io::Result<ExitCode> {
    let mut out = io::stdout().lock();
    let mut ok = true;
    for version in [MapVersion::V1, MapVersion::V2] {
        writeln!(out, "# nibble map {version}: spec example")?;
        ok &= replay::run(SPEC_EXAMPLE, version, &mut out)?;
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
