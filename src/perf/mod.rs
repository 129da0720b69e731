//! Profiler output: jitdump files and perf maps, fed by code events, enabled by
//! configuration or by `JITMAP_PERF=jitdump|map|both|off` and `JITMAP_PERF_DIR`.

#[cfg(feature = "jitdump-check")]
#[cfg_attr(docsrs, doc(cfg(feature = "jitdump-check")))]
pub mod check;
pub mod jitdump;
pub mod perfmap;
mod records;
mod unwinding_layout;

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use jitdump::JitDump;
pub use perfmap::PerfMap;
pub use records::WriteFailure;

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
#[non_exhaustive]
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

    /// Opens the configured outputs and registers them with `listeners`.
    ///
    /// A process has one jitdump and one perf map (perf finds them by pid): a
    /// second install in the same directory shares the open files, and one in
    /// another directory is [`PerfError::AlreadyOpen`]. Nothing is registered
    /// when an error is returned.
    pub fn install(&self, listeners: &Listeners) -> Result<PerfOutput, PerfError> {
        let jitdump = matches!(self.mode, PerfMode::JitDump | PerfMode::Both)
            .then(|| JitDump::open(&self.dir))
            .transpose()?;
        let perf_map = matches!(self.mode, PerfMode::Map | PerfMode::Both)
            .then(|| PerfMap::open(&self.dir))
            .transpose()?;
        let io = |source| PerfError::Io {
            path: self.dir.clone(),
            source,
        };
        if let Some(j) = &jitdump {
            listeners
                .add(Arc::clone(j) as Arc<dyn CodeListener>)
                .map_err(io)?;
        }
        if let Some(m) = &perf_map {
            listeners
                .add(Arc::clone(m) as Arc<dyn CodeListener>)
                .map_err(io)?;
        }
        Ok(PerfOutput { jitdump, perf_map })
    }
}

/// The outputs [`PerfConfig::install`] registered.
#[derive(Debug, Default)]
pub struct PerfOutput {
    /// The jitdump writer, if enabled.
    pub jitdump: Option<Arc<JitDump>>,
    /// The perf map writer, if enabled.
    pub perf_map: Option<Arc<PerfMap>>,
}

impl PerfOutput {
    /// Turns on the profiler output that `JITMAP_PERF` (`jitdump`, `map`, `both` or
    /// `off`) and `JITMAP_PERF_DIR` (default `/tmp`) ask for, for every heap of
    /// `manager`. A host calls it once, right after creating the manager: the
    /// library reads no environment variable on its own.
    ///
    /// ```
    /// let manager = jitmap::ExecutionManager::new(8);
    /// let output = jitmap::perf::PerfOutput::from_env(&manager)?; // JITMAP_PERF unset: nothing opened
    /// assert!(output.jitdump.is_none() && output.perf_map.is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_env(manager: &crate::ExecutionManager) -> Result<Self, PerfError> {
        PerfConfig::from_env()?.install(manager.listeners())
    }

    /// One line per output that stopped on a failed write, with what it
    /// lost and why: what a tool prints on stderr at its end, so that a
    /// full disk never leaves a profile silently incomplete.
    ///
    /// ```
    /// let output = jitmap::perf::PerfOutput::default();
    /// assert!(output.warnings().is_empty());
    /// ```
    pub fn warnings(&self) -> Vec<String> {
        let jitdump = self.jitdump.as_ref().and_then(|j| {
            let failure = j.failure()?;
            Some(format!(
                "{}: {} code events not written after a write failed: {failure}; the dump ends at its last whole record",
                j.path().display(),
                j.lost()
            ))
        });
        let perf_map = self.perf_map.as_ref().and_then(|m| {
            let failure = m.failure()?;
            Some(format!(
                "{}: {} lines not written after a write failed: {failure}; the map ends at its last whole line",
                m.path().display(),
                m.lost()
            ))
        });
        jitdump.into_iter().chain(perf_map).collect()
    }
}

/// Why profiler output could not be set up.
#[derive(Debug)]
#[non_exhaustive]
pub enum PerfError {
    /// `JITMAP_PERF` holds an unknown mode.
    Config(PerfConfigError),
    /// This process already writes that file in another directory; two writers
    /// would truncate and interleave one `jit-<pid>.dump` or `perf-<pid>.map`.
    AlreadyOpen {
        /// The file already being written.
        existing: PathBuf,
        /// The directory asked for now.
        requested: PathBuf,
    },
    /// Creating or writing the file failed.
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
}

impl fmt::Display for PerfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Config(e) => write!(f, "{e}"),
            Self::AlreadyOpen {
                existing,
                requested,
            } => write!(
                f,
                "{} is already open; this process cannot write another in {}",
                existing.display(),
                requested.display()
            ),
            Self::Io { path, source } => write!(f, "{}: {source}", path.display()),
        }
    }
}

/// Each wrapper shows its inner error's message, so its source is the inner
/// error's own source: a chain printed whole names each cause once.
impl std::error::Error for PerfError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Config(e) => e.source(),
            Self::Io { source, .. } => source.source(),
            Self::AlreadyOpen { .. } => None,
        }
    }
}

impl From<PerfConfigError> for PerfError {
    fn from(e: PerfConfigError) -> Self {
        Self::Config(e)
    }
}

/// A process-wide slot for one output file: the open writer, while anyone holds it.
pub(crate) struct Singleton<T>(parking_lot::Mutex<std::sync::Weak<T>>);

impl<T> Singleton<T> {
    pub(crate) const fn new() -> Self {
        Self(parking_lot::const_mutex(std::sync::Weak::new()))
    }

    /// The open writer if its file is `path`, a new one from `create` if none is
    /// open, or [`PerfError::AlreadyOpen`].
    pub(crate) fn open(
        &self,
        path: PathBuf,
        path_of: impl Fn(&T) -> &Path,
        create: impl FnOnce(&Path) -> io::Result<T>,
    ) -> Result<Arc<T>, PerfError> {
        let mut slot = self.0.lock();
        if let Some(open) = slot.upgrade() {
            let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
                (Ok(a), Ok(b)) => a == b,
                _ => a == b,
            };
            if same(path_of(&open), &path) {
                return Ok(open);
            }
            return Err(PerfError::AlreadyOpen {
                existing: path_of(&open).to_path_buf(),
                requested: path.parent().map(Path::to_path_buf).unwrap_or_default(),
            });
        }
        let created = Arc::new(create(&path).map_err(|source| PerfError::Io {
            path: path.clone(),
            source,
        })?);
        *slot = Arc::downgrade(&created);
        Ok(created)
    }
}
