//! `jitmap-sim`: what simulates or measures jitmap itself. It parses the
//! command line and hands each subcommand to its module under `commands/`;
//! with no subcommand it runs the tiered simulator with its defaults.

mod commands;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use jitmap_args::finish;

/// The tiered JIT simulator, stress and replay of the maps, the lookup
/// benchmark, and the demo hosts.
///
/// Exit status: 0 when every answer was right and every check passed; 1 for
/// a wrong answer or a failed check; 2 for bad input, or a file that could
/// not be read or written (checked before the work starts).
#[derive(Parser)]
#[command(name = "jitmap-sim", version)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    Run(commands::run::Options),
    /// The contract's worked nibble-map example replayed under both maps,
    /// then a short concurrent stress of each.
    Spec,
    Replay(commands::replay::Options),
    Compare(commands::compare::Options),
    Scale(commands::scale::Options),
    Stress(commands::stress::Options),
    Spin(commands::spin::Options),
    Profile(commands::profile::Options),
}

fn main() -> ExitCode {
    let (name, result) = match Cli::parse().command {
        Some(Command::Run(o)) => ("run", commands::run::run(o)),
        None => ("run", commands::run::run(commands::run::Options::default())),
        Some(Command::Spec) => ("spec", commands::spec::run()),
        Some(Command::Replay(o)) => ("replay", commands::replay::run(o)),
        Some(Command::Compare(o)) => ("compare", commands::compare::run(o)),
        Some(Command::Scale(o)) => ("scale", commands::scale::run(o)),
        Some(Command::Stress(o)) => ("stress", commands::stress::run(o)),
        Some(Command::Spin(o)) => ("spin", commands::spin::run(o)),
        Some(Command::Profile(o)) => ("profile", commands::profile::run(o)),
    };
    finish("jitmap-sim", name, result)
}
