//! What a run reports: as text, and as one JSON object with stable keys.

use std::time::Duration;

/// One tier's compilations that were published.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TierCompile {
    /// Compilations published at the tier.
    pub compilations: u64,
    /// Compile time, median, µs: building the code (IR and Cranelift's
    /// compile, or iced's two assemblies), not its publish.
    pub p50_us: f64,
    /// The same, 99th percentile.
    pub p99_us: f64,
    /// Mean code bytes per compiled method.
    pub bytes_per_method: f64,
}

impl TierCompile {
    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "compilations": self.compilations,
            "p50_us": self.p50_us,
            "p99_us": self.p99_us,
            "bytes_per_method": self.bytes_per_method,
        })
    }
}

/// Durations in ns, kept as a histogram (3 significant digits, from 1 ns to
/// an hour): memory stays bounded however long a run lasts.
#[derive(Clone, Debug)]
pub struct Durations(hdrhistogram::Histogram<u64>);

/// The longest duration kept as itself; longer ones count as this.
const LONGEST_NS: u64 = 3_600_000_000_000;

impl Default for Durations {
    fn default() -> Self {
        // Bounds, not an auto-resizing histogram: `saturating_record` clamps
        // to the histogram's range without growing it, which would count
        // every duration as 2 ns.
        Self(
            hdrhistogram::Histogram::new_with_bounds(1, LONGEST_NS, 3)
                .expect("1 ns to an hour at 3 significant digits is valid"),
        )
    }
}

impl Durations {
    /// Records one duration.
    pub fn record(&mut self, ns: u64) {
        self.0.saturating_record(ns);
    }

    /// Durations recorded.
    pub fn len(&self) -> u64 {
        self.0.len()
    }

    /// The `q` quantile (0 to 1), µs; 0 with none recorded.
    pub fn quantile_us(&self, q: f64) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        self.0.value_at_quantile(q) as f64 / 1000.0
    }
}

/// One tier's compilations as they happen: their times and code bytes.
#[derive(Clone, Debug, Default)]
pub struct Compiles {
    times: Durations,
    bytes: u64,
}

impl Compiles {
    /// Records a compilation of `ns` that made `bytes` of code.
    pub fn record(&mut self, ns: u64, bytes: u64) {
        self.times.record(ns);
        self.bytes += bytes;
    }

    /// Their statistics.
    pub fn summary(&self) -> TierCompile {
        let n = self.times.len();
        TierCompile {
            compilations: n,
            p50_us: self.times.quantile_us(0.5),
            p99_us: self.times.quantile_us(0.99),
            bytes_per_method: self.bytes as f64 / n.max(1) as f64,
        }
    }
}

/// What the run's progress callback is told, about ten times a second.
#[derive(Clone, Copy, Debug, Default)]
pub struct Progress {
    /// The elapsed share of the run's duration, 0 to 1.
    pub fraction: f64,
    /// Time since the run started.
    pub elapsed: Duration,
    /// Methods published so far.
    pub publishes: u64,
    /// Tier-ups so far.
    pub tier_ups: u64,
    /// Lookups judged so far.
    pub lookups: u64,
    /// Wrong answers so far.
    pub wrong: u64,
}

/// The run's memory and progress at one moment (the report's timeline: one
/// point a minute and one at the end), to see that a long run stays flat.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TimelinePoint {
    /// Seconds since the run started.
    pub seconds: f64,
    /// The process's resident set, bytes.
    pub rss_bytes: u64,
    /// Code bytes committed in every live heap.
    pub code_committed_bytes: u64,
    /// Versions the shadow model holds (live, and freed in the last 30 s).
    pub shadow_versions: u64,
    /// Lookups judged so far.
    pub lookups: u64,
    /// Wrong answers so far.
    pub wrong: u64,
}

impl TimelinePoint {
    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "seconds": self.seconds,
            "rss_bytes": self.rss_bytes,
            "code_committed_bytes": self.code_committed_bytes,
            "shadow_versions": self.shadow_versions,
            "lookups": self.lookups,
            "wrong": self.wrong,
        })
    }
}

/// What a run did and found.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// The scenario run.
    pub scenario: String,
    /// The backend that compiled the methods.
    pub backend: String,
    /// Seconds run.
    pub seconds: f64,
    /// Tier-0 compilations published.
    pub tier0: u64,
    /// Tier-1 compilations published (tier-ups).
    pub tier_ups: u64,
    /// Tier-1 methods sent back to tier 0.
    pub deopts: u64,
    /// Tier-up latency from the crossing seen to the cell swapped, µs.
    pub tier_up_p50_us: f64,
    /// The same, 99th percentile.
    pub tier_up_p99_us: f64,
    /// Tier 0's and tier 1's compilations: how long, how large.
    pub compile: [TierCompile; 2],
    /// Blocks published.
    pub publishes: u64,
    /// Compilations aborted.
    pub aborts: u64,
    /// Blocks freed (one at a time).
    pub frees: u64,
    /// Heaps dropped with their code.
    pub unloads: u64,
    /// Code bytes live at the end.
    pub live_bytes: u64,
    /// Code bytes live at the peak.
    pub peak_bytes: u64,
    /// 1 − largest free range / free bytes, in the permanent heap at the end.
    pub fragmentation: f64,
    /// Resident bytes of every live heap's nibble map at the end.
    pub map_resident_bytes: u64,
    /// Lookups the readers made (each judged).
    pub lookups: u64,
    /// Method results checked.
    pub results_checked: u64,
    /// The agent's samples: one per timer period (a signal whose timer
    /// overran stands for several), what the shares below count.
    pub samples: u64,
    /// Signals the agent's handlers ran for.
    pub signals_taken: u64,
    /// Of those, the signals whose samples were lost: a full ring, or a
    /// handler that could not pin.
    pub signals_dropped: u64,
    /// JIT frames of samples judged.
    pub frames_checked: u64,
    /// Entry-probe records.
    pub probe_enters: u64,
    /// Call-counter crossings taken by the compiler.
    pub crossings: u64,
    /// The samples' share whose innermost frame is a JIT method.
    pub jit_share: f64,
    /// Top JIT methods by self samples: name, samples, share.
    pub top: Vec<(String, u64, f64)>,
    /// The rest, the frames that are not JIT methods (the simulator's own
    /// threads, the runtime, waits), top three by self samples.
    pub top_other: Vec<(String, u64, f64)>,
    /// Wrong results, lookups and samples: must be 0.
    pub wrong: u64,
    /// The first wrong answers, described.
    pub wrong_details: Vec<String>,
    /// Memory and progress once a minute, and at the end.
    pub timeline: Vec<TimelinePoint>,
}

impl Report {
    /// Lookups per second.
    pub fn lookups_per_second(&self) -> f64 {
        self.lookups as f64 / self.seconds.max(1e-9)
    }

    /// The report as one JSON object with stable keys.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "scenario": self.scenario,
            "backend": self.backend,
            "seconds": self.seconds,
            "wrong": self.wrong,
            "wrong_details": self.wrong_details,
            "results_checked": self.results_checked,
            "lookups": self.lookups,
            "lookups_per_second": self.lookups_per_second(),
            "samples": self.samples,
            "frames_checked": self.frames_checked,
            "tier0": self.tier0,
            "tier_ups": self.tier_ups,
            "deopts": self.deopts,
            "tier_up_p50_us": self.tier_up_p50_us,
            "tier_up_p99_us": self.tier_up_p99_us,
            "compile": {"tier0": self.compile[0].json(), "tier1": self.compile[1].json()},
            "publishes": self.publishes,
            "aborts": self.aborts,
            "frees": self.frees,
            "unloads": self.unloads,
            "live_bytes": self.live_bytes,
            "peak_bytes": self.peak_bytes,
            "fragmentation": self.fragmentation,
            "map_resident_bytes": self.map_resident_bytes,
            "probe_enters": self.probe_enters,
            "crossings": self.crossings,
            "timeline": self.timeline.iter().map(TimelinePoint::json).collect::<Vec<_>>(),
            "jit_share": self.jit_share,
            "top": self.top.iter().map(|(n, s, share)| serde_json::json!({"name": n, "self_samples": s, "self_share": share})).collect::<Vec<_>>(),
            "top_other": self.top_other.iter().map(|(n, s, share)| serde_json::json!({"name": n, "self_samples": s, "self_share": share})).collect::<Vec<_>>(),
        })
    }

    /// The report as text.
    pub fn text(&self) -> String {
        let mut out = format!(
            "scenario {} on {} for {:.1} s\n\
             compilations: tier 0 {}, tier 1 (tier-ups) {}, de-optimized {}; \
             tier-up latency p50 {:.0} us, p99 {:.0} us\n\
             compile time: tier 0 p50 {:.0} us, p99 {:.0} us, {:.0} bytes per method; \
             tier 1 p50 {:.0} us, p99 {:.0} us, {:.0} bytes per method\n\
             publishes {}, aborts {}, frees {}, unloads {}\n\
             code bytes live {} (peak {}), fragmentation {:.1}%, map resident {} bytes\n\
             lookups {} ({:.0} per second), results checked {}\n\
             agent: {} samples, {} JIT frames checked, {} probe entries, {} counter crossings\n",
            self.scenario,
            self.backend,
            self.seconds,
            self.tier0,
            self.tier_ups,
            self.deopts,
            self.tier_up_p50_us,
            self.tier_up_p99_us,
            self.compile[0].p50_us,
            self.compile[0].p99_us,
            self.compile[0].bytes_per_method,
            self.compile[1].p50_us,
            self.compile[1].p99_us,
            self.compile[1].bytes_per_method,
            self.publishes,
            self.aborts,
            self.frees,
            self.unloads,
            self.live_bytes,
            self.peak_bytes,
            self.fragmentation * 100.0,
            self.map_resident_bytes,
            self.lookups,
            self.lookups_per_second(),
            self.results_checked,
            self.samples,
            self.frames_checked,
            self.probe_enters,
            self.crossings,
        );
        out.push_str(&format!(
            "where the samples are: {:.1}% in JIT methods, {:.1}% in other code\n",
            self.jit_share * 100.0,
            (1.0 - self.jit_share) * 100.0
        ));
        let rows = |out: &mut String, title: &str, rows: &[(String, u64, f64)]| {
            out.push_str(title);
            for (name, samples, share) in rows {
                out.push_str(&format!("  {samples:>7} {:>5.1}%  {name}\n", share * 100.0));
            }
        };
        rows(&mut out, "top JIT methods (self samples):\n", &self.top);
        rows(
            &mut out,
            "other code, led by (self samples; the simulator's own threads and waits):\n",
            &self.top_other,
        );
        out.push_str(&format!("wrong answers: {}\n", self.wrong));
        for d in &self.wrong_details {
            out.push_str(&format!("  {d}\n"));
        }
        out.push_str(&self.verdict());
        out.push('\n');
        out
    }

    /// The last line: PASS, or FAIL with the reason.
    pub fn verdict(&self) -> String {
        if self.wrong == 0 {
            format!(
                "PASS: no wrong answer in {} results, {} lookups and {} sampled JIT frames checked",
                self.results_checked, self.lookups, self.frames_checked
            )
        } else {
            format!(
                "FAIL: {} wrong answers (the first are listed above)",
                self.wrong
            )
        }
    }
}

#[cfg(test)]
mod durations_tests {
    use super::Durations;

    #[test]
    fn quantiles_keep_their_durations_from_a_microsecond_to_minutes() {
        // `scale`'s test reads the process's allocator figures: this crate's
        // unit tests take turns.
        let _turn = crate::scale::measuring();
        let mut d = Durations::default();
        for ns in [1_000, 311_000, 4_400_000, 120_000_000_000] {
            d.record(ns);
        }
        let near = |got: f64, want: f64| (got - want).abs() <= want * 0.001;
        assert!(near(d.quantile_us(0.25), 1.0), "{}", d.quantile_us(0.25));
        assert!(near(d.quantile_us(0.5), 311.0), "{}", d.quantile_us(0.5));
        assert!(
            near(d.quantile_us(0.75), 4_400.0),
            "{}",
            d.quantile_us(0.75)
        );
        assert!(
            near(d.quantile_us(1.0), 120_000_000.0),
            "{}",
            d.quantile_us(1.0)
        );
        assert_eq!(d.len(), 4);
    }
}
