//! The perf map: `perf-<pid>.map`, one `START SIZE name` line (hex) per function,
//! the simplest way to let `perf report` name JIT code.

use std::fs::OpenOptions;
use std::io::{self, IoSlice};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::records::{RecordFile, WriteFailure};
use super::{PerfError, Singleton};
use crate::events::{CodeEvent, CodeListener};

/// The process's perf map writer, while one is open.
static OPEN: Singleton<PerfMap> = Singleton::new();

/// One map line, with newlines and other control characters in the name
/// replaced by spaces (a line per function is the format's only structure).
pub fn map_line(start: usize, size: u64, name: &str) -> String {
    let name: String = name
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    format!("{start:x} {size:x} {name}\n")
}

/// A perf map file for this process.
pub struct PerfMap {
    path: PathBuf,
    file: Mutex<RecordFile>,
    errors: AtomicU64,
}

impl std::fmt::Debug for PerfMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PerfMap")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl PerfMap {
    /// The process's perf map, `dir/perf-<pid>.map`: the one already open there,
    /// or a new (truncated) file. While one is open in another directory this is
    /// [`PerfError::AlreadyOpen`].
    pub fn open(dir: &Path) -> Result<Arc<Self>, PerfError> {
        let path = dir.join(format!("perf-{}.map", std::process::id()));
        OPEN.open(path, Self::path, Self::create)
    }

    fn create(path: &Path) -> io::Result<Self> {
        let path = path.to_path_buf();
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        Ok(Self {
            path,
            file: Mutex::new(RecordFile::new(file, 0)),
            errors: AtomicU64::new(0),
        })
    }

    /// The map's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Lines not written so far (the same count as [`PerfMap::lost`]).
    pub fn errors(&self) -> u64 {
        // Relaxed: a statistic.
        self.errors.load(Ordering::Relaxed)
    }

    /// Lines lost since a write failed: the one whose write failed and every
    /// one after. The map stops at its first failed write, cut back to its
    /// last whole line; [`PerfMap::failure`] says why.
    pub fn lost(&self) -> u64 {
        self.file.lock().lost()
    }

    /// The error of the write that stopped the map, if one failed.
    pub fn failure(&self) -> Option<WriteFailure> {
        self.file.lock().failure().cloned()
    }
}

impl CodeListener for PerfMap {
    fn on_event(&self, event: &CodeEvent) {
        let line = match event {
            CodeEvent::Load(l) => map_line(l.start, l.code.len() as u64, &l.info.name),
            CodeEvent::Move(m) => map_line(m.new_start, m.size, &m.info.name),
            // An image's named methods, one line each, in one write.
            CodeEvent::ImageLoad(l) => l
                .image
                .method_extents()
                .filter(|(m, _, size)| !m.name.is_empty() && *size > 0)
                .map(|(m, start, size)| map_line(start, size, &m.name))
                .collect(),
            _ => return,
        };
        if line.is_empty() {
            return;
        }
        // One write per line, so a reader never sees half a line from us.
        if !self
            .file
            .lock()
            .append(&mut [IoSlice::new(line.as_bytes())])
        {
            // Relaxed: a statistic.
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}
