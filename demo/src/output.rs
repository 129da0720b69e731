//! What a profile of the demo is written as, and how much work the demo
//! does: shared by the agent's demo (`jitmap-sim profile`) and the eBPF
//! profiler's (`jitmap profile`), so both write the same four files and
//! measure throughput the same way.

use std::path::Path;
use std::time::{Duration, Instant};

use jitmap::agent::Profile;

use crate::demo::Demo;
use crate::rng::Rng;

/// Leaf iterations per unit of work, on average: long enough that calls cost
/// little. Each call draws its own count around it (see [`crate::demo`]).
pub const BASE_ITERATIONS: u32 = 20_000;

/// Every name of a profile as JSON objects (`name`, `self_samples`,
/// `total_samples`, `self_share`), most self samples first: the `methods` of
/// both profilers' JSON.
pub fn methods_json(p: &Profile) -> Vec<serde_json::Value> {
    p.summary()
        .into_iter()
        .map(|m| {
            serde_json::json!({
                "name": m.name,
                "self_samples": m.self_samples,
                "total_samples": m.total_samples,
                "self_share": m.self_share,
            })
        })
        .collect()
}

/// Writes a profile's four outputs into `dir` (created if needed): `report`
/// as `report.txt`, the folded stacks, a flamegraph titled `title`, and pprof
/// with one sample worth `period_ns`.
pub fn write_profile(
    p: &Profile,
    report: &str,
    title: &str,
    period_ns: u64,
    dir: &Path,
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("report.txt"), report)?;
    std::fs::write(dir.join("stacks.folded"), p.folded())?;
    let svg = std::fs::File::create(dir.join("flamegraph.svg"))?;
    p.write_flamegraph(title, std::io::BufWriter::new(svg))?;
    let pb = std::fs::File::create(dir.join("profile.pb.gz"))?;
    p.write_pprof(period_ns, std::io::BufWriter::new(pb))?;
    Ok(())
}

/// Leaf iterations the demo completes in `duration` on this thread.
pub fn throughput(demo: &Demo, duration: Duration, rng: &mut Rng) -> f64 {
    let mut work = 0u64;
    let start = Instant::now();
    while start.elapsed() < duration {
        let base = BASE_ITERATIONS / 2 + rng.below(u64::from(BASE_ITERATIONS)) as u32;
        std::hint::black_box(demo.run(1, base));
        work += 7 * u64::from(base);
    }
    work as f64 / start.elapsed().as_secs_f64()
}

/// Per-round ratios as the overhead reports print them: four decimals each,
/// space-separated.
pub fn ratios(values: &[f64]) -> String {
    values
        .iter()
        .map(|r| format!("{r:.4}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The median of `values`.
pub fn median(values: &[f64]) -> f64 {
    let mut r = values.to_vec();
    r.sort_by(f64::total_cmp);
    r.get(r.len() / 2).copied().unwrap_or(f64::NAN)
}
