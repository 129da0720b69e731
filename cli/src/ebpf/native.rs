//! Native objects' unwind rows, for the kernel's walk of code built without
//! frame pointers.
//!
//! For every executable mapping of the target (`/proc/PID/maps`), the mapped
//! file is opened through `/proc/PID/map_files` (the very file mapped, even
//! if deleted or replaced since; the vDSO is read from the target's memory),
//! its `.eh_frame` evaluated into rows by [`jitmap::unwind::object_rows`], the
//! evaluation the agent's collector and the heap use, and the rows written
//! into the program's maps:
//!
//! - `NATIVE_ROWS`: one pool of rows; each object's rows, sorted by address
//!   in the object, fill one slice of it.
//! - `NATIVE_RANGES`: the mappings, sorted by start: each with the object's
//!   load bias, its slice, and 16 bytes the object holds at a known address
//!   (its build id).
//! - `NATIVE_STATE`: a sequence, odd while the tables are rewritten, and the
//!   number of ranges.
//!
//! All three are `BPF_F_MMAPABLE` arrays written through a shared mapping, so
//! loading a large object's rows is a copy, not a system call per row.
//!
//! **Staleness.** The tables follow the target's mappings on every
//! [`NativeTables::refresh`] (the profile loop calls it every 100 ms, when
//! `/proc/PID/maps` changed). Between a `dlclose` and the next refresh,
//! another object may be mapped where an unloaded one was. The kernel reads
//! each range's check bytes from the target before it uses the range's rows
//! (once per range per sample): if they differ, another object is mapped
//! there, and the walk ends at that frame, counted (`native_stale`), never
//! stepped by another object's rows. A sample whose rows were rewritten
//! while it used them is dropped as stale (`native_busy`).
//!
//! **Memory.** Rows take 16 bytes each; the pool has a cap (`--native-rows`),
//! set at load. An object whose rows do not fit, or whose mapping comes past
//! the kernel's [`MAX_RANGES`] ranges, is left out (its frames step by the
//! frame pointer) and named in the report, with why. Objects are evaluated
//! once per content, keyed by the mapped file's identity, size and change
//! times (a library rewritten in place at the same path and inode is
//! evaluated afresh); the evaluations of objects no longer mapped are kept
//! for the [`KEPT_UNMAPPED`] most recently unmapped, so that a library loaded
//! and unloaded in a loop is not read again each time, and a target that
//! loads a stream of new objects does not grow the profiler.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::os::fd::{AsFd, AsRawFd};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering, fence};
use std::time::{Duration, Instant};

use aya::maps::{Map, MapData};
use jitmap::remote::process::{Mapping, parse_executable_maps};
use jitmap::unwind::{UnwindRow, object_rows};
use object::read::elf::{ElfFile64, ProgramHeader};
use object::{Object, ObjectSection};

use super::EbpfError;

/// Ranges the kernel searches at most (`MAX_RANGES`).
pub const MAX_RANGES: usize = 1024;
/// Rows of one object the kernel searches at most (`MAX_OBJECT_ROWS`).
pub const MAX_OBJECT_ROWS: usize = 1 << 22;
/// The rows' cap when none is given: 2^21 rows, 32 MiB.
pub const DEFAULT_ROWS_CAP: u32 = 1 << 21;
/// Bytes of `struct native_range`.
const RANGE_BYTES: usize = 56;
/// Bytes of a row.
const ROW_BYTES: usize = std::mem::size_of::<UnwindRow>();
/// Bytes an object is checked by (`CHECK_BYTES`).
const CHECK_BYTES: usize = 16;
/// Evaluated objects kept after they are unmapped, most recently unmapped
/// first.
pub const KEPT_UNMAPPED: usize = 64;
/// Objects unmapped at recent refreshes whose rows stay in the kernel's
/// tables as candidates, most recently unmapped first.
pub const KEPT_CANDIDATES: usize = 16;

/// An object's rows and what identifies it in memory.
#[derive(Debug)]
struct Evaluated {
    rows: Box<[UnwindRow]>,
    /// Where the check bytes are, in the object's addresses.
    check_vaddr: u64,
    check: [u8; CHECK_BYTES],
    /// The executable segments: (file offset, virtual address, file size).
    segments: Vec<(u64, u64, u64)>,
}

/// The name CoreCLR gives the memory file its JIT code is double-mapped
/// from (as `/proc/PID/maps` shows it).
const DOUBLE_MAPPED: &str = "/memfd:doublemapper";

/// Why an object has no rows in the tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeftOut {
    /// It could not be read or parsed as a 64-bit ELF object.
    Unreadable,
    /// It is a file but no ELF object (a .NET assembly's PE file, whose
    /// ReadyToRun code CoreCLR's range map resolves).
    NotElf,
    /// CoreCLR's JIT code under its default W^X: executable views of a
    /// `memfd:doublemapper` file, which CoreCLR's range map resolves and
    /// whose frames step by the frame pointer.
    RuntimeCode,
    /// It has no `.eh_frame`, an `.eh_frame` without a single FDE (no row),
    /// or no build id or `.eh_frame_hdr` to check it by.
    NoTable,
    /// Its rows are past 4 GiB or more than the kernel searches.
    TooLarge,
    /// Its rows did not fit under the cap.
    Cap,
    /// Its mapping came past the [`MAX_RANGES`] ranges the kernel searches.
    RangeCap,
}

impl Evaluated {
    /// Evaluates an ELF object's `.eh_frame` and finds its check bytes: the
    /// build id's first 16 bytes, else its `.eh_frame_hdr`'s first 16.
    fn of(data: &[u8]) -> Result<Self, LeftOut> {
        if !data.starts_with(b"\x7fELF") {
            return Err(LeftOut::NotElf);
        }
        let elf =
            ElfFile64::<object::LittleEndian>::parse(data).map_err(|_| LeftOut::Unreadable)?;
        let frame = elf.section_by_name(".eh_frame").ok_or(LeftOut::NoTable)?;
        let bytes = frame.data().map_err(|_| LeftOut::Unreadable)?;
        let rows = object_rows(bytes, frame.address()).ok_or(LeftOut::TooLarge)?;
        if rows.is_empty() {
            // A CIE and no FDE: nothing to walk by, and an empty slice
            // would share its first row with another object's.
            return Err(LeftOut::NoTable);
        }
        if rows.len() > MAX_OBJECT_ROWS {
            return Err(LeftOut::TooLarge);
        }
        let (check_vaddr, check) = check_bytes(&elf).ok_or(LeftOut::NoTable)?;
        let endian = elf.endian();
        let segments = elf
            .elf_program_headers()
            .iter()
            .filter(|p| p.p_type(endian) == object::elf::PT_LOAD)
            .filter(|p| p.p_flags(endian) & object::elf::PF_X != 0)
            .map(|p| (p.p_offset(endian), p.p_vaddr(endian), p.p_filesz(endian)))
            .collect();
        Ok(Self {
            rows,
            check_vaddr,
            check,
            segments,
        })
    }

    /// The load bias of `m`, a mapping of this object: where the object's
    /// address 0 is. `None` if no executable segment holds the mapping.
    fn bias(&self, m: &Mapping) -> Option<u64> {
        let len = m.end.saturating_sub(m.start);
        self.segments
            .iter()
            .find(|&&(off, _, size)| {
                off < m.offset.saturating_add(len) && m.offset < off.saturating_add(size.max(1))
            })
            .map(|&(off, vaddr, _)| {
                // The mapping's first byte is file offset m.offset, which is
                // at vaddr + (m.offset - off) in the object.
                m.start
                    .wrapping_sub(m.offset)
                    .wrapping_add(off)
                    .wrapping_sub(vaddr)
            })
    }
}

/// The 16 bytes an object is recognized by in memory, and where.
fn check_bytes(elf: &ElfFile64<'_, object::LittleEndian>) -> Option<(u64, [u8; CHECK_BYTES])> {
    // A GNU build-id note: namesz, descsz, type (4 bytes each), "GNU\0",
    // then the id.
    if let Some(note) = elf.section_by_name(".note.gnu.build-id") {
        let data = note.data().ok()?;
        if data.len() >= 16 + CHECK_BYTES && &data[12..16] == b"GNU\0" {
            let check = data[16..16 + CHECK_BYTES].try_into().ok()?;
            return Some((note.address() + 16, check));
        }
    }
    let hdr = elf.section_by_name(".eh_frame_hdr")?;
    let data = hdr.data().ok()?;
    Some((hdr.address(), data.get(..CHECK_BYTES)?.try_into().ok()?))
}

/// `struct native_range`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Range {
    start: u64,
    end: u64,
    bias: u64,
    check_addr: u64,
    first: u32,
    count: u32,
    check: [u8; CHECK_BYTES],
}

impl Range {
    fn bytes(&self) -> [u8; RANGE_BYTES] {
        let mut out = [0u8; RANGE_BYTES];
        out[0..8].copy_from_slice(&self.start.to_le_bytes());
        out[8..16].copy_from_slice(&self.end.to_le_bytes());
        out[16..24].copy_from_slice(&self.bias.to_le_bytes());
        out[24..32].copy_from_slice(&self.check_addr.to_le_bytes());
        out[32..36].copy_from_slice(&self.first.to_le_bytes());
        out[36..40].copy_from_slice(&self.count.to_le_bytes());
        out[40..56].copy_from_slice(&self.check);
        out
    }
}

/// Slices of the row pool, first fit.
#[derive(Debug, Default)]
struct Pool {
    cap: u32,
    /// Slices in use: first row to count.
    used: BTreeMap<u32, u32>,
}

impl Pool {
    /// A free slice of `count` rows, taken; `None` if none is left, or for
    /// an empty slice, which would start where another does.
    fn take(&mut self, count: u32) -> Option<u32> {
        if count == 0 {
            return None;
        }
        let mut at = 0u32;
        for (&first, &n) in &self.used {
            if first - at >= count {
                break;
            }
            at = first + n;
        }
        if self.cap - at < count {
            return None;
        }
        self.used.insert(at, count);
        Some(at)
    }

    fn give_back(&mut self, first: u32) {
        self.used.remove(&first);
    }

    fn rows(&self) -> u64 {
        self.used.values().map(|&n| u64::from(n)).sum()
    }
}

/// A `BPF_F_MMAPABLE` array map, mapped into this process (or, in the unit
/// tests, anonymous memory of the same size).
struct Shared {
    ptr: NonNull<u8>,
    len: usize,
    _map: Option<MapData>,
}

impl Shared {
    /// Maps the array's `bytes` bytes (its entries times their size).
    fn map(map: MapData, bytes: usize) -> Result<Self, EbpfError> {
        let fd = map.fd().as_fd().as_raw_fd();
        Self::mapped(Some(map), fd, bytes)
    }

    /// `bytes` of anonymous shared memory, standing in for a map.
    #[cfg(test)]
    fn anonymous(bytes: usize) -> Result<Self, EbpfError> {
        Self::mapped(None, -1, bytes)
    }

    /// A shared mapping of `fd` (-1: anonymous), kept with its map.
    fn mapped(map: Option<MapData>, fd: i32, bytes: usize) -> Result<Self, EbpfError> {
        let len = bytes.next_multiple_of(4096);
        let anonymous = if fd < 0 { libc::MAP_ANONYMOUS } else { 0 };
        // SAFETY: a fresh shared mapping, of the map's descriptor (which the
        // kernel allows for an mmapable array up to its size) or anonymous;
        // the result is checked before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | anonymous,
                fd,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(EbpfError::Bpf(format!(
                "mapping a native-rows map: {}",
                std::io::Error::last_os_error()
            )));
        }
        let ptr = NonNull::new(ptr.cast()).ok_or(EbpfError::Bpf("mmap gave null".into()))?;
        Ok(Self {
            ptr,
            len,
            _map: map,
        })
    }

    /// Copies `bytes` to `offset`, inside the mapping.
    fn write(&self, offset: usize, bytes: &[u8]) {
        assert!(
            offset + bytes.len() <= self.len,
            "a write past a native map"
        );
        // SAFETY: in bounds (checked above) of a live, writable mapping that
        // no Rust reference covers; the only other reader is the BPF
        // program, which discards what it read while the tables' sequence
        // was odd or changed.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.ptr.as_ptr().add(offset),
                bytes.len(),
            )
        };
    }

    /// `len` bytes at `offset`, copied out (the tests read the tables back).
    #[cfg(test)]
    fn read(&self, offset: usize, len: usize) -> Vec<u8> {
        assert!(offset + len <= self.len, "a read past a native map");
        // SAFETY: in bounds (checked above) of a live mapping; in the tests
        // nothing else writes it meanwhile.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(offset), len) }.to_vec()
    }

    /// The u64 at `offset` (8-aligned), as an atomic.
    fn word(&self, offset: usize) -> &AtomicU64 {
        assert!(offset.is_multiple_of(8) && offset + 8 <= self.len);
        // SAFETY: aligned (the mapping is page-aligned), in bounds, and
        // live as long as `self`; only accessed atomically from this side.
        unsafe { &*self.ptr.as_ptr().add(offset).cast::<AtomicU64>() }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

// SAFETY: the mapping is plain memory owned by this value; every write goes
// through `&self` methods used from one thread at a time (`NativeTables` is
// not `Sync`).
unsafe impl Send for Shared {}

/// What the tables hold, for the report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NativeStats {
    /// Ranges the kernel searches: the executable mappings, and the
    /// candidates' (see [`NativeStats::candidates`]).
    pub ranges: usize,
    /// The pool's cap, in rows.
    pub cap: u32,
    /// Each loaded object's path and rows (16 bytes each), most first.
    pub per_object: Vec<(String, u64)>,
    /// Objects left out, with why.
    pub left_out: Vec<(String, LeftOut)>,
    /// Objects unmapped since an earlier refresh whose rows the kernel
    /// still tries, where a mapping's check bytes do not match: at most
    /// [`KEPT_CANDIDATES`].
    pub candidates: usize,
    /// Their rows.
    pub candidate_rows: u64,
    /// Times the tables were rewritten after the first load.
    pub refreshes: u64,
    /// How long the first load took.
    pub load_time: Duration,
}

impl NativeStats {
    /// Objects whose rows are loaded.
    pub fn objects(&self) -> usize {
        self.per_object.len()
    }

    /// Rows loaded.
    pub fn rows(&self) -> u64 {
        self.per_object.iter().map(|(_, n)| n).sum()
    }

    /// Bytes of rows loaded.
    pub fn bytes(&self) -> u64 {
        self.rows() * ROW_BYTES as u64
    }
}

/// One loaded object: its rows' slice, shared by its mappings.
#[derive(Debug)]
struct Loaded {
    evaluated: Arc<Evaluated>,
    first: u32,
}

/// A mapped file: its (device, inode), path, and what tells two contents
/// of one inode apart (size, modification and change times in ns).
type FileKey = ((u64, u64), String, (u64, i128, i128));

/// A loaded object: its file and load bias.
type ObjectKey = (FileKey, u64);

/// An evaluation kept for reuse, with the refresh that last saw it mapped.
struct Cached {
    evaluated: Result<Arc<Evaluated>, LeftOut>,
    seen: u64,
}

/// The program's native tables for one target.
pub struct NativeTables {
    pid: i32,
    state: Shared,
    ranges: Shared,
    rows: Shared,
    pool: Pool,
    /// The objects loaded, by file and bias.
    loaded: HashMap<ObjectKey, Loaded>,
    /// Objects evaluated before, by file, kept to reload without
    /// evaluating again (a library loaded and unloaded in a loop): those
    /// mapped now, and the [`KEPT_UNMAPPED`] most recently unmapped.
    evaluated: HashMap<FileKey, Cached>,
    /// The ranges of the loaded objects as last published.
    published: Vec<(ObjectKey, Range)>,
    /// Objects unmapped at recent refreshes, most recent first, with the
    /// ranges they had: their rows stay in the pool and their ranges in the
    /// kernel's table, so that a walk that finds another object than its
    /// table says at an address (a library loaded where another was since
    /// the last refresh) tries them by their check bytes.
    candidates: std::collections::VecDeque<(ObjectKey, Loaded, Vec<Range>)>,
    /// Ranges the kernel searches ([`MAX_RANGES`]; fewer in unit tests).
    max_ranges: usize,
    maps: String,
    stats: NativeStats,
}

/// The maps a [`NativeTables`] writes: `NATIVE_STATE`, `NATIVE_RANGES`,
/// `NATIVE_ROWS`, taken from the loaded program.
pub fn take_maps(bpf: &mut aya::Ebpf) -> Result<[MapData; 3], EbpfError> {
    let mut take = |name: &str| match bpf.take_map(name) {
        Some(Map::Array(data)) => Ok(data),
        _ => Err(EbpfError::Bpf(format!("the object has no array {name}"))),
    };
    Ok([
        take("NATIVE_STATE")?,
        take("NATIVE_RANGES")?,
        take("NATIVE_ROWS")?,
    ])
}

impl NativeTables {
    /// Maps the program's tables (`maps` from [`take_maps`]; `cap` rows
    /// in the pool, as loaded) and loads the rows of every object `pid` maps.
    pub fn new(pid: i32, maps: [MapData; 3], cap: u32) -> Result<Self, EbpfError> {
        let [state, ranges, rows] = maps;
        Self::over(
            pid,
            [
                Shared::map(state, 16)?,
                Shared::map(ranges, MAX_RANGES * RANGE_BYTES)?,
                Shared::map(rows, cap as usize * ROW_BYTES)?,
            ],
            cap,
            MAX_RANGES,
        )
    }

    /// The tables over `shared` (state, ranges, rows), loaded.
    fn over(pid: i32, shared: [Shared; 3], cap: u32, max_ranges: usize) -> Result<Self, EbpfError> {
        let [state, ranges, rows] = shared;
        let started = Instant::now();
        let mut tables = Self {
            pid,
            state,
            ranges,
            rows,
            pool: Pool {
                cap,
                used: BTreeMap::new(),
            },
            loaded: HashMap::new(),
            evaluated: HashMap::new(),
            published: Vec::new(),
            candidates: std::collections::VecDeque::new(),
            max_ranges,
            maps: String::new(),
            stats: NativeStats {
                cap,
                ..NativeStats::default()
            },
        };
        tables.refresh();
        tables.stats.refreshes = 0;
        tables.stats.load_time = started.elapsed();
        Ok(tables)
    }

    /// What the tables hold.
    pub fn stats(&self) -> &NativeStats {
        &self.stats
    }

    /// Brings the tables up to the target's mappings, if they changed.
    /// Returns whether they were rewritten. A target that has exited keeps
    /// the last tables.
    pub fn refresh(&mut self) -> bool {
        let Ok(maps) = fs::read_to_string(format!("/proc/{}/maps", self.pid)) else {
            return false;
        };
        if maps == self.maps {
            return false;
        }
        let mappings = parse_executable_maps(&maps);
        self.maps = maps;
        let refresh = self.stats.refreshes + 1;
        let mut ranges = Vec::new();
        let mut keep = HashMap::new();
        let mut left_out = Vec::new();
        let mut fresh = Vec::new();
        // Slices of candidates dropped to make room: no range names them
        // once this refresh publishes.
        let mut given_back = Vec::new();
        for m in &mappings {
            if m.path.starts_with(DOUBLE_MAPPED) {
                left_out.push((m.path.clone(), LeftOut::RuntimeCode));
                continue;
            }
            let (file, evaluated) = self.evaluate(m, refresh);
            let evaluated = match evaluated {
                Ok(e) => e,
                Err(why) => {
                    left_out.push((m.path.clone(), why));
                    continue;
                }
            };
            let Some(bias) = evaluated.bias(m) else {
                left_out.push((m.path.clone(), LeftOut::Unreadable));
                continue;
            };
            // Past the ranges the kernel searches, rows would be loaded
            // that no range names: left out, and said so.
            if ranges.len() == self.max_ranges {
                left_out.push((m.path.clone(), LeftOut::RangeCap));
                continue;
            }
            let key = (file, bias);
            let loaded = match self
                .loaded
                .remove(&key)
                .or_else(|| keep.remove(&key))
                .or_else(|| self.take_candidate(&key))
            {
                Some(l) => l,
                None => {
                    let count = evaluated.rows.len() as u32;
                    let Some(first) = self.take_rows(count, &mut given_back) else {
                        left_out.push((m.path.clone(), LeftOut::Cap));
                        continue;
                    };
                    fresh.push((first, evaluated.clone()));
                    Loaded { evaluated, first }
                }
            };
            let e = &loaded.evaluated;
            ranges.push((
                key.clone(),
                Range {
                    start: m.start,
                    end: m.end,
                    bias,
                    check_addr: bias.wrapping_add(e.check_vaddr),
                    first: loaded.first,
                    count: e.rows.len() as u32,
                    check: e.check,
                },
            ));
            keep.insert(key, loaded);
        }
        self.forget_unmapped(refresh);
        // Objects no longer mapped become candidates, with the ranges they
        // had; the oldest candidates beyond KEPT_CANDIDATES give their
        // slices back.
        let gone: Vec<(ObjectKey, Loaded)> = self.loaded.drain().collect();
        for (key, loaded) in gone {
            let had = self
                .published
                .iter()
                .filter(|(k, _)| *k == key)
                .map(|(_, r)| *r)
                .collect();
            self.candidates.push_front((key, loaded, had));
        }
        while self.candidates.len() > KEPT_CANDIDATES {
            if let Some((_, l, _)) = self.candidates.pop_back() {
                given_back.push(l.first);
            }
        }
        let mapped: Vec<Range> = ranges.iter().map(|(_, r)| *r).collect();
        let table = table_of(
            &mapped,
            self.candidates
                .iter()
                .flat_map(|(_, _, had)| had.iter().copied()),
            self.max_ranges,
        );
        // The kernel's scan reaches every mapped range from any pc in it.
        debug_assert!(
            the_scan_reaches_every_mapped_range(&table, &mapped),
            "{table:?}"
        );
        let searched = table.len();
        self.publish(&table, &fresh, given_back);
        self.published = ranges;
        self.loaded = keep;
        let mut per_object: Vec<(String, u64)> = self
            .loaded
            .iter()
            .map(|(((_, path, _), _), l)| (path.clone(), l.evaluated.rows.len() as u64))
            .collect();
        per_object.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let candidate_rows: u64 = self
            .candidates
            .iter()
            .map(|(_, l, _)| l.evaluated.rows.len() as u64)
            .sum();
        debug_assert_eq!(
            per_object.iter().map(|(_, n)| n).sum::<u64>() + candidate_rows,
            self.pool.rows()
        );
        self.stats = NativeStats {
            ranges: searched,
            per_object,
            candidates: self.candidates.len(),
            candidate_rows,
            left_out,
            refreshes: refresh,
            ..self.stats.clone()
        };
        true
    }

    /// The candidate loaded as `key` (the same file at the same bias,
    /// mapped again), taken out of the candidates: its rows are in place.
    fn take_candidate(&mut self, key: &ObjectKey) -> Option<Loaded> {
        let i = self.candidates.iter().position(|(k, _, _)| k == key)?;
        self.candidates.remove(i).map(|(_, l, _)| l)
    }

    /// A slice of `count` rows for a newly mapped object, dropping the
    /// oldest candidates while the pool has no room: their slices go in
    /// `given_back` (the new ranges no longer name them, and the kernel
    /// drops a sample whose rows were rewritten while it used them).
    fn take_rows(&mut self, count: u32, given_back: &mut Vec<u32>) -> Option<u32> {
        loop {
            if let Some(first) = self.pool.take(count) {
                return Some(first);
            }
            let (_, l, _) = self.candidates.pop_back()?;
            self.pool.give_back(l.first);
            given_back.push(l.first);
        }
    }

    /// Writes the new objects' rows and the ranges, under the odd sequence,
    /// and gives back the slices of candidates dropped (`gone`: their
    /// first rows) that were not reused already.
    fn publish(&mut self, ranges: &[Range], fresh: &[(u32, Arc<Evaluated>)], gone: Vec<u32>) {
        let seq = self.state.word(0);
        // Relaxed, then the fence: the odd value is ordered before every
        // write below for a reader that sees any of them (the kernel reads
        // the sequence, the rows, then the sequence again; x86-64 keeps
        // both sides' accesses in order, and the fence keeps the compiler's).
        // Relaxed load: only this thread writes the sequence.
        let odd = seq.load(Ordering::Relaxed) | 1;
        seq.store(odd, Ordering::Relaxed);
        fence(Ordering::Release);
        for first in gone {
            // A slice dropped to make room was given back, and may already
            // hold a new object's rows: that one keeps it.
            if !fresh.iter().any(|&(f, _)| f == first) {
                self.pool.give_back(first);
            }
        }
        for (first, e) in fresh {
            self.rows
                .write(*first as usize * ROW_BYTES, &rows_bytes(&e.rows));
        }
        for (i, r) in ranges.iter().enumerate() {
            self.ranges.write(i * RANGE_BYTES, &r.bytes());
        }
        // Relaxed: published by the even sequence's Release store below.
        self.state
            .word(8)
            .store(ranges.len() as u64, Ordering::Relaxed);
        // Release: every write above before the even value.
        seq.store(odd + 1, Ordering::Release);
    }

    /// The file mapped at `m` and its object, evaluated (once per content),
    /// or why it has no rows; marked as seen by `refresh`.
    fn evaluate(
        &mut self,
        m: &Mapping,
        refresh: u64,
    ) -> (FileKey, Result<Arc<Evaluated>, LeftOut>) {
        let mapped = format!("/proc/{}/map_files/{:x}-{:x}", self.pid, m.start, m.end);
        // The mapped file's own size and times (the link is followed to the
        // very file mapped): a rewrite in place changes them.
        let content = fs::metadata(&mapped).map_or((0, 0, 0), |meta| {
            use std::os::unix::fs::MetadataExt;
            let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
            (
                meta.size(),
                ns(meta.mtime(), meta.mtime_nsec()),
                ns(meta.ctime(), meta.ctime_nsec()),
            )
        });
        let key = (m.file, m.path.clone(), content);
        if let Some(found) = self.evaluated.get_mut(&key) {
            found.seen = refresh;
            return (key, found.evaluated.clone());
        }
        let data = if m.path == "[vdso]" {
            read_memory(self.pid, m.start, m.end - m.start)
        } else {
            fs::read(&mapped).ok()
        };
        let evaluated = data
            .ok_or(LeftOut::Unreadable)
            .and_then(|d| Evaluated::of(&d))
            .map(Arc::new);
        self.evaluated.insert(
            key.clone(),
            Cached {
                evaluated: evaluated.clone(),
                seen: refresh,
            },
        );
        (key, evaluated)
    }

    /// Keeps the evaluations of what `refresh` saw mapped, and of the
    /// [`KEPT_UNMAPPED`] objects unmapped most recently; forgets the rest.
    fn forget_unmapped(&mut self, refresh: u64) {
        let mut unmapped: Vec<u64> = self
            .evaluated
            .values()
            .map(|c| c.seen)
            .filter(|&seen| seen != refresh)
            .collect();
        if unmapped.len() <= KEPT_UNMAPPED {
            return;
        }
        // The newest KEPT_UNMAPPED last-seen marks stay: every entry seen at
        // or after the cut-off.
        unmapped.sort_unstable_by(|a, b| b.cmp(a));
        let cutoff = unmapped[KEPT_UNMAPPED - 1];
        let mut kept = 0;
        self.evaluated.retain(|_, c| {
            if c.seen == refresh {
                return true;
            }
            let keep = c.seen >= cutoff && kept < KEPT_UNMAPPED;
            kept += usize::from(keep);
            keep
        });
    }
}

/// Ranges the kernel tries for one pc, from the last that starts at or
/// before it backwards (`CANDIDATE_STEPS`).
const CANDIDATE_STEPS: usize = 8;

/// The table the kernel searches: the mapped objects' ranges (`mapped`,
/// which do not overlap), then as many candidates' (`candidates`, most
/// recently unmapped first) as fit in `max_ranges`, sorted by start. At
/// one start, a mapped object's range sorts last, so the kernel's backward
/// scan tries it first.
///
/// The scan tries [`CANDIDATE_STEPS`] ranges, so no more than one fewer
/// candidates may start inside a mapped range past its start: with more,
/// a pc high in the mapped object would never reach its range, and its
/// frame would be stepped by its frame pointer or cut as stale. A
/// candidate's range that would be one too many is left out, the oldest
/// first (its samples, taken before the unmap, lose their rows; the mapped
/// object's keep theirs).
fn table_of(
    mapped: &[Range],
    candidates: impl IntoIterator<Item = Range>,
    max_ranges: usize,
) -> Vec<Range> {
    debug_assert!(mapped.windows(2).all(|w| w[0].end <= w[1].start));
    let mut inside = vec![0usize; mapped.len()];
    let mut table: Vec<(bool, Range)> = mapped.iter().map(|r| (true, *r)).collect();
    for r in candidates {
        if table.len() == max_ranges {
            break;
        }
        // The mapped range this one starts inside, past its start.
        let i = mapped.partition_point(|m| m.start < r.start);
        if let Some(j) = i.checked_sub(1)
            && r.start < mapped[j].end
        {
            if inside[j] == CANDIDATE_STEPS - 1 {
                continue;
            }
            inside[j] += 1;
        }
        table.push((false, r));
    }
    table.sort_by_key(|&(mapped, r)| (r.start, mapped));
    table.into_iter().map(|(_, r)| r).collect()
}

/// Whether no more than [`CANDIDATE_STEPS`] − 1 ranges of `table` start
/// inside any range of `mapped` past its start: then the kernel's scan,
/// [`CANDIDATE_STEPS`] ranges back from a pc, reaches the mapped range that
/// holds it. What [`table_of`] keeps, checked after every refresh in debug
/// builds.
fn the_scan_reaches_every_mapped_range(table: &[Range], mapped: &[Range]) -> bool {
    mapped.iter().all(|m| {
        let inside = table
            .iter()
            .filter(|r| m.start < r.start && r.start < m.end)
            .count();
        inside < CANDIDATE_STEPS
    })
}

/// Rows as the kernel reads them (`struct unwind_row`, little-endian).
fn rows_bytes(rows: &[UnwindRow]) -> Vec<u8> {
    let mut out = Vec::with_capacity(rows.len() * ROW_BYTES);
    for r in rows {
        out.extend_from_slice(&r.offset.to_le_bytes());
        out.extend_from_slice(&r.cfa.to_le_bytes());
        out.extend_from_slice(&r.ra.to_le_bytes());
        out.extend_from_slice(&r.fp.to_le_bytes());
        out.extend_from_slice(&[r.kind, r.base, r.fp_rule, r.has_ra]);
    }
    out
}

/// `len` bytes of process `pid`'s memory at `addr`.
fn read_memory(pid: i32, addr: u64, len: u64) -> Option<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let file = fs::File::open(format!("/proc/{pid}/mem")).ok()?;
    let mut out = vec![0u8; usize::try_from(len).ok()?];
    file.read_exact_at(&mut out, addr).ok()?;
    Some(out)
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use jitmap_testkit::e2e::temp_dir;
    use jitmap_testkit::frameless::{build_shared_object, load};

    use super::*;

    /// Tables for this process over anonymous memory: `cap` rows and at
    /// most `max_ranges` ranges.
    fn own_tables(cap: u32, max_ranges: usize) -> NativeTables {
        let shared = [
            Shared::anonymous(16).unwrap(),
            Shared::anonymous(MAX_RANGES * RANGE_BYTES).unwrap(),
            Shared::anonymous(cap as usize * ROW_BYTES).unwrap(),
        ];
        NativeTables::over(std::process::id() as i32, shared, cap, max_ranges).unwrap()
    }

    /// The ranges the tables hold, read back as the kernel reads them.
    fn ranges_of(tables: &NativeTables) -> Vec<Range> {
        let n = tables.state.word(8).load(Ordering::Acquire) as usize;
        (0..n)
            .map(|i| {
                let b = tables.ranges.read(i * RANGE_BYTES, RANGE_BYTES);
                let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
                let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
                Range {
                    start: u64_at(0),
                    end: u64_at(8),
                    bias: u64_at(16),
                    check_addr: u64_at(24),
                    first: u32_at(32),
                    count: u32_at(36),
                    check: b[40..56].try_into().unwrap(),
                }
            })
            .collect()
    }

    /// The rows a range names, read back from the pool.
    fn rows_of(tables: &NativeTables, r: &Range) -> Vec<u8> {
        tables
            .rows
            .read(r.first as usize * ROW_BYTES, r.count as usize * ROW_BYTES)
    }

    /// The range whose mapping is of `path`.
    fn range_of(tables: &NativeTables, path: &Path) -> Range {
        let maps = fs::read_to_string("/proc/self/maps").unwrap();
        let m = parse_executable_maps(&maps)
            .into_iter()
            .find(|m| Path::new(&m.path) == path)
            .unwrap_or_else(|| panic!("{path:?} is not mapped"));
        // At one start, the mapped object's range sorts after candidates'.
        ranges_of(tables)
            .into_iter()
            .rev()
            .find(|r| r.start == m.start)
            .unwrap_or_else(|| panic!("no range for {path:?}"))
    }

    /// A library whose `.eh_frame` holds one CIE and no FDE: built as any
    /// (the linker drops a CIE that no FDE uses), then its first FDE's
    /// length set to 0, the table's end mark, so that the CIE is all that
    /// is left.
    fn build_cie_only(dir: &Path) -> PathBuf {
        let built =
            build_shared_object(dir, "built", "int cie_only(int x) { return x + 1; }").unwrap();
        let mut data = fs::read(&built).unwrap();
        let at = {
            let elf = ElfFile64::<object::LittleEndian>::parse(&*data).unwrap();
            let (offset, _) = elf
                .section_by_name(".eh_frame")
                .unwrap()
                .file_range()
                .unwrap();
            offset as usize
        };
        let cie = u32::from_le_bytes(data[at..at + 4].try_into().unwrap()) as usize;
        // The CIE's id is 0; the record after it is an FDE.
        assert_eq!(&data[at + 4..at + 8], &[0; 4]);
        data[at + 4 + cie..at + 8 + cie].fill(0);
        let object = dir.join("libcie_only.so");
        fs::write(&object, data).unwrap();
        object
    }

    /// An object with a CIE and no FDE has no rows: it is left out, never
    /// given an empty slice. (On the old code it evaluated to 0 rows, and
    /// `Pool::take(0)` handed out the slice of the object loaded at row 0.)
    #[test]
    fn an_object_with_a_cie_and_no_fde_is_left_out() {
        let dir = temp_dir("native-cie-only");
        let object = build_cie_only(&dir);
        let data = fs::read(&object).unwrap();
        let elf = ElfFile64::<object::LittleEndian>::parse(&*data).unwrap();
        let frame = elf.section_by_name(".eh_frame").unwrap();
        let rows = object_rows(frame.data().unwrap(), frame.address());
        assert_eq!(rows.as_deref(), Some(&[][..]), "one CIE and no FDE: no row");
        assert_eq!(Evaluated::of(&data).unwrap_err(), LeftOut::NoTable);
        fs::remove_dir_all(&dir).unwrap();
    }

    /// An empty object taken after another, or before: no slice is shared
    /// or freed by it. (On the old code `take(0)` returned 0 and overwrote
    /// the entry of the slice that starts there.)
    #[test]
    fn an_empty_slice_is_never_taken_in_either_order() {
        let mut pool = Pool {
            cap: 300,
            used: BTreeMap::new(),
        };
        assert_eq!(pool.take(100), Some(0));
        assert_eq!(pool.take(0), None);
        assert_eq!(pool.take(100), Some(100));
        assert_eq!(pool.used, BTreeMap::from([(0, 100), (100, 100)]));
        let mut pool = Pool {
            cap: 300,
            used: BTreeMap::new(),
        };
        assert_eq!(pool.take(0), None);
        assert_eq!(pool.take(100), Some(0));
        pool.give_back(0);
        assert_eq!(pool.rows(), 0);
        assert_eq!(pool.take(50), Some(0));
        assert_eq!(pool.take(50), Some(50));
        assert_eq!(pool.rows(), 100);
    }

    /// This process's objects, with a CIE-only library among them: every
    /// range's slice holds exactly its object's rows, and no two objects'
    /// slices overlap.
    #[test]
    fn every_range_names_its_own_objects_rows() {
        let dir = temp_dir("native-own-rows");
        let cie_only = build_cie_only(&dir);
        let (_handle, _) = load(&cie_only, c"cie_only").unwrap();
        let tables = own_tables(DEFAULT_ROWS_CAP, MAX_RANGES);
        let stats = tables.stats();
        assert!(
            stats
                .left_out
                .contains(&(cie_only.to_string_lossy().into_owned(), LeftOut::NoTable)),
            "{:?}",
            stats.left_out
        );
        let ranges = ranges_of(&tables);
        assert!(ranges.len() >= 2, "{ranges:?}");
        let mut slices: Vec<(u32, u32, u64)> = Vec::new();
        for r in &ranges {
            let loaded = tables.loaded.values().find(|l| l.first == r.first).unwrap();
            assert_eq!(rows_of(&tables, r), rows_bytes(&loaded.evaluated.rows));
            assert_eq!(r.check, loaded.evaluated.check);
            // Two mappings of one object share its slice; two objects never.
            for &(first, count, bias) in &slices {
                let overlap = r.first < first + count && first < r.first + r.count;
                assert!(!overlap || (first, count, bias) == (r.first, r.count, r.bias));
            }
            slices.push((r.first, r.count, r.bias));
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    /// Past the ranges the kernel searches, objects are left out as such
    /// and take no rows. (On the old code they were loaded and reported,
    /// and no range named them.)
    #[test]
    fn objects_past_the_range_cap_are_left_out_and_take_no_rows() {
        let tables = own_tables(DEFAULT_ROWS_CAP, 2);
        let stats = tables.stats();
        assert_eq!(stats.ranges, 2);
        let capped = stats
            .left_out
            .iter()
            .filter(|(_, why)| *why == LeftOut::RangeCap)
            .count();
        assert!(capped >= 1, "{:?}", stats.left_out);
        let named: u64 = ranges_of(&tables)
            .iter()
            .map(|r| (r.first, r.count))
            .collect::<std::collections::BTreeSet<_>>()
            .iter()
            .map(|&(_, count)| u64::from(count))
            .sum();
        assert_eq!(tables.pool.rows(), named);
        assert_eq!(stats.rows(), named);
    }

    /// A library rewritten in place (the same path and inode) is walked by
    /// its new rows. (On the old code the cache, keyed by device, inode and
    /// path, handed back the first build's rows and check bytes.)
    #[test]
    fn a_library_rewritten_at_its_path_gets_its_new_rows() {
        let dir = temp_dir("native-rewritten");
        let v1 = build_shared_object(&dir, "v1", "int f(int x) { return x * 3; }").unwrap();
        let v2 = build_shared_object(
            &dir,
            "v2",
            "#include <stdio.h>\nint g(int);\nint f(int x) { char b[64]; snprintf(b, 64, \"%d\", x); return g(b[0]) + 1; }\nint g(int x) { return x; }",
        )
        .unwrap();
        let path = dir.join("libswapped.so");
        fs::copy(&v1, &path).unwrap();
        let inode = |p: &Path| std::os::unix::fs::MetadataExt::ino(&fs::metadata(p).unwrap());
        let before = inode(&path);

        let (handle, _) = load(&path, c"f").unwrap();
        let mut tables = own_tables(DEFAULT_ROWS_CAP, MAX_RANGES);
        let first = Evaluated::of(&fs::read(&v1).unwrap()).unwrap();
        let r = range_of(&tables, &path);
        assert_eq!(rows_of(&tables, &r), rows_bytes(&first.rows));
        // SAFETY: the handle `load` opened; nothing of the library is used after.
        unsafe { libc::dlclose(handle) };
        assert!(tables.refresh());

        // Rewritten in place: the same inode, other bytes.
        fs::write(&path, fs::read(&v2).unwrap()).unwrap();
        assert_eq!(inode(&path), before);
        let (handle, _) = load(&path, c"f").unwrap();
        assert!(tables.refresh());
        let second = Evaluated::of(&fs::read(&v2).unwrap()).unwrap();
        assert_ne!(first.rows, second.rows);
        let r = range_of(&tables, &path);
        assert_eq!(rows_of(&tables, &r), rows_bytes(&second.rows));
        assert_eq!(r.check, second.check);
        // The first version stays a candidate, with its own rows and check
        // bytes: a walk that finds it mapped again before the next refresh
        // steps by its rows, and one that finds the second never does.
        let candidates: Vec<Range> = ranges_of(&tables)
            .into_iter()
            .filter(|c| c.check == first.check)
            .collect();
        assert_eq!(candidates.len(), 1, "{candidates:?}");
        assert_eq!(rows_of(&tables, &candidates[0]), rows_bytes(&first.rows));
        assert_eq!(
            (tables.stats().candidates, tables.stats().candidate_rows),
            (1, first.rows.len() as u64)
        );
        // SAFETY: as above.
        unsafe { libc::dlclose(handle) };
        fs::remove_dir_all(&dir).unwrap();
    }

    /// A target that loads and unloads a thousand distinct objects: the
    /// evaluations kept stay bounded. (On the old code every one stayed.)
    #[test]
    fn a_stream_of_new_objects_keeps_the_cache_bounded() {
        let dir = temp_dir("native-stream");
        let original =
            build_shared_object(&dir, "stream", "int s(int x) { return x + 7; }").unwrap();
        let mut tables = own_tables(DEFAULT_ROWS_CAP, MAX_RANGES);
        let mapped = tables.evaluated.len();
        let mut most = 0;
        for i in 0..1000 {
            let path = dir.join(format!("libstream{i}.so"));
            fs::copy(&original, &path).unwrap();
            let (handle, _) = load(&path, c"s").unwrap();
            tables.refresh();
            assert!(ranges_of(&tables).iter().any(|r| r.start != 0));
            // SAFETY: the handle `load` opened; nothing of it is used after.
            unsafe { libc::dlclose(handle) };
            fs::remove_file(&path).unwrap();
            most = most.max(tables.evaluated.len());
            // The candidates are bounded, and their rows are the pool's
            // rows beyond the mapped objects'.
            let stats = tables.stats();
            assert!(stats.candidates <= KEPT_CANDIDATES, "{stats:?}");
            assert_eq!(stats.rows() + stats.candidate_rows, tables.pool.rows());
        }
        // What this process maps besides (other tests load libraries too),
        // plus the recently unmapped.
        assert!(
            most <= mapped + KEPT_UNMAPPED + 16,
            "{most} evaluations kept (mapped at the start: {mapped})"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_pool_fits_slices_first_and_reuses_freed_ones() {
        let mut pool = Pool {
            cap: 100,
            used: BTreeMap::new(),
        };
        assert_eq!(pool.take(40), Some(0));
        assert_eq!(pool.take(40), Some(40));
        assert_eq!(pool.take(30), None);
        pool.give_back(0);
        assert_eq!(pool.take(30), Some(0));
        assert_eq!(pool.take(10), Some(30));
        assert_eq!(pool.take(20), Some(80));
        assert_eq!(pool.take(1), None);
        assert_eq!(pool.rows(), 100);
    }

    /// This test binary's own mappings: every executable one of a file
    /// gets rows, its bias puts this function inside a row's reach, and
    /// the check bytes are what the process holds at the check address.
    #[test]
    fn this_process_objects_evaluate_with_their_bias_and_check() {
        let pid = std::process::id() as i32;
        let maps = fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
        let here = this_process_objects_evaluate_with_their_bias_and_check as *const () as u64;
        let mapping = parse_executable_maps(&maps)
            .into_iter()
            .find(|m| (m.start..m.end).contains(&here))
            .expect("this function is in an executable mapping");
        let data = fs::read(format!(
            "/proc/{pid}/map_files/{:x}-{:x}",
            mapping.start, mapping.end
        ))
        .unwrap();
        let e = Evaluated::of(&data).unwrap();
        let bias = e.bias(&mapping).unwrap();
        // The check bytes, read from this process's memory.
        let at = bias + e.check_vaddr;
        let live = read_memory(pid, at, CHECK_BYTES as u64).unwrap();
        assert_eq!(live, e.check);
        // A row covers this function with a rule.
        let rel = (here - bias) as u32;
        let i = e.rows.partition_point(|r| r.offset <= rel);
        assert_eq!(e.rows[i - 1].kind, UnwindRow::RULE, "{:?}", e.rows[i - 1]);
        // The rows are sorted.
        assert!(e.rows.windows(2).all(|w| w[0].offset < w[1].offset));
    }

    /// An object cut short or with bytes flipped (a file rewritten while
    /// it was read, say) is refused or read, never a panic: this test
    /// binary's own file, cut at 200 lengths and flipped at 200 places.
    #[test]
    fn a_damaged_object_is_refused_not_a_panic() {
        let data = fs::read(std::env::current_exe().unwrap()).unwrap();
        let whole = Evaluated::of(&data).unwrap();
        let step = (data.len() / 200).max(1);
        for cut in (0..data.len()).step_by(step) {
            if let Ok(e) = Evaluated::of(&data[..cut]) {
                assert!(e.rows.len() <= whole.rows.len());
            }
        }
        let mut flipped = data.clone();
        for at in (0..data.len()).step_by(step) {
            flipped[at] ^= 0xFF;
            let _ = Evaluated::of(&flipped);
            flipped[at] ^= 0xFF;
        }
    }

    /// The ranges the kernel tries for `pc`, in its order: from the last
    /// one that starts at or before it, [`CANDIDATE_STEPS`] backwards,
    /// those that hold it (as `profile.bpf.c` scans).
    fn tried(table: &[Range], pc: u64) -> Vec<Range> {
        let last = table.partition_point(|r| r.start <= pc);
        table[..last]
            .iter()
            .rev()
            .take(CANDIDATE_STEPS)
            .filter(|r| r.start <= pc && pc < r.end)
            .copied()
            .collect()
    }

    fn range(start: u64, end: u64, first: u32) -> Range {
        Range {
            start,
            end,
            bias: 0,
            check_addr: start,
            first,
            count: 1,
            check: [first as u8; CHECK_BYTES],
        }
    }

    #[test]
    fn the_programs_scan_is_as_wide_as_the_tables_assume() {
        let program = include_str!("profile.bpf.c");
        assert!(
            program.contains(&format!("#define CANDIDATE_STEPS {CANDIDATE_STEPS}\n")),
            "profile.bpf.c's CANDIDATE_STEPS is not {CANDIDATE_STEPS}"
        );
    }

    /// Nine unmapped objects' ranges start inside a larger object mapped
    /// over their addresses since: the seven most recently unmapped stay,
    /// and every pc of the mapped object reaches its range. On the
    /// old code all nine stayed, and a pc past the eighth's start never
    /// reached the mapped range (the scan stopped at eight).
    #[test]
    fn no_more_candidates_start_inside_a_mapped_range_than_the_scan_passes() {
        let mapped = [range(0x1000, 0x2000, 100), range(0x10_000, 0x20_000, 200)];
        // Most recently unmapped first: 0x11000 .. 0x19000.
        let candidates: Vec<Range> = (0..9u32)
            .map(|i| {
                range(
                    0x11_000 + u64::from(i) * 0x1000,
                    0x12_000 + u64::from(i) * 0x1000,
                    i,
                )
            })
            .chain([range(0x20_000, 0x21_000, 50), range(0x10_000, 0x10_800, 60)])
            .collect();
        let table = table_of(&mapped, candidates.iter().copied(), 64);
        assert!(the_scan_reaches_every_mapped_range(&table, &mapped));
        // The old table kept all nine: the check refuses it.
        let mut all = mapped.to_vec();
        all.extend(candidates.iter().copied());
        all.sort_by_key(|r| r.start);
        assert!(!the_scan_reaches_every_mapped_range(&all, &mapped));
        let kept: Vec<u32> = table.iter().map(|r| r.first).collect();
        // The two oldest inside (first 7, 8) left out; one outside every
        // mapped range and one at the mapped range's own start kept (it
        // sorts before it, so it is tried after it).
        assert_eq!(kept, [100, 60, 200, 0, 1, 2, 3, 4, 5, 6, 50]);
        // (A candidate that holds the pc is tried before it, and fails its
        // check: another object is mapped there now.)
        for pc in (0x10_000..0x20_000).step_by(0x100) {
            let tried: Vec<u32> = tried(&table, pc).iter().map(|r| r.first).collect();
            assert!(tried.contains(&200), "{pc:#x}: {tried:?}");
        }
        // The cap: the mapped ranges first, then candidates while room is left.
        let capped = table_of(&mapped, candidates.iter().copied(), 4);
        assert_eq!(
            capped.iter().map(|r| r.first).collect::<Vec<_>>(),
            [100, 200, 0, 1]
        );
    }

    #[test]
    fn rows_and_ranges_have_the_programs_layout() {
        let row = UnwindRow {
            offset: 0x0403_0201,
            cfa: -2,
            ra: -8,
            fp: -16,
            kind: UnwindRow::RULE,
            base: UnwindRow::BASE_FP,
            fp_rule: UnwindRow::FP_AT,
            has_ra: 1,
        };
        assert_eq!(
            rows_bytes(&[row]),
            [
                1, 2, 3, 4, 0xfe, 0xff, 0xff, 0xff, 0xf8, 0xff, 0xf0, 0xff, 1, 1, 1, 1
            ]
        );
        let range = Range {
            start: 1,
            end: 2,
            bias: 3,
            check_addr: 4,
            first: 5,
            count: 6,
            check: [7; 16],
        };
        let b = range.bytes();
        assert_eq!(
            (b[0], b[8], b[16], b[24], b[32], b[36], b[40], b[55]),
            (1, 2, 3, 4, 5, 6, 7, 7)
        );
    }
}
