//! `scale --churn N`: the agent's memory while a host churns method
//! versions. One thread publishes a version, runs it, and frees it, `N`
//! times, each under a name of its own, while the agent samples that thread
//! on the wall clock (a CPU-clock timer fires at most once a scheduler
//! tick, too seldom to name many versions). The collector keeps each version a sample names; past
//! [`AgentConfig::profile_versions`] it merges retired ones into one entry
//! per tier. So the agent's memory must stay flat however many versions
//! come and go: this measures the allocator's bytes in use and the resident
//! set at checkpoints, and the profile's method entries at the end.
//!
//! With `big`, the heap is a version-1 heap and the thread also calls a
//! 128 KiB method between versions, whose loop lies deeper than the signal
//! handler's scan ([`jitmap::agent::HANDLER_V1_WORDS`]): a steady stream of
//! frames the handler cannot name, which the collector names later. The
//! collector must still forget every freed version once no waiting sample
//! can name it.

use std::time::Instant;

use jitmap::agent::{Agent, AgentConfig, Clock};
use jitmap::{CodeInfo, ExecutionManager, HeapConfig, JitKind, MapVersion};

use crate::fixture::BoxError;
use crate::scale::heap_in_use;
use crate::tiered::resident_bytes;

/// Each version's code: `mov ecx, 20000; L: dec ecx; jnz L; ret`, a few
/// microseconds of work that touches no memory and clobbers only ecx (a
/// caller-saved register in the C ABI).
const CODE: [u8; 10] = [0xB9, 0x20, 0x4E, 0x00, 0x00, 0xFF, 0xC9, 0x75, 0xFC, 0xC3];

/// The big method's size, and where its loop (a copy of [`CODE`]) starts:
/// 120 KiB in, past the 64 KiB a handler scans back in a version-1 map.
const BIG: usize = 128 << 10;
const BIG_LOOP: usize = 120 << 10;

/// The big method: a jump to its loop, int3 up to it, the loop, int3 after.
fn big_method() -> Vec<u8> {
    let mut code = vec![0xCC; BIG];
    code[0] = 0xE9; // jmp rel32, relative to the next instruction
    code[1..5].copy_from_slice(&((BIG_LOOP - 5) as u32).to_le_bytes());
    code[BIG_LOOP..BIG_LOOP + CODE.len()].copy_from_slice(&CODE);
    code
}

/// Memory after a number of versions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Point {
    /// Versions published, run and freed so far.
    pub versions: usize,
    /// The allocator's bytes in use ([`heap_in_use`]).
    pub malloc: usize,
    /// The resident set.
    pub rss: u64,
}

/// A churn run's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct Churn {
    /// Memory before the first version, then at each checkpoint.
    pub points: Vec<Point>,
    /// The cap on versions named one by one.
    pub profile_versions: usize,
    /// The profile's method entries at the end (named versions and the
    /// merged entries).
    pub entries: usize,
    /// Of the entries, those that merged retired versions, and how many
    /// versions they hold.
    pub merged: (usize, u64),
    /// Samples in the profile, and how many named a version.
    pub samples: (u64, u64),
    /// Signals the handlers ran for, and those whose samples were dropped.
    pub taken: (u64, u64),
    /// Seconds the churn took.
    pub seconds: f64,
}

/// Whether a frame's name is a churned version's (`v<N>`, or the entry
/// retired versions merged into).
fn is_version(name: &str) -> bool {
    name.strip_prefix('v')
        .is_some_and(|n| n.parse::<u64>().is_ok())
        || name.starts_with("[retired ")
}

/// Churns `versions` versions under an agent sampling at `hz` that names
/// at most `profile_versions` one by one; memory is read every
/// `versions / checkpoints` versions. With `big`, in a version-1 heap, a
/// call of the big method follows each version.
pub fn churn(
    versions: usize,
    checkpoints: usize,
    hz: u32,
    profile_versions: usize,
    big: bool,
) -> Result<Churn, BoxError> {
    if !cfg!(target_arch = "x86_64") {
        return Err("the churned versions are x86-64 code".into());
    }
    let manager = ExecutionManager::new(4);
    let heap = manager.create_heap(HeapConfig {
        span: 1 << 22,
        version: if big { MapVersion::V1 } else { MapVersion::V2 },
        ..HeapConfig::default()
    })?;
    let big = big
        .then(|| -> Result<_, BoxError> {
            let code = big_method();
            let mut r = heap.reserve(code.len() as u64)?;
            r.code_mut().copy_from_slice(&code);
            Ok(r.publish(CodeInfo::new(u64::MAX, "big", JitKind::Optimized))?)
        })
        .transpose()?;
    // SAFETY: the big method jumps to a copy of CODE (see below), and stays
    // published until the end.
    let big: Option<extern "C" fn()> = big.map(|b| unsafe { std::mem::transmute(b.start()) });
    let config = AgentConfig {
        hz,
        clock: Clock::Wall,
        profile_versions,
        ..AgentConfig::default()
    };
    let agent = Agent::start(&manager, config)?;
    let attached = agent.attach_current_thread()?;
    let every = (versions / checkpoints.max(1)).max(1);
    let point = |versions| Point {
        versions,
        malloc: heap_in_use(),
        rss: resident_bytes(),
    };
    let mut points = vec![point(0)];
    let began = Instant::now();
    for v in 0..versions {
        let mut r = heap.reserve(CODE.len() as u64)?;
        r.code_mut().copy_from_slice(&CODE);
        let code = r.publish(CodeInfo::new(v as u64, format!("v{v}"), JitKind::Baseline))?;
        // SAFETY: the published bytes are CODE, a complete function that
        // uses no stack beyond its return address and changes only ecx;
        // it stays published until it returns.
        let f: extern "C" fn() = unsafe { std::mem::transmute(code.start()) };
        f();
        heap.free(code)?;
        if let Some(big) = big {
            big();
        }
        if (v + 1) % every == 0 {
            points.push(point(v + 1));
        }
    }
    let seconds = began.elapsed().as_secs_f64();
    drop(attached);
    let profile = agent.stop();
    // The events still queued are delivered, and freed, before this
    // returns: no work of the run goes on behind its caller's back.
    manager.listeners().flush();
    let merged: Vec<_> = profile.methods.iter().filter(|m| m.merged > 0).collect();
    let named: u64 = profile
        .stacks
        .iter()
        .filter(|s| s.frames.first().is_some_and(|f| is_version(f)))
        .map(|s| s.count)
        .sum();
    Ok(Churn {
        points,
        profile_versions,
        entries: profile.methods.len(),
        merged: (merged.len(), merged.iter().map(|m| m.merged).sum()),
        // Both in samples, one per timer period, as the stacks count.
        samples: (profile.counted(), named),
        taken: (profile.taken, profile.dropped),
        seconds,
    })
}

/// The run as a table: memory at each checkpoint, over the first.
pub fn table(c: &Churn) -> String {
    let first = c.points[0];
    let mut out = format!(
        "{} versions in {:.1} s; profile: {} entries (cap {}), {} merged entries holding {} \
         versions; {} samples, {} in a version\n\
         versions    malloc MiB  over start MiB  RSS MiB  over start MiB\n",
        c.points.last().map_or(0, |p| p.versions),
        c.seconds,
        c.entries,
        c.profile_versions,
        c.merged.0,
        c.merged.1,
        c.samples.0,
        c.samples.1,
    );
    let mib = |b: f64| b / 1048576.0;
    for p in &c.points {
        out += &format!(
            "{:>9}  {:>10.1}  {:>14.2}  {:>7.1}  {:>14.2}\n",
            p.versions,
            mib(p.malloc as f64),
            mib(p.malloc as f64 - first.malloc as f64),
            mib(p.rss as f64),
            mib(p.rss as f64 - first.rss as f64),
        );
    }
    out
}

/// The run as one JSON object.
pub fn json(c: &Churn) -> serde_json::Value {
    serde_json::json!({
        "versions": c.points.last().map_or(0, |p| p.versions),
        "seconds": c.seconds,
        "profile_versions": c.profile_versions,
        "entries": c.entries,
        "merged_entries": c.merged.0,
        "merged_versions": c.merged.1,
        "samples": c.samples.0,
        "samples_in_versions": c.samples.1,
        "points": c.points.iter().map(|p| serde_json::json!({
            "versions": p.versions, "malloc_bytes": p.malloc, "rss_bytes": p.rss,
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 20,000 versions sampled at 10 kHz with 64 named one by one: the
    /// thousand or so versions the samples name end in a few times the cap
    /// of entries and one merged entry for the tier, and every entry, named
    /// or merged, stands for at least one sample.
    #[test]
    fn churned_versions_past_the_cap_merge_into_one_entry() {
        if !cfg!(target_arch = "x86_64") {
            println!("skipped on aarch64: the churned versions are x86-64 code");
            return;
        }
        let _turn = crate::scale::measuring();
        let c = churn(20_000, 4, 10_000, 64, false).unwrap();
        assert_eq!(c.points.len(), 5);
        assert!(c.samples.1 >= 256, "{c:?}");
        // One unit: the samples that named a version are some of all.
        assert!(c.samples.1 <= c.samples.0, "{c:?}");
        assert_eq!(c.merged.0, 1, "{c:?}");
        assert!(c.merged.1 > 0 && c.entries <= 4 * 64, "{c:?}");
        assert!(
            c.entries - 1 + c.merged.1 as usize <= c.samples.1 as usize,
            "{c:?}"
        );
    }
}
