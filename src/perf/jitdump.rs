//! The jitdump writer: the file `perf inject --jit` turns into symbols for JIT code.
//!
//! Facts checked against Linux perf (they differ from the format's own text):
//! the header's version is 1; a code-load record has no padding (perf takes the
//! code from the record's end); the unwinding data is the `.eh_frame` followed by
//! its `.eh_frame_hdr`; debug and unwinding records apply to the next load.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::{self, IoSlice, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::records::{RecordFile, WriteFailure, without_sigxfsz};
use super::{PerfError, Singleton};
pub use crate::events::current_tid;
use crate::events::{CodeEvent, CodeListener, monotonic_ns};
use crate::info::{DebugEntry, EhFrame};

/// The process's jitdump writer, while one is open.
static OPEN: Singleton<JitDump> = Singleton::new();

/// `"JiTD"` read as a native-endian `u32`.
pub const MAGIC: u32 = 0x4A69_5444;
/// The header version perf accepts.
pub const VERSION: u32 = 1;
/// Size of the file header.
pub const HEADER_SIZE: usize = 40;
/// Size of every record's header.
pub const RECORD_HEADER_SIZE: usize = 16;
/// Record ids.
pub const CODE_LOAD: u32 = 0;
/// A code move.
pub const CODE_MOVE: u32 = 1;
/// Debug info for the next load.
pub const CODE_DEBUG_INFO: u32 = 2;
/// End of the runtime.
pub const CODE_CLOSE: u32 = 3;
/// Unwinding info for the next load.
pub const CODE_UNWINDING_INFO: u32 = 4;
/// Fixed fields of a code-load record after its header.
pub const LOAD_FIXED_SIZE: usize = 40;
/// Size of a code-move record.
pub const MOVE_SIZE: usize = 64;

/// The ELF `e_machine` of the host.
pub const fn elf_machine() -> u32 {
    crate::arch::ELF_MACHINE as u32
}

/// The 40-byte file header.
pub fn encode_header(pid: u32, timestamp: u64) -> [u8; HEADER_SIZE] {
    let mut h = [0u8; HEADER_SIZE];
    h[0..4].copy_from_slice(&MAGIC.to_ne_bytes());
    h[4..8].copy_from_slice(&VERSION.to_ne_bytes());
    h[8..12].copy_from_slice(&(HEADER_SIZE as u32).to_ne_bytes());
    h[12..16].copy_from_slice(&elf_machine().to_ne_bytes());
    h[20..24].copy_from_slice(&pid.to_ne_bytes());
    h[24..32].copy_from_slice(&timestamp.to_ne_bytes());
    h
}

fn record_header(out: &mut Vec<u8>, id: u32, total: usize, timestamp: u64) {
    out.extend_from_slice(&id.to_ne_bytes());
    out.extend_from_slice(&(total as u32).to_ne_bytes());
    out.extend_from_slice(&timestamp.to_ne_bytes());
}

/// A NUL-terminated copy of `s` with interior NULs replaced.
fn c_string(out: &mut Vec<u8>, s: &str) {
    out.extend(s.bytes().map(|b| if b == 0 { b'?' } else { b }));
    out.push(0);
}

/// Everything of a code-load record except the code bytes, which follow it
/// directly (no padding: perf reads the code from the record's end).
#[allow(clippy::too_many_arguments)]
pub fn encode_load_prefix(
    timestamp: u64,
    pid: u32,
    tid: u32,
    addr: u64,
    code_size: u64,
    code_index: u64,
    name: &str,
) -> Vec<u8> {
    let total = RECORD_HEADER_SIZE + LOAD_FIXED_SIZE + name.len() + 1 + code_size as usize;
    let mut out = Vec::with_capacity(total - code_size as usize);
    record_header(&mut out, CODE_LOAD, total, timestamp);
    out.extend_from_slice(&pid.to_ne_bytes());
    out.extend_from_slice(&tid.to_ne_bytes());
    for v in [addr, addr, code_size, code_index] {
        out.extend_from_slice(&v.to_ne_bytes());
    }
    c_string(&mut out, name);
    out
}

/// A code-move record.
pub fn encode_move(
    timestamp: u64,
    pid: u32,
    tid: u32,
    old: u64,
    new: u64,
    size: u64,
    index: u64,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(MOVE_SIZE);
    record_header(&mut out, CODE_MOVE, MOVE_SIZE, timestamp);
    out.extend_from_slice(&pid.to_ne_bytes());
    out.extend_from_slice(&tid.to_ne_bytes());
    for v in [new, old, new, size, index] {
        out.extend_from_slice(&v.to_ne_bytes());
    }
    out
}

/// A debug-info record for code at `start`: one entry per row, with absolute
/// addresses (rows are sorted by offset, so addresses ascend) and the full file
/// name in each entry.
pub fn encode_debug_info(timestamp: u64, start: u64, rows: &[DebugEntry]) -> Vec<u8> {
    let total = RECORD_HEADER_SIZE + 16 + rows.iter().map(|r| 16 + r.file.len() + 1).sum::<usize>();
    let mut out = Vec::with_capacity(total);
    record_header(&mut out, CODE_DEBUG_INFO, total, timestamp);
    out.extend_from_slice(&start.to_ne_bytes());
    out.extend_from_slice(&(rows.len() as u64).to_ne_bytes());
    for r in rows {
        out.extend_from_slice(&(start + u64::from(r.offset)).to_ne_bytes());
        out.extend_from_slice(&r.line.to_ne_bytes());
        out.extend_from_slice(&r.column.to_ne_bytes());
        c_string(&mut out, &r.file);
    }
    out
}

/// An unwinding-info record: `.eh_frame` then `.eh_frame_hdr`, padded to 8 bytes.
/// `mapped_size` is 0: the tables are not mapped next to the code.
pub fn encode_unwinding_info(timestamp: u64, eh: &EhFrame) -> Vec<u8> {
    encode_unwinding(timestamp, eh, 0)
}

/// An unwinding-info record whose tables perf maps `mapped_size` bytes
/// after the code (rounded up to 8).
fn encode_unwinding(timestamp: u64, eh: &EhFrame, mapped_size: u64) -> Vec<u8> {
    let data = eh.frame.len() + eh.header.len();
    let total = (RECORD_HEADER_SIZE + 24 + data).next_multiple_of(8);
    let mut out = Vec::with_capacity(total);
    record_header(&mut out, CODE_UNWINDING_INFO, total, timestamp);
    for v in [data as u64, eh.header.len() as u64, mapped_size] {
        out.extend_from_slice(&v.to_ne_bytes());
    }
    out.extend_from_slice(&eh.frame);
    out.extend_from_slice(&eh.header);
    out.resize(total, 0);
    out
}

/// The unwinding-info record for a method of `code_size` bytes at
/// `code_start` whose host gave `eh`, with `room` free bytes after its code
/// ([`CodeLoad::room`](crate::events::CodeLoad::room)): the tables rewritten where perf's `inject --jit`
/// places them (see [`super::unwinding_layout`]), or the host's own bytes if they
/// cannot be. The second value is true when the tables are mapped.
///
/// perf maps the tables `mapped_size` bytes after the code (from the next
/// multiple of 8), where its unwinder reads them through the method's
/// mapping. They are mapped only when they fit in the room: a mapping that
/// reached the next method's code would take that code's first bytes from
/// it in perf's view, if the next method was published first.
fn unwinding_record(
    timestamp: u64,
    eh: &EhFrame,
    code_start: u64,
    code_size: u64,
    room: u64,
) -> (Vec<u8>, bool) {
    match super::unwinding_layout::perf_layout(eh, code_start, code_size) {
        Some((frame, header)) => {
            let tables = (frame.len() + header.len()) as u64;
            let fits = code_size.next_multiple_of(8) - code_size + tables <= room;
            let record = encode_unwinding(
                timestamp,
                &EhFrame {
                    frame: frame.into(),
                    header: header.into(),
                },
                if fits { tables } else { 0 },
            );
            (record, fits)
        }
        None => (encode_unwinding_info(timestamp, eh), false),
    }
}

/// A close record.
pub fn encode_close(timestamp: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(RECORD_HEADER_SIZE);
    record_header(&mut out, CODE_CLOSE, RECORD_HEADER_SIZE, timestamp);
    out
}

struct State {
    file: RecordFile,
    next_index: u64,
    /// Code index of the code at each start, for move records.
    index_of: HashMap<usize, u64>,
}

/// A jitdump file for this process, registered with perf through an executable
/// mapping of it that lives as long as the writer.
pub struct JitDump {
    path: PathBuf,
    pid: u32,
    state: Mutex<State>,
    errors: AtomicU64,
    /// See [`JitDump::unmapped_tables`].
    unmapped_tables: AtomicU64,
    _marker: memmap2::Mmap,
}

impl std::fmt::Debug for JitDump {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JitDump")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl JitDump {
    /// The process's jitdump writer for `dir/jit-<pid>.dump`: the one already open
    /// there, or a new one (the file is created, its header written, and it is
    /// mapped read+execute so that `perf record` notes it). While a writer is open
    /// in another directory this is [`PerfError::AlreadyOpen`]: two writers would
    /// truncate and interleave one file.
    pub fn open(dir: &Path) -> Result<Arc<Self>, PerfError> {
        let path = dir.join(format!("jit-{}.dump", std::process::id()));
        OPEN.open(path, Self::path, Self::create)
    }

    fn create(path: &Path) -> io::Result<Self> {
        let pid = std::process::id();
        let path = path.to_path_buf();
        // Read-write: perf needs the exec mapping of a file opened for writing.
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        without_sigxfsz(|| file.write_all(&encode_header(pid, monotonic_ns())))?;
        // SAFETY: the mapping is never read or written by this process; it exists
        // only so that perf sees an executable mmap of the dump.
        let marker = unsafe {
            memmap2::MmapOptions::new()
                .len(HEADER_SIZE)
                .map_exec(&file)?
        };
        Ok(Self {
            path,
            pid,
            state: Mutex::new(State {
                file: RecordFile::new(file, HEADER_SIZE as u64),
                next_index: 0,
                index_of: HashMap::new(),
            }),
            errors: AtomicU64::new(0),
            unmapped_tables: AtomicU64::new(0),
            _marker: marker,
        })
    }

    /// The dump's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Events that could not be written (events cannot return errors to
    /// the heap): a move of code the dump has no load of, and every event
    /// [`JitDump::lost`] counts.
    pub fn errors(&self) -> u64 {
        // Relaxed: a statistic.
        self.errors.load(Ordering::Relaxed)
    }

    /// Code events (a load with its debug and unwinding records, or a move)
    /// lost since a write failed: the one whose write failed and every one
    /// after. The dump stops at its first failed write, cut back to its last
    /// whole record, so it stays valid for `perf inject`; see
    /// [`JitDump::failure`] for why.
    ///
    /// ```
    /// let dir = std::env::temp_dir().join(format!("jitmap-lost-doc-{}", std::process::id()));
    /// std::fs::create_dir_all(&dir)?;
    /// let dump = jitmap::perf::JitDump::open(&dir)?;
    /// assert_eq!((dump.lost(), dump.failure()), (0, None));
    /// # drop(dump);
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn lost(&self) -> u64 {
        self.state.lock().file.lost()
    }

    /// The error of the write that stopped the dump, if one failed.
    pub fn failure(&self) -> Option<WriteFailure> {
        self.state.lock().file.failure().cloned()
    }

    /// Methods whose unwinding tables were written but not mapped for perf:
    /// they did not fit in the room after the code
    /// ([`HeapConfig::unwind_room`](crate::HeapConfig::unwind_room)), or
    /// could not be rewritten into perf's layout. perf's DWARF unwinder stops
    /// at these methods' frames.
    pub fn unmapped_tables(&self) -> u64 {
        // Relaxed: a statistic.
        self.unmapped_tables.load(Ordering::Relaxed)
    }

    /// Appends one event's records, whole or not at all.
    fn append(s: &mut State, bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
        if s.file.append(bufs) {
            Ok(())
        } else {
            Err(io::Error::other("not written"))
        }
    }

    fn write_event(&self, event: &CodeEvent) -> io::Result<()> {
        let mut s = self.state.lock();
        match event {
            CodeEvent::Load(load) => {
                let index = s.next_index;
                s.next_index += 1;
                s.index_of.insert(load.start, index);
                let start = load.start as u64;
                let debug = (!load.info.debug.is_empty())
                    .then(|| encode_debug_info(load.timestamp, start, &load.info.debug));
                let unwind = load.info.eh_frame.as_ref().map(|eh| {
                    let (record, mapped) = unwinding_record(
                        load.timestamp,
                        eh,
                        start,
                        load.code.len() as u64,
                        load.room,
                    );
                    if !mapped {
                        // Relaxed: a statistic.
                        self.unmapped_tables.fetch_add(1, Ordering::Relaxed);
                    }
                    record
                });
                let prefix = encode_load_prefix(
                    load.timestamp,
                    self.pid,
                    load.tid,
                    start,
                    load.code.len() as u64,
                    index,
                    &load.info.name,
                );
                let mut bufs: Vec<IoSlice<'_>> = debug
                    .iter()
                    .chain(unwind.iter())
                    .map(|b| IoSlice::new(b))
                    .collect();
                bufs.push(IoSlice::new(&prefix));
                bufs.push(IoSlice::new(&load.code));
                Self::append(&mut s, &mut bufs)
            }
            CodeEvent::Move(mv) => {
                let Some(index) = s.index_of.remove(&mv.old_start) else {
                    return Err(io::Error::other("move of code with no load record"));
                };
                s.index_of.insert(mv.new_start, index);
                let record = encode_move(
                    mv.timestamp,
                    self.pid,
                    mv.tid,
                    mv.old_start as u64,
                    mv.new_start as u64,
                    mv.size,
                    index,
                );
                Self::append(&mut s, &mut [IoSlice::new(&record)])
            }
            CodeEvent::Free(free) => {
                s.index_of.remove(&free.start);
                Ok(())
            }
            // An image's code is the host's own mapping, not bytes jitmap
            // copied: the perf map names its methods instead.
            _ => Ok(()),
        }
    }
}

impl CodeListener for JitDump {
    fn on_event(&self, event: &CodeEvent) {
        if self.write_event(event).is_err() {
            // Relaxed: a statistic.
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Drop for JitDump {
    fn drop(&mut self) {
        let record = encode_close(monotonic_ns());
        // A close record is optional (the end of the file means the same), and a
        // destructor has no one to report a failure to; a failed one is cut
        // back like any record.
        self.state
            .get_mut()
            .file
            .append(&mut [IoSlice::new(&record)]);
    }
}
