//! `jitmap-sim spec`: the spec's worked example under both maps, then a short
//! stress of each (what the default command ran before the simulator).

use std::time::Duration;

use jitmap::MapVersion;
use jitmap_args::{CliResult, Outcome, emit};
use jitmap_sim::stress::StressConfig;

/// The spec's worked example: code at 304 (0x130), 1024 bytes long.
const SPEC_EXAMPLE: &str = "\
# Code at 304 (0x130), 1024 bytes long.
heap 0x1000
set 304 1024
dump
find 1300
find 306
find 302
";

pub fn run() -> CliResult {
    let mut ok = true;
    let mut out = Vec::new();
    for version in [MapVersion::V1, MapVersion::V2] {
        out.extend_from_slice(format!("# nibble map {version}: spec example\n").as_bytes());
        ok &= jitmap_sim::replay::run(SPEC_EXAMPLE, version, &mut out)?;
    }
    out.extend_from_slice(b"# concurrent stress, both maps\n");
    emit(&String::from_utf8_lossy(&out))?;
    let configs = [MapVersion::V1, MapVersion::V2].map(|version| StressConfig {
        version,
        wx: false,
        writers: 1,
        readers: 2,
        duration: Duration::from_secs(2),
        seed: 1,
    });
    let stressed = super::stress::run_configs(&configs)?;
    Ok(Outcome::from_ok(ok && stressed == Outcome::Passed))
}
