//! `jitmap`: what a user points at a real JIT host. It parses the command line
//! and hands each subcommand to its module under `commands/`.

mod commands;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use jitmap_args::finish;

/// Inspect and profile jitmap hosts (and .NET 8 runtimes) from outside.
///
/// Exit status: 0 when the command ran and every check passed; 1 for a wrong
/// answer or a failed check (an address that did not resolve, a jitdump with
/// violations); 2 for bad input, or a file, process or privilege that could
/// not be used.
#[derive(Parser)]
#[command(name = "jitmap", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Inspect(commands::inspect::Options),
    Profile(commands::profile::Options),
    JitdumpCheck(commands::jitdump_check::Options),
}

fn main() -> ExitCode {
    let (name, result) = match Cli::parse().command {
        Command::Inspect(o) => ("inspect", commands::inspect::run(o)),
        Command::Profile(o) => ("profile", commands::profile::run(o)),
        Command::JitdumpCheck(o) => ("jitdump-check", commands::jitdump_check::run(o)),
    };
    finish("jitmap", name, result)
}
