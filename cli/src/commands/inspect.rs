//! `jitmap inspect --pid PID [--dotnet]`.

use jitmap_args::{CliError, CliResult, Outcome, emit};
use jitmap_cli::inspect::{self, ByteRange, Report};

/// Resolve addresses in another jitmap host, or list its heaps and live
/// methods, through its descriptor (reads with process_vm_readv). Exit status 1
/// if an address is not resolved, 2 on bad input or an unreadable process.
#[derive(clap::Args)]
pub struct Options {
    /// The process to read.
    #[arg(long)]
    pid: i32,
    /// An address to resolve (0x-prefixed hex or decimal); repeatable.
    #[arg(long = "ip", value_parser = inspect::parse_address)]
    ips: Vec<u64>,
    /// Resolve every byte of START:LEN (with --dotnet); repeatable.
    #[arg(long = "range", value_parser = inspect::parse_range, requires = "dotnet")]
    ranges: Vec<ByteRange>,
    /// List the heaps, images and live methods.
    #[arg(long)]
    list: bool,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// The process is a .NET 8 runtime: read its ExecutionManager's maps.
    #[arg(long)]
    dotnet: bool,
}

pub fn run(o: Options) -> CliResult {
    if o.dotnet {
        print(
            o.pid,
            inspect::run_dotnet(o.pid, &o.ips, &o.ranges, o.list),
            o.json,
        )
    } else {
        print(o.pid, inspect::run(o.pid, &o.ips, o.list), o.json)
    }
}

/// Prints an inspection (text or JSON): passed when every asked address
/// resolved; a process that could not be read is an input error.
fn print(
    pid: i32,
    inspection: Result<impl Report, jitmap::remote::RemoteError>,
    json: bool,
) -> CliResult {
    let inspection =
        inspection.map_err(|e| CliError::input(jitmap_cli::inspect::unreadable(pid, &e)))?;
    let text = if json {
        format!("{}\n", inspection.json())
    } else {
        inspection.text()
    };
    emit(&text)?;
    Ok(Outcome::from_ok(inspection.all_resolved()))
}
