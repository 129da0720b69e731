//! What a run reports: as text, and as one JSON object with stable keys.

/// What a run did and found.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// The scenario run.
    pub scenario: String,
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
    /// Samples the agent took.
    pub samples: u64,
    /// Signals the agent's handlers ran for.
    pub samples_taken: u64,
    /// Samples lost: a full ring, or a handler that could not pin.
    pub samples_dropped: u64,
    /// JIT frames of samples judged.
    pub frames_checked: u64,
    /// Entry-probe records.
    pub probe_enters: u64,
    /// Call-counter crossings taken by the compiler.
    pub crossings: u64,
    /// Top methods by self samples: name, samples, share.
    pub top: Vec<(String, u64, f64)>,
    /// Wrong results, lookups and samples: must be 0.
    pub wrong: u64,
    /// The first wrong answers, described.
    pub wrong_details: Vec<String>,
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
            "top": self.top.iter().map(|(n, s, share)| serde_json::json!({"name": n, "self_samples": s, "self_share": share})).collect::<Vec<_>>(),
        })
    }

    /// The report as text.
    pub fn text(&self) -> String {
        let mut out = format!(
            "scenario {} for {:.1} s\n\
             compilations: tier 0 {}, tier 1 (tier-ups) {}, de-optimized {}; \
             tier-up latency p50 {:.0} us, p99 {:.0} us\n\
             publishes {}, aborts {}, frees {}, unloads {}\n\
             code bytes live {} (peak {}), fragmentation {:.1}%, map resident {} bytes\n\
             lookups {} ({:.0} per second), results checked {}\n\
             agent: {} samples, {} JIT frames checked, {} probe entries, {} counter crossings\n",
            self.scenario,
            self.seconds,
            self.tier0,
            self.tier_ups,
            self.deopts,
            self.tier_up_p50_us,
            self.tier_up_p99_us,
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
        out.push_str("top methods (self samples):\n");
        for (name, samples, share) in &self.top {
            out.push_str(&format!("  {samples:>7} {:>5.1}%  {name}\n", share * 100.0));
        }
        out.push_str(&format!("wrong answers: {}\n", self.wrong));
        for d in &self.wrong_details {
            out.push_str(&format!("  {d}\n"));
        }
        out
    }
}
