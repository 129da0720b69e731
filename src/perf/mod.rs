//! Profiler output: jitdump files and perf maps, fed by code events, enabled by
//! configuration or by `JITMAP_PERF=jitdump|map|both|off` and `JITMAP_PERF_DIR`.

pub mod check;
pub mod jitdump;
pub mod perfmap;

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

pub use jitdump::JitDump;
pub use perfmap::PerfMap;

use crate::events::{CodeListener, Listeners};

/// Which outputs to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PerfMode {
    /// Nothing.
    Off,
    /// `jit-<pid>.dump` only.
    JitDump,
    /// `perf-<pid>.map` only.
    Map,
    /// Both.
    Both,
}

impl std::str::FromStr for PerfMode {
    type Err = PerfConfigError;

    fn from_str(s: &str) -> Result<Self, PerfConfigError> {
        match s {
            "off" | "" => Ok(Self::Off),
            "jitdump" => Ok(Self::JitDump),
            "map" => Ok(Self::Map),
            "both" => Ok(Self::Both),
            other => Err(PerfConfigError::UnknownMode(other.to_owned())),
        }
    }
}

/// A bad `JITMAP_PERF` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PerfConfigError {
    /// Not one of `jitdump`, `map`, `both`, `off`.
    UnknownMode(String),
}

impl fmt::Display for PerfConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownMode(m) => {
                write!(f, "JITMAP_PERF={m:?}: expected jitdump, map, both or off")
            }
        }
    }
}

impl std::error::Error for PerfConfigError {}

/// What to write, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PerfConfig {
    /// Which outputs.
    pub mode: PerfMode,
    /// Directory for both files (default `/tmp`, where perf looks for maps).
    pub dir: PathBuf,
}

impl Default for PerfConfig {
    fn default() -> Self {
        Self {
            mode: PerfMode::Off,
            dir: PathBuf::from("/tmp"),
        }
    }
}

impl PerfConfig {
    /// Reads `JITMAP_PERF` (default off) and `JITMAP_PERF_DIR` (default `/tmp`).
    pub fn from_env() -> Result<Self, PerfConfigError> {
        let mode = std::env::var("JITMAP_PERF").unwrap_or_default().parse()?;
        let dir = std::env::var_os("JITMAP_PERF_DIR")
            .map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
        Ok(Self { mode, dir })
    }

    /// Creates the configured outputs and registers them with `listeners`.
    pub fn install(&self, listeners: &Listeners) -> io::Result<PerfOutput> {
        let jitdump = matches!(self.mode, PerfMode::JitDump | PerfMode::Both)
            .then(|| JitDump::create(&self.dir).map(Arc::new))
            .transpose()?;
        let perf_map = matches!(self.mode, PerfMode::Map | PerfMode::Both)
            .then(|| PerfMap::create(&self.dir).map(Arc::new))
            .transpose()?;
        if let Some(j) = &jitdump {
            listeners.add(Arc::clone(j) as Arc<dyn CodeListener>);
        }
        if let Some(m) = &perf_map {
            listeners.add(Arc::clone(m) as Arc<dyn CodeListener>);
        }
        Ok(PerfOutput { jitdump, perf_map })
    }
}

/// The outputs [`PerfConfig::install`] created.
#[derive(Debug, Default)]
pub struct PerfOutput {
    /// The jitdump writer, if enabled.
    pub jitdump: Option<Arc<JitDump>>,
    /// The perf map writer, if enabled.
    pub perf_map: Option<Arc<PerfMap>>,
}
