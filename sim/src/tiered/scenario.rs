//! The scenarios, what each one does, and how a run is configured.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use jitmap::MapVersion;

/// The scenarios, by name.
pub const SCENARIOS: [&str; 6] = ["startup", "steady", "large", "unload", "abort", "mixed"];

/// A workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// A burst of thousands of compilations, then tier-ups.
    Startup,
    /// Tier-ups and churn: methods de-optimized and tiered up again.
    Steady,
    /// Methods of 1 MiB and more.
    Large,
    /// Whole heaps created and dropped while readers and the sampler run.
    Unload,
    /// A share of compilations fail and abort.
    Abort,
    /// All of the above.
    Mixed,
}

impl FromStr for Scenario {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "startup" => Self::Startup,
            "steady" => Self::Steady,
            "large" => Self::Large,
            "unload" => Self::Unload,
            "abort" => Self::Abort,
            "mixed" => Self::Mixed,
            _ => {
                return Err(format!(
                    "unknown scenario {s:?}; the scenarios are: {}",
                    SCENARIOS.join(", ")
                ));
            }
        })
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(SCENARIOS[*self as usize])
    }
}

/// What a scenario does.
#[derive(Clone, Copy, Debug)]
pub(super) struct Params {
    /// Methods in the permanent group.
    pub(super) methods: usize,
    /// Large methods (1 MiB and more) in it.
    pub(super) large: usize,
    /// Calls before a tier-up.
    pub(super) threshold: u32,
    /// Percent of compilations that abort.
    pub(super) abort_percent: u64,
    /// De-optimize tier-1 methods back to tier 0.
    pub(super) churn: bool,
    /// Load and unload groups in their own heaps.
    pub(super) unload: bool,
}

impl Scenario {
    pub(super) fn params(self) -> Params {
        let base = Params {
            methods: 256,
            large: 0,
            threshold: 50,
            abort_percent: 0,
            churn: false,
            unload: false,
        };
        match self {
            Self::Startup => Params {
                methods: 4000,
                threshold: 20,
                ..base
            },
            Self::Steady => Params {
                churn: true,
                ..base
            },
            Self::Large => Params { large: 6, ..base },
            Self::Unload => Params {
                unload: true,
                ..base
            },
            Self::Abort => Params {
                abort_percent: 25,
                ..base
            },
            Self::Mixed => Params {
                methods: 1000,
                large: 2,
                threshold: 30,
                abort_percent: 10,
                churn: true,
                unload: true,
            },
        }
    }
}

/// What compiles the methods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// Cranelift through `jitmap-cranelift`: real prologues, spills, unwind
    /// tables and compile times; tier 0 at `opt_level=none`, tier 1 at
    /// `speed`.
    Cranelift,
    /// Hand-assembled with iced-x86 in a few fixed shapes.
    Iced,
}

/// The backends, by name.
pub const BACKENDS: [&str; 2] = ["cranelift", "iced"];

impl FromStr for Backend {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cranelift" => Ok(Self::Cranelift),
            "iced" => Ok(Self::Iced),
            _ => Err(format!(
                "unknown backend {s:?}; the backends are: {}",
                BACKENDS.join(", ")
            )),
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(BACKENDS[*self as usize])
    }
}

/// How to run.
#[derive(Clone, Copy, Debug)]
pub struct RunConfig {
    /// The workload.
    pub scenario: Scenario,
    /// What compiles the methods.
    pub backend: Backend,
    /// How long.
    pub duration: Duration,
    /// Workload seed.
    pub seed: u64,
    /// Nibble-map version of every heap.
    pub version: MapVersion,
    /// How every heap maps its code: RWX, W^X (a write view and an execute
    /// view) or flipped to read-execute on publish.
    pub mode: jitmap::MemoryMode,
    /// Executor threads (1 to 64).
    pub threads: usize,
    /// Agent sampling rate (wall clock).
    pub hz: u32,
    /// Serve the agent's profiles over HTTP on this loopback address
    /// (`/debug/pprof/profile`) while the run lasts.
    pub serve: Option<std::net::SocketAddr>,
    /// After `duration`, go on until every event the scenario makes has
    /// happened (its whole main group compiled, a tier-up, and an abort, an
    /// unload and a de-optimization where the scenario makes them), for at
    /// most [`EVENT_WAIT`] more: what a test asks, so that a loaded machine
    /// makes it slower, not wrong.
    pub until_events: bool,
}

/// The longest a run waits for its events past its duration: a cap for a
/// run that went wrong, not a time a test expects. Startup's 4,000
/// Cranelift methods take about 45 s under qemu-user alone, and 60 s were
/// not enough beside a build at nice 19 (2,929 compiled in CI's aarch64
/// step on 2026-11-28).
pub const EVENT_WAIT: Duration = Duration::from_secs(300);

impl RunConfig {
    /// Checks the numbers.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=64).contains(&self.threads) {
            return Err(format!("--threads must be 1 to 64, not {}", self.threads));
        }
        if self.duration.is_zero() || self.duration > Duration::from_secs(3600) {
            return Err("--seconds must be in (0, 3600]".into());
        }
        Ok(())
    }
}

/// Why a run could not go on (as opposed to a wrong answer, which it reports).
/// Any error converts into it with `?`, keeping its message.
#[derive(Debug)]
pub struct RunError(pub String);

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<E: std::error::Error> From<E> for RunError {
    fn from(e: E) -> Self {
        Self(e.to_string())
    }
}
