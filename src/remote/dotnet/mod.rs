//! Live CoreCLR 8 processes: the runtime's own `ExecutionManager` maps, read with
//! the same bounded machinery as a jitmap host's. `libcoreclr.so` exports
//! `g_dacTable`, whose first slot points at `ExecutionManager::g_codeRangeMap`:
//! a five-level `RangeSectionMap` (bit 0 of each entry flags a collectible
//! section), whose fragments lead to range sections, whose code heaps carry a
//! version-1 nibble map. The offsets are in [`layout::LAYOUTS`], one table
//! per runtime version shared with the eBPF profiler (.NET 8.0.x on 64-bit
//! Linux); any other version is refused.
//!
//! The runtime publishes no change sequence, so an answer read while the
//! runtime compiles may be stale; stop the process (SIGSTOP) for exact answers.

pub mod layout;
pub mod metadata;
pub mod names;

use std::cell::Cell;

use super::checks::{check_ptr, index, read_at, read_u32_at};
use super::memory::Memory;
use super::words::{ChunkWords, RemoteWords};
use super::{RemoteError, Unknown, V1_MAX_WORDS};
use crate::nibble::{Capped, Starts, find_v1_capped};
use crate::range::{ADDRESS_BITS, FANOUT, LEVELS};
use layout::{DotnetLayout, layout_for};

/// Bit 0 of a map entry or fragment link: the section is collectible.
const COLLECTIBLE: u64 = 1;
/// Fragments followed in one chunk's list.
const MAX_FRAGMENTS: usize = 64;
/// Range-map levels a listing reads.
const MAX_LEVELS: usize = 4096;
/// A code heap's map is read in pieces of this many words.
const CHUNK_WORDS: usize = 4096;

/// A CoreCLR found in a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Runtime {
    /// Path of `libcoreclr.so`.
    pub coreclr: String,
    /// Its version string, `8.0.424.16909` for .NET 8.0.4.
    pub version: String,
    /// Address of `g_dacTable`.
    pub dac_table: u64,
    /// Address of `ExecutionManager::g_codeRangeMap`.
    pub code_range_map: u64,
    /// Where this version keeps what the readers read.
    pub layout: &'static DotnetLayout,
}

/// What a range section of the runtime holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DotnetSectionKind {
    /// A JIT code heap with its nibble map.
    CodeHeap {
        /// The `HeapList` node.
        heap_list: u64,
        /// First code address.
        start: u64,
        /// End of the code heap.
        end: u64,
        /// What nibble-map offsets count from.
        map_base: u64,
        /// The nibble map's words.
        header_map: u64,
    },
    /// Stubs allocated from a range list (precode, fixup, virtual-call stubs).
    RangeList {
        /// The `CodeRangeMapRangeList`.
        list: u64,
    },
    /// A ReadyToRun image.
    ReadyToRun {
        /// Its `Module`.
        module: u64,
    },
}

/// A range section of the runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DotnetSection {
    /// The `RangeSection`.
    pub address: u64,
    /// First address.
    pub begin: u64,
    /// One past the last.
    pub end: u64,
    /// `RangeSectionFlags`.
    pub flags: u32,
    /// Heap, range list or image.
    pub kind: DotnetSectionKind,
}

/// What an address is in the runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DotnetResolution {
    /// JIT-compiled code: the start the nibble map names, and its method.
    Method {
        /// First code byte.
        start: u64,
        /// Offset of the address from `start`.
        offset: u64,
        /// The real code header.
        code_header: u64,
        /// The `MethodDesc`, the method's identity.
        method_desc: u64,
    },
    /// A stub code block in a code heap.
    StubBlock {
        /// First code byte.
        start: u64,
        /// Its kind (1..=15).
        kind: u8,
    },
    /// Inside a range section of the given kind other than a code heap.
    Section(DotnetSection),
    /// In no range section, or before the first start of a code heap.
    Nothing,
    /// The capped v1 walk did not reach the start.
    Unknown(Unknown),
}

/// Finds CoreCLR in process `pid`: `libcoreclr.so` in its mappings, the version
/// string compiled into it (refused unless [`layout::LAYOUTS`] has its layout), `g_dacTable` in its
/// dynamic symbols, and the code range map that the table's first slot points at.
pub fn find_runtime<M: Memory>(pid: i32, memory: &M) -> Result<Runtime, RemoteError> {
    // One read of the file: its dynamic symbols, its extent, its version.
    let file = super::process::find_symbol_file(
        pid,
        |path| path.ends_with("/libcoreclr.so"),
        "g_dacTable",
    )?;
    let dac_table = file.symbol;
    let (version, layout) = check_version(coreclr_version(&file.bytes))?;
    let mut slot = [0u8; 8];
    memory.read(dac_table, &mut slot)?;
    let code_range_map = u64::from_ne_bytes(slot);
    let inside = file
        .extent
        .is_some_and(|(lo, hi)| (lo..hi).contains(&code_range_map));
    if !code_range_map.is_multiple_of(8) || !inside {
        return Err(RemoteError::Corrupt {
            what: "g_dacTable's code range map is not a libcoreclr.so global (runtime not started?)",
            addr: code_range_map,
        });
    }
    Ok(Runtime {
        coreclr: file.path,
        version,
        dac_table,
        code_range_map,
        layout,
    })
}

/// `version` with its layout, if [`layout::LAYOUTS`] has one (8.0.x);
/// otherwise [`RemoteError::UnsupportedRuntime`]: the reader never guesses.
///
/// ```
/// use jitmap::remote::{RemoteError, dotnet::check_version};
/// let (version, layout) = check_version(Some("8.0.424.16909".into()))?;
/// assert_eq!((version.as_str(), layout.versions), ("8.0.424.16909", "8.0."));
/// assert_eq!(
///     check_version(Some("9.0.100.1".into())),
///     Err(RemoteError::UnsupportedRuntime { version: "9.0.100.1".into() })
/// );
/// assert!(check_version(None).is_err());
/// # Ok::<(), RemoteError>(())
/// ```
pub fn check_version(
    version: Option<String>,
) -> Result<(String, &'static DotnetLayout), RemoteError> {
    match version {
        Some(v) => match layout_for(&v) {
            Some(layout) => Ok((v, layout)),
            None => Err(RemoteError::UnsupportedRuntime { version: v }),
        },
        None => Err(RemoteError::UnsupportedRuntime {
            version: "unknown (no version string in libcoreclr.so)".into(),
        }),
    }
}

/// The version in a `libcoreclr.so`'s `@(#)Version 8.0.424.16909 ...`
/// string (`bytes`: the file, as the process maps it).
///
/// ```
/// use jitmap::remote::dotnet::coreclr_version;
/// let file = b"\0\0@(#)Version 8.0.424.16909 @Commit: 2d7eea2\0";
/// assert_eq!(coreclr_version(file), Some("8.0.424.16909".into()));
/// assert_eq!(coreclr_version(b"no version here"), None);
/// ```
pub fn coreclr_version(bytes: &[u8]) -> Option<String> {
    const TAG: &[u8] = b"@(#)Version ";
    let at = bytes.windows(TAG.len()).position(|w| w == TAG)? + TAG.len();
    let version: Vec<u8> = bytes[at..]
        .iter()
        .take(32)
        .take_while(|b| b.is_ascii_digit() || **b == b'.')
        .copied()
        .collect();
    String::from_utf8(version).ok().filter(|v| !v.is_empty())
}

/// Reads a CoreCLR 8 process's code maps.
///
/// ```no_run
/// use jitmap::remote::ProcessMemory;
/// use jitmap::remote::dotnet::{DotnetReader, DotnetResolution, find_runtime};
/// let pid = 4242; // a process running .NET 8
/// let memory = ProcessMemory::new(pid);
/// let runtime = find_runtime(pid, &memory)?;
/// let reader = DotnetReader::new(memory, &runtime);
/// for section in reader.sections()? {
///     for start in reader.starts(&section)? {
///         if let DotnetResolution::Method { method_desc, .. } = reader.resolve(start)? {
///             println!("{start:#x} MethodDesc {method_desc:#x}");
///         }
///     }
/// }
/// # Ok::<(), jitmap::remote::RemoteError>(())
/// ```
#[derive(Debug)]
pub struct DotnetReader<M> {
    memory: M,
    map: u64,
    layout: &'static DotnetLayout,
    reads: Cell<u64>,
}

impl<M: Memory> DotnetReader<M> {
    /// A reader of `runtime`'s `RangeSectionMap`, by its version's layout.
    pub fn new(memory: M, runtime: &Runtime) -> Self {
        Self {
            memory,
            map: runtime.code_range_map,
            layout: runtime.layout,
            reads: Cell::new(0),
        }
    }

    /// Reads made so far.
    pub fn reads(&self) -> u64 {
        self.reads.get()
    }

    /// What `ip` is: five level reads, at most 64 fragments, the range section,
    /// then in a code heap its `HeapList`, at most [`V1_MAX_WORDS`] nibble
    /// words, the code header pointer and the `MethodDesc` pointer.
    pub fn resolve(&self, ip: u64) -> Result<DotnetResolution, RemoteError> {
        let Some(section) = self.section_of(ip)? else {
            return Ok(DotnetResolution::Nothing);
        };
        let DotnetSectionKind::CodeHeap {
            end,
            map_base,
            header_map,
            ..
        } = section.kind
        else {
            return Ok(DotnetResolution::Section(section));
        };
        if ip < map_base || ip >= end {
            return Ok(DotnetResolution::Nothing);
        }
        let words = RemoteWords::new(self, header_map, word_count(map_base, end));
        let found = find_v1_capped(&words, ip - map_base, V1_MAX_WORDS);
        words.check()?;
        let start = match found {
            Capped::Found(start) => map_base + start,
            Capped::Nothing => return Ok(DotnetResolution::Nothing),
            Capped::TooFar => return Ok(DotnetResolution::Unknown(Unknown::TooFar)),
        };
        let header = self.read_u64(start - 8)?;
        let l = self.layout;
        if header <= l.stub_code_block_last {
            return Ok(DotnetResolution::StubBlock {
                start,
                kind: header as u8,
            });
        }
        let code_header = check_ptr(header, 8, "code header")?;
        let method_desc = check_ptr(
            self.read_u64(code_header + l.real_header_method_desc as u64)?,
            8,
            "method desc",
        )?;
        Ok(DotnetResolution::Method {
            start,
            offset: ip - start,
            code_header,
            method_desc,
        })
    }

    /// The range section containing `ip`.
    pub fn section_of(&self, ip: u64) -> Result<Option<DotnetSection>, RemoteError> {
        if ip >> ADDRESS_BITS != 0 {
            return Ok(None);
        }
        let mut level = self.map;
        for depth in (1..LEVELS).rev() {
            let entry = self.read_u64(level + 8 * index(ip, depth))? & !COLLECTIBLE;
            if entry == 0 {
                return Ok(None);
            }
            level = check_ptr(entry, 8, "range-map level")?;
        }
        let mut next = self.read_u64(level + 8 * index(ip, 0))? & !COLLECTIBLE;
        for _ in 0..MAX_FRAGMENTS {
            if next == 0 {
                return Ok(None);
            }
            let l = self.layout;
            let fragment = self.read_bytes(check_ptr(next, 8, "fragment")?, l.fragment_bytes)?;
            let (begin, end) = (
                read_at(&fragment, l.fragment_begin),
                read_at(&fragment, l.fragment_end),
            );
            if begin <= ip && ip < end {
                return self
                    .section(read_at(&fragment, l.fragment_section))
                    .map(Some);
            }
            next = read_at(&fragment, l.fragment_next) & !COLLECTIBLE;
        }
        Err(RemoteError::Corrupt {
            what: "fragment list longer than the cap",
            addr: next,
        })
    }

    /// Reads and checks the `RangeSection` at `address`.
    pub fn section(&self, address: u64) -> Result<DotnetSection, RemoteError> {
        let l = self.layout;
        let s = self.read_bytes(check_ptr(address, 8, "range section")?, l.section_bytes)?;
        let (begin, end) = (read_at(&s, l.section_low), read_at(&s, l.section_high));
        let flags = read_u32_at(&s, l.section_flags);
        if begin >= end || (end - 1) >> ADDRESS_BITS != 0 {
            return Err(RemoteError::Corrupt {
                what: "range section bounds",
                addr: address,
            });
        }
        let kind = if flags & l.flag_range_list != 0 {
            DotnetSectionKind::RangeList {
                list: read_at(&s, l.section_range_list),
            }
        } else if flags & l.flag_code_heap != 0 {
            let heap_list = check_ptr(read_at(&s, l.section_heap_list), 8, "heap list")?;
            let h = self.read_bytes(heap_list, l.heap_list_bytes)?;
            let (start, heap_end, map_base) = (
                read_at(&h, l.heap_start),
                read_at(&h, l.heap_end),
                read_at(&h, l.heap_map_base),
            );
            let sane = map_base <= start && start <= heap_end && heap_end - map_base < 1 << 32;
            if !sane {
                return Err(RemoteError::Corrupt {
                    what: "heap list bounds",
                    addr: heap_list,
                });
            }
            DotnetSectionKind::CodeHeap {
                heap_list,
                start,
                end: heap_end,
                map_base,
                header_map: check_ptr(read_at(&h, l.heap_header_map), 4, "header map")?,
            }
        } else {
            DotnetSectionKind::ReadyToRun {
                module: read_at(&s, l.section_module),
            }
        };
        Ok(DotnetSection {
            address,
            begin,
            end,
            flags,
            kind,
        })
    }

    /// The `StubCodeBlockKind` of the stubs in range list `list` (a
    /// [`DotnetSectionKind::RangeList`]'s): precodes, fixup precodes,
    /// virtual-call stubs.
    pub fn range_list_kind(&self, list: u64) -> Result<u32, RemoteError> {
        let at = check_ptr(list, 8, "range list")? + self.layout.range_list_type as u64;
        let mut kind = [0u8; 4];
        self.read(at, &mut kind)?;
        Ok(u32::from_ne_bytes(kind))
    }

    /// Every range section, in address order (walks all five levels).
    pub fn sections(&self) -> Result<Vec<DotnetSection>, RemoteError> {
        let mut addresses = Vec::new();
        let mut stack = vec![(self.map, LEVELS - 1)];
        let mut entries = vec![0u8; 8 * FANOUT];
        let mut visited = 0;
        while let Some((level, depth)) = stack.pop() {
            visited += 1;
            if visited > MAX_LEVELS {
                return Err(RemoteError::Corrupt {
                    what: "more range-map levels than the cap",
                    addr: level,
                });
            }
            self.read(level, &mut entries)?;
            for chunk in entries.chunks_exact(8) {
                let entry = read_at(chunk, 0) & !COLLECTIBLE;
                if entry == 0 {
                    continue;
                }
                if depth > 0 {
                    stack.push((check_ptr(entry, 8, "range-map level")?, depth - 1));
                    continue;
                }
                let mut next = entry;
                for _ in 0..MAX_FRAGMENTS {
                    if next == 0 {
                        break;
                    }
                    let l = self.layout;
                    let fragment =
                        self.read_bytes(check_ptr(next, 8, "fragment")?, l.fragment_bytes)?;
                    addresses.push(read_at(&fragment, l.fragment_section));
                    next = read_at(&fragment, l.fragment_next) & !COLLECTIBLE;
                }
            }
        }
        addresses.sort_unstable();
        addresses.dedup();
        let mut sections = addresses
            .into_iter()
            .map(|a| self.section(a))
            .collect::<Result<Vec<_>, _>>()?;
        sections.sort_by_key(|s| s.begin);
        Ok(sections)
    }

    /// A code heap's nibble-map words, from its map base to its end.
    pub fn map_words(&self, section: &DotnetSection) -> Result<Vec<u32>, RemoteError> {
        let DotnetSectionKind::CodeHeap {
            end,
            map_base,
            header_map,
            ..
        } = section.kind
        else {
            return Ok(Vec::new());
        };
        let count = word_count(map_base, end);
        let mut words = Vec::with_capacity(count);
        let mut bytes = vec![0u8; 4 * CHUNK_WORDS];
        let mut first = 0;
        while first < count {
            let n = CHUNK_WORDS.min(count - first);
            self.read(header_map + 4 * first as u64, &mut bytes[..4 * n])?;
            words.extend(ChunkWords::from_bytes(&bytes[..4 * n]).0);
            first += n;
        }
        Ok(words)
    }

    /// The code starts a code heap's map holds, as addresses.
    pub fn starts(&self, section: &DotnetSection) -> Result<Vec<u64>, RemoteError> {
        let DotnetSectionKind::CodeHeap { map_base, .. } = section.kind else {
            return Ok(Vec::new());
        };
        let words = ChunkWords(self.map_words(section)?);
        Ok(Starts::new(&words).map(|s| map_base + s).collect())
    }

    fn read_u64(&self, addr: u64) -> Result<u64, RemoteError> {
        Ok(u64::from_ne_bytes(self.read_array::<8>(addr)?))
    }

    fn read_array<const N: usize>(&self, addr: u64) -> Result<[u8; N], RemoteError> {
        let mut bytes = [0u8; N];
        self.read(addr, &mut bytes)?;
        Ok(bytes)
    }

    /// `len` bytes (a structure's size from the layout table, at most a
    /// few hundred).
    fn read_bytes(&self, addr: u64, len: usize) -> Result<Vec<u8>, RemoteError> {
        let mut bytes = vec![0u8; len];
        self.read(addr, &mut bytes)?;
        Ok(bytes)
    }
}

impl<M: Memory> Memory for DotnetReader<M> {
    /// Reads through the reader's memory, counting the read.
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), RemoteError> {
        self.reads.set(self.reads.get() + 1);
        self.memory.read(addr, buf)
    }
}

/// Nibble words covering `map_base..end`.
fn word_count(map_base: u64, end: u64) -> usize {
    (end - map_base).div_ceil(256) as usize
}
