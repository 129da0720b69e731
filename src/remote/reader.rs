//! Lookups over another process's memory: the range-map walk, the nibble-map
//! lookups (the same functions the in-process heap runs), the end-map check,
//! the prefix and the header, each read bounded and checked.

use std::cell::Cell;
use std::mem::offset_of;

use super::checks::{check_ptr, index, read_at, read_u32_at};
use super::memory::Memory;
use super::words::{ChunkWords, RemoteWords};
use super::{MAX_FRAGMENTS, MAX_NAME, MAX_ROWS, RETRIES, RemoteError, UnwindRow, V1_MAX_WORDS};
use crate::manager::StubKindName;
use crate::manager::descriptor::{Descriptor, LAYOUT_VERSION, MAGIC, MAX_MANAGERS};
use crate::manager::stub_names::{LABEL_BYTES, StubLabel};
use std::sync::atomic::AtomicU64;

use crate::heap::MAX_STUB_KIND;
use crate::heap::end_words::RawEnds;
use crate::nibble::{Capped, Starts, V2Origin, find_v1_capped, find_v2_placed};
use crate::range::{ADDRESS_BITS, CHUNK_BITS, FANOUT, LEVELS};

/// The largest fragment, prefix and header a reader accepts from a descriptor.
const MAX_STRUCT: usize = 512;
/// The largest image-table entry a descriptor may declare.
const MAX_ENTRY: usize = 64;
/// Functions an image's table may list: a binary search reads at most 25.
const MAX_IMAGE_FUNCTIONS: u64 = 1 << 24;
/// Start-map words in a heap of less than 4 GiB.
const MAX_WORDS: u64 = 1 << 24;
/// Range-map levels a listing reads before it calls the map corrupt.
const MAX_LIST_LEVELS: usize = 4096;
/// Methods a listing returns at most.
const MAX_LIST_METHODS: usize = 1 << 20;
/// Start-map words a listing reads at once.
const LIST_CHUNK_WORDS: usize = 4096;

/// The layout a descriptor declares, checked: every offset lies inside the
/// struct it indexes, with room for the value read there. Only a
/// [`RemoteReader`] makes one; readers of other kinds (an eBPF program) take
/// their offsets from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Layout {
    /// Offset of the range map's change sequence in its root.
    pub root_seq: u64,
    /// Size of a range-map fragment.
    pub fragment_size: usize,
    /// First address of the section (u64 in a fragment).
    pub fragment_begin: usize,
    /// One past the section's last address (u64 in a fragment).
    pub fragment_end: usize,
    /// The next fragment of the chunk (pointer in a fragment).
    pub fragment_next: usize,
    /// The section kind's tag (u64 in a fragment).
    pub fragment_tag: usize,
    /// Tag of a code heap.
    pub tag_heap: u64,
    /// Tag of a precompiled image.
    pub tag_image: u64,
    /// A heap's executable base (pointer in a heap fragment).
    pub heap_base: usize,
    /// A heap's start-map words (pointer in a heap fragment).
    pub heap_words: usize,
    /// A heap's end map (pointer in a heap fragment).
    pub heap_ends: usize,
    /// Start-map words (u32 in a heap fragment).
    pub heap_word_count: usize,
    /// Map version (u8 in a heap fragment).
    pub heap_version: usize,
    /// The heap's change sequence, in the trailer after its end map.
    pub heap_seq: usize,
    /// The heap's id, in the trailer after its end map.
    pub heap_id: usize,
    /// Bytes of the block prefix before every code start.
    pub prefix_bytes: u64,
    /// Code size (u64 in the prefix).
    pub prefix_size: usize,
    /// Stub kind or header pointer (u64 in the prefix).
    pub prefix_slot: usize,
    /// The largest stub kind.
    pub max_stub_kind: u64,
    /// Method id (u64 in a code header).
    pub header_method_id: usize,
    /// Code size (u64 in a code header).
    pub header_code_size: usize,
    /// Name pointer (in a code header).
    pub header_name_ptr: usize,
    /// Name length in bytes (u64 in a code header).
    pub header_name_len: usize,
    /// Pointer to the method's [`UnwindRow`](super::UnwindRow)s (in a code
    /// header).
    pub header_rows_ptr: usize,
    /// Number of unwind rows (u64 in a code header).
    pub header_rows_len: usize,
    /// An image's function table (pointer in an image fragment; layout 3).
    pub image_table: usize,
    /// Entries in the table (u64 in an image fragment).
    pub image_count: usize,
    /// Size of a table entry.
    pub image_entry_size: usize,
    /// The function's first byte from the image base (u32 in an entry).
    pub entry_begin: usize,
    /// One past its last byte (u32 in an entry).
    pub entry_end: usize,
    /// Its method's offset at its first byte (u32 in an entry).
    pub entry_delta: usize,
    /// Bytes of the method's name (u32 in an entry).
    pub entry_name_len: usize,
    /// The method's id (u64 in an entry).
    pub entry_method_id: usize,
    /// The method's name (pointer in an entry).
    pub entry_name_ptr: usize,
}

/// A registered manager's range-map root, and the names it gave its stub
/// kinds: (kind, name) for each kind named ([`RemoteReader::stub_names`]).
pub type ManagerStubNames = (u64, Vec<(u8, StubKindName)>);

/// What a lookup found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// A JIT-compiled method.
    Method(RemoteMethod),
    /// A stub block.
    Stub {
        /// The heap's id.
        heap_id: u64,
        /// First code byte.
        start: u64,
        /// Offset of the address from `start`.
        offset: u64,
        /// Code size.
        size: u64,
        /// The stub's kind (1..=15).
        kind: u8,
        /// The kind's name, if the host gave it one
        /// ([`crate::ExecutionManager::name_stub_kind`]).
        name: Option<StubKindName>,
    },
    /// A precompiled image's section, and the method whose function holds
    /// the address (`None` between functions).
    Image {
        /// First address of the image.
        begin: u64,
        /// One past its last address.
        end: u64,
        /// Offset of the address from `begin`.
        offset: u64,
        /// The method, from the image's function table.
        method: Option<ImageMethodFound>,
    },
    /// In no section, or in a heap but in no block.
    Nothing,
    /// The reader cannot say, and will not guess.
    Unknown(Unknown),
}

/// Why a lookup answered [`Resolution::Unknown`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unknown {
    /// The host changed the maps during every attempt.
    Changing,
    /// A v1 lookup read [`V1_MAX_WORDS`] words without finding the start.
    TooFar,
}

/// An image method found in another process: the function that holds the
/// address, and its method.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageMethodFound {
    /// The function's first byte.
    pub start: u64,
    /// Its size in bytes.
    pub size: u64,
    /// Offset of the address in the method (a funclet or cold part
    /// continues its method's offsets, as in process).
    pub offset: u64,
    /// The runtime's method id.
    pub method_id: u64,
    /// The name, cut at [`MAX_NAME`] bytes, invalid UTF-8 replaced (empty:
    /// the method has none).
    pub name: String,
}

/// A method found in another process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteMethod {
    /// The heap's id.
    pub heap_id: u64,
    /// First code byte.
    pub start: u64,
    /// Offset of the address from `start`.
    pub offset: u64,
    /// Code size.
    pub size: u64,
    /// The runtime's method id.
    pub method_id: u64,
    /// The name, cut at [`MAX_NAME`] bytes, invalid UTF-8 replaced.
    pub name: String,
    /// Its unwind rows (descriptor layout 2): sorted by offset, each inside
    /// the method; empty for a method published without `.eh_frame`.
    pub rows: Vec<UnwindRow>,
}

/// What a range section holds, as a listing sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SectionKind {
    /// A code heap.
    Heap {
        /// Its id.
        id: u64,
        /// Map version (1 or 2).
        version: u8,
    },
    /// A precompiled image.
    Image,
}

/// A range section of another process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteSection {
    /// First address.
    pub begin: u64,
    /// One past the last address.
    pub end: u64,
    /// Heap or image.
    pub kind: SectionKind,
}

/// Reads made by a reader's lookups.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Lookups answered (including unknown).
    pub lookups: u64,
    /// Memory reads, in total.
    pub reads: u64,
    /// The most reads one lookup made (all its attempts).
    pub max_reads: u64,
    /// Attempts thrown away because the host changed under them.
    pub retries: u64,
}

impl ReadStats {
    /// Mean reads per lookup.
    pub fn mean_reads(&self) -> f64 {
        if self.lookups == 0 {
            0.0
        } else {
            self.reads as f64 / self.lookups as f64
        }
    }
}

/// Reads the maps of another process (or any [`Memory`]) through its descriptor.
#[derive(Debug)]
pub struct RemoteReader<M> {
    memory: M,
    descriptor: u64,
    layout: Layout,
    reads: Cell<u64>,
    stats: Cell<ReadStats>,
}

/// Why one attempt of a lookup ended without an answer.
enum Fail {
    /// The host changed (or may have) under the attempt.
    Stale,
    /// A real error.
    Error(RemoteError),
}

impl From<RemoteError> for Fail {
    fn from(e: RemoteError) -> Self {
        Self::Error(e)
    }
}

/// A fragment of the range map, read.
struct Fragment {
    begin: u64,
    end: u64,
    bytes: [u8; MAX_STRUCT],
}

/// A heap section's read side, read from its fragment and checked.
#[derive(Clone, Copy)]
struct HeapView {
    /// The heap's id, once the trailer is read.
    id: u64,
    base: u64,
    words: u64,
    ends: u64,
    word_count: u64,
    version: u8,
    /// Address of the change sequence, in the trailer after the end map.
    seq: u64,
}

impl<M: Memory> RemoteReader<M> {
    /// A reader of the descriptor at `descriptor`: reads it and checks its magic
    /// value, layout version and every offset.
    pub fn new(memory: M, descriptor: u64) -> Result<Self, RemoteError> {
        let mut bytes = [0u8; size_of::<Descriptor>()];
        memory.read(descriptor, &mut bytes[..16])?;
        if read_at(&bytes, 0) != MAGIC {
            return Err(RemoteError::BadDescriptor { what: "magic" });
        }
        if read_u32_at(&bytes, offset_of!(Descriptor, layout_version)) != LAYOUT_VERSION {
            return Err(RemoteError::BadDescriptor {
                what: "layout version",
            });
        }
        if read_u32_at(&bytes, offset_of!(Descriptor, descriptor_size)) as usize != bytes.len() {
            return Err(RemoteError::BadDescriptor {
                what: "descriptor size",
            });
        }
        memory.read(descriptor, &mut bytes)?;
        let field = |off: usize| read_u32_at(&bytes, off) as usize;
        macro_rules! f {
            ($name:ident) => {
                field(offset_of!(Descriptor, $name))
            };
        }
        let fixed = [
            (f!(pointer_size), 8, "pointer size"),
            (f!(levels), LEVELS, "levels"),
            (f!(fanout), FANOUT, "fanout"),
            (f!(chunk_bits), CHUNK_BITS as usize, "chunk bits"),
            (f!(address_bits), ADDRESS_BITS as usize, "address bits"),
            (f!(max_managers), MAX_MANAGERS, "manager entries"),
            (f!(prefix_bytes), 16, "prefix size"),
            (
                f!(max_stub_kind),
                MAX_STUB_KIND as usize,
                "largest stub kind",
            ),
            (
                f!(stub_label_size),
                size_of::<StubLabel>(),
                "stub label size",
            ),
            (f!(stub_label_bytes), LABEL_BYTES, "stub label bytes"),
            (
                f!(unwind_row_size),
                size_of::<super::UnwindRow>(),
                "unwind row size",
            ),
        ];
        if let Some((_, _, what)) = fixed.iter().find(|(got, want, _)| got != want) {
            return Err(RemoteError::BadDescriptor { what });
        }
        let layout = Layout {
            root_seq: f!(root_seq) as u64,
            fragment_size: f!(fragment_size),
            fragment_begin: f!(fragment_begin),
            fragment_end: f!(fragment_end),
            fragment_next: f!(fragment_next),
            fragment_tag: f!(fragment_tag),
            tag_heap: f!(tag_heap) as u64,
            tag_image: f!(tag_image) as u64,
            heap_base: f!(heap_base),
            heap_words: f!(heap_words),
            heap_ends: f!(heap_ends),
            heap_word_count: f!(heap_word_count),
            heap_version: f!(heap_version),
            heap_seq: f!(heap_seq),
            heap_id: f!(heap_id),
            prefix_bytes: f!(prefix_bytes) as u64,
            prefix_size: f!(prefix_size),
            prefix_slot: f!(prefix_slot),
            max_stub_kind: f!(max_stub_kind) as u64,
            header_method_id: f!(header_method_id),
            header_code_size: f!(header_code_size),
            header_name_ptr: f!(header_name_ptr),
            header_name_len: f!(header_name_len),
            header_rows_ptr: f!(header_rows_ptr),
            header_rows_len: f!(header_rows_len),
            image_table: f!(image_table),
            image_count: f!(image_count),
            image_entry_size: f!(image_entry_size),
            entry_begin: f!(entry_begin),
            entry_end: f!(entry_end),
            entry_delta: f!(entry_delta),
            entry_name_len: f!(entry_name_len),
            entry_method_id: f!(entry_method_id),
            entry_name_ptr: f!(entry_name_ptr),
        };
        layout.check()?;
        Ok(Self {
            memory,
            descriptor,
            layout,
            reads: Cell::new(0),
            stats: Cell::new(ReadStats::default()),
        })
    }

    /// The checked layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Reads made by lookups so far.
    pub fn stats(&self) -> ReadStats {
        self.stats.get()
    }

    /// The range-map roots of the managers registered now.
    pub fn managers(&self) -> Result<Vec<u64>, RemoteError> {
        Ok(self.entries()?.into_iter().map(|(_, root)| root).collect())
    }

    /// The managers registered now: each one's entry in the descriptor and
    /// its range-map root.
    fn entries(&self) -> Result<Vec<(usize, u64)>, RemoteError> {
        let mut bytes = [0u8; 8 * MAX_MANAGERS];
        self.read(
            self.descriptor + offset_of!(Descriptor, managers) as u64,
            &mut bytes,
        )?;
        let mut entries = Vec::with_capacity(MAX_MANAGERS);
        for (index, chunk) in bytes.chunks_exact(8).enumerate() {
            let root = read_at(chunk, 0);
            if root != 0 {
                entries.push((index, check_ptr(root, 4096, "manager root")?));
            }
        }
        Ok(entries)
    }

    /// The names the manager at descriptor entry `index` gave stub kinds
    /// `first..first + out.len()`, from their labels: one read. `None` for a
    /// kind it did not name, and for a label read while it was written or
    /// cleared (a NUL in its range).
    fn read_labels(
        &self,
        index: usize,
        first: u8,
        out: &mut [Option<StubKindName>],
    ) -> Result<(), RemoteError> {
        const LABEL: usize = size_of::<StubLabel>();
        let mut bytes = [0u8; LABEL * MAX_STUB_KIND as usize];
        let bytes = &mut bytes[..LABEL * out.len()];
        let Some(slot) = usize::from(first).checked_sub(1) else {
            return Err(RemoteError::Corrupt {
                what: "stub kind 0",
                addr: self.descriptor + offset_of!(Descriptor, stub_labels) as u64,
            });
        };
        let at =
            offset_of!(Descriptor, stub_labels) + (index * MAX_STUB_KIND as usize + slot) * LABEL;
        self.read(self.descriptor + at as u64, bytes)?;
        for (name, label) in out.iter_mut().zip(bytes.chunks_exact(LABEL)) {
            let lens = read_u32_at(label, offset_of!(StubLabel, lens));
            *name = StubKindName::from_label(lens, &label[offset_of!(StubLabel, bytes)..]);
        }
        Ok(())
    }

    /// Every registered manager's range-map root, with the names it gave
    /// its stub kinds, (kind, name) for each kind named. One read per
    /// manager, and the managers read again; [`RemoteError::Changing`] if
    /// managers came and went through [`RETRIES`] attempts.
    pub fn stub_names(&self) -> Result<Vec<ManagerStubNames>, RemoteError> {
        for _ in 0..RETRIES {
            let entries = self.entries()?;
            let mut managers = Vec::with_capacity(entries.len());
            for &(index, root) in &entries {
                let mut labels: [Option<StubKindName>; MAX_STUB_KIND as usize] = Default::default();
                self.read_labels(index, 1, &mut labels)?;
                let named = (1..=MAX_STUB_KIND)
                    .zip(labels)
                    .filter_map(|(kind, name)| Some((kind, name?)))
                    .collect();
                managers.push((root, named));
            }
            // A manager dropped while its labels were read, and its entry
            // taken by another, would pair its root with the other's names.
            if self.entries()? == entries {
                return Ok(managers);
            }
        }
        Err(RemoteError::Changing { what: "managers" })
    }

    /// What `ip` is in the process: a method (id, name, start, offset), a stub,
    /// an image, nothing, or unknown while the host keeps changing the maps.
    /// Bounded: per attempt, one read of the managers, then for each manager
    /// the map's sequence, five levels, at most [`MAX_FRAGMENTS`] fragments, the
    /// heap's sequence, at most two start words and two end words in v2 (at
    /// most [`V1_MAX_WORDS`] and as many end words in v1), the prefix, the
    /// header, the name and the two sequences again; for a stub, its kind's
    /// label and the managers again instead of the header and the name.
    pub fn resolve(&self, ip: u64) -> Result<Resolution, RemoteError> {
        let before = self.reads.get();
        let mut stats = self.stats.get();
        let mut answer = Ok(Resolution::Unknown(Unknown::Changing));
        for _ in 0..RETRIES {
            match self.attempt(ip) {
                Ok(found) => {
                    answer = Ok(found);
                    break;
                }
                Err(Fail::Stale) => stats.retries += 1,
                Err(Fail::Error(e)) => {
                    answer = Err(e);
                    break;
                }
            }
        }
        let reads = self.reads.get() - before;
        stats.lookups += 1;
        stats.reads += reads;
        stats.max_reads = stats.max_reads.max(reads);
        self.stats.set(stats);
        answer
    }

    /// One attempt over every registered manager.
    fn attempt(&self, ip: u64) -> Result<Resolution, Fail> {
        let entries = self.entries()?;
        let roots: Vec<u64> = entries.iter().map(|&(_, root)| root).collect();
        for &(index, root) in &entries {
            match self.attempt_in(root, ip) {
                Ok(Resolution::Nothing) => continue,
                Ok(Resolution::Stub {
                    heap_id,
                    start,
                    offset,
                    size,
                    kind,
                    name: _,
                }) => {
                    let mut name = [None];
                    self.read_labels(index, kind, &mut name)?;
                    // No sequence covers the labels: a manager dropped
                    // since, whose entry another took and named, shows as
                    // a changed managers array. Then the name may be the
                    // other's: try again.
                    if self.managers()? != roots {
                        return Err(Fail::Stale);
                    }
                    let [name] = name;
                    return Ok(Resolution::Stub {
                        heap_id,
                        start,
                        offset,
                        size,
                        kind,
                        name,
                    });
                }
                Ok(found) => return Ok(found),
                // A manager dropped during the attempt: its entry is cleared
                // before its map is freed, so an error read from the freed
                // map comes with a changed managers array. That is a change,
                // not corruption: try again.
                Err(Fail::Error(e)) => {
                    return if self.managers()? == roots {
                        Err(Fail::Error(e))
                    } else {
                        Err(Fail::Stale)
                    };
                }
                Err(Fail::Stale) => return Err(Fail::Stale),
            }
        }
        Ok(Resolution::Nothing)
    }

    /// One attempt in the range map at `root`.
    fn attempt_in(&self, root: u64, ip: u64) -> Result<Resolution, Fail> {
        let seq_addr = root + self.layout.root_seq;
        let seq = self.read_u64(seq_addr)?;
        if seq & 1 != 0 {
            return Err(Fail::Stale);
        }
        let found = self.find_fragment(root, ip);
        let fragment = match found {
            Ok(Some(fragment)) => fragment,
            Ok(None) => return self.confirm(seq_addr, seq, Ok(Resolution::Nothing)),
            Err(e) => return self.confirm(seq_addr, seq, Err(e)),
        };
        let answer = match self.value_kind(&fragment) {
            Ok(true) => self.in_heap(&fragment, ip),
            Ok(false) => self
                .image_method(&fragment, ip)
                .map(|method| Resolution::Image {
                    begin: fragment.begin,
                    end: fragment.end,
                    offset: ip - fragment.begin,
                    method,
                })
                .map_err(Fail::Error),
            Err(e) => Err(Fail::Error(e)),
        };
        match answer {
            Err(Fail::Stale) => Err(Fail::Stale),
            Err(Fail::Error(e)) => self.confirm(seq_addr, seq, Err(e)),
            Ok(found) => self.confirm(seq_addr, seq, Ok(found)),
        }
    }

    /// Turns a result into the attempt's answer if the sequence at `addr` still
    /// reads `seq`; otherwise the attempt saw a change and is stale.
    fn confirm(
        &self,
        addr: u64,
        seq: u64,
        result: Result<Resolution, RemoteError>,
    ) -> Result<Resolution, Fail> {
        if self.read_u64(addr)? != seq {
            return Err(Fail::Stale);
        }
        result.map_err(Fail::Error)
    }

    /// The fragment of the section containing `ip` in the map at `root`.
    fn find_fragment(&self, root: u64, ip: u64) -> Result<Option<Fragment>, RemoteError> {
        if ip >> ADDRESS_BITS != 0 {
            return Ok(None);
        }
        let mut level = root;
        for depth in (1..LEVELS).rev() {
            let entry = self.read_u64(level + 8 * index(ip, depth))?;
            if entry == 0 {
                return Ok(None);
            }
            level = check_ptr(entry, 4096, "range-map level")?;
        }
        let mut next = self.read_u64(level + 8 * index(ip, 0))?;
        for _ in 0..MAX_FRAGMENTS {
            if next == 0 {
                return Ok(None);
            }
            let fragment = self.read_fragment(next)?;
            if fragment.begin <= ip && ip < fragment.end {
                return Ok(Some(fragment));
            }
            next = read_at(&fragment.bytes, self.layout.fragment_next);
        }
        Err(RemoteError::Corrupt {
            what: "fragment list longer than the cap",
            addr: next,
        })
    }

    fn read_fragment(&self, addr: u64) -> Result<Fragment, RemoteError> {
        let addr = check_ptr(addr, 64, "fragment")?;
        let mut bytes = [0u8; MAX_STRUCT];
        self.read(addr, &mut bytes[..self.layout.fragment_size])?;
        let begin = read_at(&bytes, self.layout.fragment_begin);
        let end = read_at(&bytes, self.layout.fragment_end);
        if begin >= end || end - begin > 1 << 32 || (end - 1) >> ADDRESS_BITS != 0 {
            return Err(RemoteError::Corrupt {
                what: "fragment bounds",
                addr,
            });
        }
        Ok(Fragment { begin, end, bytes })
    }

    /// Whether the fragment holds a heap (true) or an image (false).
    fn value_kind(&self, fragment: &Fragment) -> Result<bool, RemoteError> {
        match read_at(&fragment.bytes, self.layout.fragment_tag) {
            tag if tag == self.layout.tag_heap => Ok(true),
            tag if tag == self.layout.tag_image => Ok(false),
            tag => Err(RemoteError::Corrupt {
                what: "section tag",
                addr: tag,
            }),
        }
    }

    /// The method of the function holding `ip` in the image of `fragment`:
    /// a binary search of its table (at most 25 entry reads), then its name.
    /// Every entry read is checked against the image and its neighbours'
    /// order; the caller confirms the range map's sequence afterwards.
    fn image_method(
        &self,
        fragment: &Fragment,
        ip: u64,
    ) -> Result<Option<ImageMethodFound>, RemoteError> {
        let l = &self.layout;
        let count = read_at(&fragment.bytes, l.image_count);
        if count == 0 {
            return Ok(None);
        }
        let table = check_ptr(read_at(&fragment.bytes, l.image_table), 8, "image table")?;
        if count > MAX_IMAGE_FUNCTIONS {
            return Err(RemoteError::Corrupt {
                what: "image table length",
                addr: table,
            });
        }
        let size = fragment.end - fragment.begin;
        let rel = ip - fragment.begin;
        let mut entry = [0u8; MAX_ENTRY];
        let mut read_entry = |i: u64| -> Result<(u64, u64), RemoteError> {
            let addr = table + i * l.image_entry_size as u64;
            self.read(addr, &mut entry[..l.image_entry_size])?;
            let begin = u64::from(read_u32_at(&entry, l.entry_begin));
            let end = u64::from(read_u32_at(&entry, l.entry_end));
            if begin >= end || end > size {
                return Err(RemoteError::Corrupt {
                    what: "image table entry",
                    addr,
                });
            }
            Ok((begin, end))
        };
        // The last entry that begins at or before `rel`.
        let (mut lo, mut hi) = (0, count);
        let mut lo_begin = None;
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            let (begin, _) = read_entry(mid)?;
            if begin <= rel {
                lo = mid;
                lo_begin = Some(begin);
            } else {
                hi = mid;
            }
        }
        let (begin, end) = read_entry(lo)?;
        if lo_begin.is_some_and(|b| b != begin) {
            return Err(RemoteError::Corrupt {
                what: "image table entry",
                addr: table + lo * l.image_entry_size as u64,
            });
        }
        if rel < begin || rel >= end {
            return Ok(None);
        }
        let name_len = (read_u32_at(&entry, l.entry_name_len) as usize).min(MAX_NAME);
        let mut name = vec![0u8; name_len];
        if name_len > 0 {
            let ptr = check_ptr(read_at(&entry, l.entry_name_ptr), 1, "name")?;
            self.read(ptr, &mut name)?;
        }
        Ok(Some(ImageMethodFound {
            start: fragment.begin + begin,
            size: end - begin,
            offset: u64::from(read_u32_at(&entry, l.entry_delta)) + rel - begin,
            method_id: read_at(&entry, l.entry_method_id),
            name: String::from_utf8_lossy(&name).into_owned(),
        }))
    }

    fn heap_view(&self, fragment: &Fragment) -> Result<HeapView, RemoteError> {
        let l = &self.layout;
        let b = &fragment.bytes;
        let mut view = HeapView {
            id: 0,
            base: read_at(b, l.heap_base),
            words: check_ptr(read_at(b, l.heap_words), 4096, "start map")?,
            ends: check_ptr(read_at(b, l.heap_ends), 4096, "end map")?,
            word_count: u64::from(read_u32_at(b, l.heap_word_count)),
            version: b.get(l.heap_version).copied().unwrap_or(0),
            seq: 0,
        };
        // The trailer after the end map: the change sequence and the heap id.
        view.seq = view.ends + 8 * view.word_count + l.heap_seq as u64;
        let span_ok = view.base == fragment.begin
            && view.word_count <= MAX_WORDS
            && view.word_count * 256 >= fragment.end - fragment.begin
            && view.word_count * 256 < fragment.end - fragment.begin + 256;
        if !span_ok || !matches!(view.version, 1 | 2) {
            return Err(RemoteError::Corrupt {
                what: "heap section",
                addr: view.base,
            });
        }
        Ok(view)
    }

    /// The block containing `ip` in the heap of `fragment`, checked against the
    /// heap's sequence.
    fn in_heap(&self, fragment: &Fragment, ip: u64) -> Result<Resolution, Fail> {
        let mut heap = self.heap_view(fragment)?;
        let seq = self.read_trailer(&mut heap)?;
        if seq & 1 != 0 {
            return Err(Fail::Stale);
        }
        let found = self.block(&heap, ip);
        let found = match found {
            Err(Fail::Stale) => return Err(Fail::Stale),
            Err(Fail::Error(e)) => Err(e),
            Ok(found) => Ok(found),
        };
        self.confirm(heap.seq, seq, found)
    }

    /// Reads the heap's trailer in one read: fills in its id and returns its
    /// change sequence.
    fn read_trailer(&self, heap: &mut HeapView) -> Result<u64, RemoteError> {
        let mut trailer = [0u8; 16];
        let at = heap.seq - self.layout.heap_seq as u64;
        self.read(at, &mut trailer)?;
        heap.id = read_at(&trailer, self.layout.heap_id);
        Ok(read_at(&trailer, self.layout.heap_seq))
    }

    fn block(&self, heap: &HeapView, ip: u64) -> Result<Resolution, Fail> {
        let offset = ip - heap.base;
        let words = RemoteWords::new(self, heap.words, heap.word_count as usize);
        let found = if heap.version == 1 {
            match find_v1_capped(&words, offset, V1_MAX_WORDS) {
                Capped::Found(start) => Ok((start, false)),
                Capped::Nothing => Err(Resolution::Nothing),
                Capped::TooFar => Err(Resolution::Unknown(Unknown::TooFar)),
            }
        } else {
            find_v2_placed(&words, offset)
                .map(|(start, origin)| (start, origin == V2Origin::Covered))
                .ok_or(Resolution::Nothing)
        };
        words.check()?;
        let (start, covered) = match found {
            Ok(found) => found,
            Err(answer) => return Ok(answer),
        };
        if start < self.layout.prefix_bytes || start > offset {
            return if start < self.layout.prefix_bytes {
                Ok(Resolution::Nothing)
            } else {
                Err(RemoteError::Corrupt {
                    what: "start after the address",
                    addr: heap.base + start,
                }
                .into())
            };
        }
        if !covered {
            let lo = if heap.version == 1 {
                start
            } else {
                start.max((offset - offset % 256).saturating_sub(256))
            };
            if self.ends_between(heap, lo, offset)? {
                return Ok(Resolution::Nothing);
            }
        }
        let start_addr = heap.base + start;
        let mut prefix = [0u8; 16];
        self.read(start_addr - self.layout.prefix_bytes, &mut prefix)?;
        let size = read_at(&prefix, self.layout.prefix_size);
        let slot = read_at(&prefix, self.layout.prefix_slot);
        if size == 0 || offset - start >= size || start + size > heap.word_count * 256 {
            return Err(RemoteError::Corrupt {
                what: "block size",
                addr: start_addr,
            }
            .into());
        }
        if slot <= self.layout.max_stub_kind {
            let word = self.end_words(heap, start / 256, 1)?;
            // SAFETY: `word` holds the end word covering `start`, offset 0 of the view.
            let stub = unsafe { RawEnds::over(&word).is_stub(start % 256) };
            if !stub || slot == 0 {
                return Err(RemoteError::Corrupt {
                    what: "stub slot",
                    addr: start_addr,
                }
                .into());
            }
            return Ok(Resolution::Stub {
                heap_id: heap.id,
                start: start_addr,
                offset: offset - start,
                size,
                kind: slot as u8,
                name: None,
            });
        }
        let header = check_ptr(slot, 8, "code header")?;
        let mut bytes = [0u8; MAX_STRUCT];
        let header_len = [
            self.layout.header_method_id,
            self.layout.header_code_size,
            self.layout.header_name_ptr,
            self.layout.header_name_len,
            self.layout.header_rows_ptr,
            self.layout.header_rows_len,
        ]
        .into_iter()
        .max()
        .unwrap_or(0)
            + 8;
        self.read(header, &mut bytes[..header_len])?;
        if read_at(&bytes, self.layout.header_code_size) != size {
            return Err(RemoteError::Corrupt {
                what: "header size differs from the prefix",
                addr: header,
            }
            .into());
        }
        let name_len = (read_at(&bytes, self.layout.header_name_len) as usize).min(MAX_NAME);
        let mut name = vec![0u8; name_len];
        if name_len > 0 {
            let name_ptr = check_ptr(read_at(&bytes, self.layout.header_name_ptr), 1, "name")?;
            self.read(name_ptr, &mut name)?;
        }
        let rows = self.rows(
            read_at(&bytes, self.layout.header_rows_ptr),
            read_at(&bytes, self.layout.header_rows_len),
            size,
            header,
        )?;
        Ok(Resolution::Method(RemoteMethod {
            heap_id: heap.id,
            start: start_addr,
            offset: offset - start,
            size,
            method_id: read_at(&bytes, self.layout.header_method_id),
            name: String::from_utf8_lossy(&name).into_owned(),
            rows,
        }))
    }

    /// The `len` unwind rows at `ptr` of a method of `size` bytes whose
    /// header is at `header`, in one read, each checked: offsets rising and
    /// inside the method, every field one the layout defines.
    fn rows(
        &self,
        ptr: u64,
        len: u64,
        size: u64,
        header: u64,
    ) -> Result<Vec<UnwindRow>, RemoteError> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let corrupt = || RemoteError::Corrupt {
            what: "unwind rows",
            addr: header,
        };
        if len > MAX_ROWS as u64 {
            return Err(corrupt());
        }
        // The descriptor's row size was checked to be this one's.
        let ptr = check_ptr(ptr, align_of::<UnwindRow>() as u64, "unwind rows")?;
        let mut bytes = vec![0u8; len as usize * size_of::<UnwindRow>()];
        self.read(ptr, &mut bytes)?;
        let rows: Vec<UnwindRow> = bytes
            .chunks_exact(size_of::<UnwindRow>())
            .map(|b| {
                let half = |at: usize| i16::from_ne_bytes([b[at], b[at + 1]]);
                UnwindRow {
                    offset: u32::from_ne_bytes([b[0], b[1], b[2], b[3]]),
                    cfa: i32::from_ne_bytes([b[4], b[5], b[6], b[7]]),
                    ra: half(8),
                    fp: half(10),
                    kind: b[12],
                    base: b[13],
                    fp_rule: b[14],
                    has_ra: b[15],
                }
            })
            .collect();
        let valid = rows.iter().all(|r| {
            u64::from(r.offset) < size
                && r.kind <= UnwindRow::UNSUPPORTED
                && r.base <= UnwindRow::BASE_FP
                && r.fp_rule <= UnwindRow::FP_LOST
                && r.has_ra <= UnwindRow::RA_LINK
        }) && rows.windows(2).all(|w| w[0].offset < w[1].offset);
        if !valid {
            return Err(corrupt());
        }
        Ok(rows)
    }

    /// `count` end words from word `first`, in one read.
    fn end_words(
        &self,
        heap: &HeapView,
        first: u64,
        count: u64,
    ) -> Result<Vec<AtomicU64>, RemoteError> {
        let mut bytes = vec![0u8; 8 * count as usize];
        self.read(heap.ends + 8 * first, &mut bytes)?;
        Ok(bytes
            .chunks_exact(8)
            .map(|w| AtomicU64::new(read_at(w, 0)))
            .collect())
    }

    /// Whether the first block end at or after `lo` comes before `a`: the
    /// heap's own scan ([`RawEnds`]) over the end words from `lo`'s to `a`'s,
    /// copied in one read (at most two in v2; in v1 at most
    /// [`V1_MAX_WORDS`] + 1, as the start walk is capped).
    fn ends_between(&self, heap: &HeapView, lo: u64, a: u64) -> Result<bool, RemoteError> {
        let first = lo / 256;
        let words = self.end_words(heap, first, a / 256 - first + 1)?;
        let base = 256 * first;
        // SAFETY: `words` covers offsets `base ..= a`, and lives across the call.
        Ok(unsafe { RawEnds::over(&words).ends_between(lo - base, a - base) })
    }

    /// Every section of every registered manager, in address order. Retried
    /// while the host changes a map; [`RemoteError::Corrupt`] past the caps.
    pub fn sections(&self) -> Result<Vec<RemoteSection>, RemoteError> {
        let mut all = Vec::new();
        for root in self.managers()? {
            let seq_addr = root + self.layout.root_seq;
            let mut listed = None;
            for _ in 0..RETRIES {
                let seq = self.read_u64(seq_addr)?;
                if seq & 1 != 0 {
                    continue;
                }
                let walked = self.walk(root);
                if self.read_u64(seq_addr)? == seq {
                    listed = Some(walked?);
                    break;
                }
            }
            all.extend(listed.ok_or(RemoteError::Corrupt {
                what: "range map kept changing",
                addr: root,
            })?);
        }
        all.sort_by_key(|s| s.begin);
        all.dedup_by_key(|s| s.begin);
        Ok(all)
    }

    fn walk(&self, root: u64) -> Result<Vec<RemoteSection>, RemoteError> {
        let mut sections: Vec<RemoteSection> = Vec::new();
        let mut stack = vec![(root, LEVELS - 1)];
        let mut visited = 0;
        let mut entries = vec![0u8; 8 * FANOUT];
        while let Some((level, depth)) = stack.pop() {
            visited += 1;
            if visited > MAX_LIST_LEVELS {
                return Err(RemoteError::Corrupt {
                    what: "more range-map levels than the cap",
                    addr: level,
                });
            }
            self.read(level, &mut entries)?;
            for chunk in entries.chunks_exact(8).rev() {
                let entry = read_at(chunk, 0);
                if entry == 0 {
                    continue;
                }
                if depth > 0 {
                    stack.push((check_ptr(entry, 4096, "range-map level")?, depth - 1));
                    continue;
                }
                let mut next = entry;
                for _ in 0..MAX_FRAGMENTS {
                    if next == 0 {
                        break;
                    }
                    let fragment = self.read_fragment(next)?;
                    if !sections.iter().any(|s| s.begin == fragment.begin) {
                        let kind = if self.value_kind(&fragment)? {
                            let mut heap = self.heap_view(&fragment)?;
                            self.read_trailer(&mut heap)?;
                            SectionKind::Heap {
                                id: heap.id,
                                version: heap.version,
                            }
                        } else {
                            SectionKind::Image
                        };
                        sections.push(RemoteSection {
                            begin: fragment.begin,
                            end: fragment.end,
                            kind,
                        });
                    }
                    next = read_at(&fragment.bytes, self.layout.fragment_next);
                }
            }
        }
        Ok(sections)
    }

    /// The live methods and stubs of a heap section, in address order, each
    /// confirmed by its own lookup (a block that changes while it is listed is
    /// left out). Images list nothing.
    pub fn blocks(&self, section: &RemoteSection) -> Result<Vec<Resolution>, RemoteError> {
        if section.kind == SectionKind::Image {
            return Ok(Vec::new());
        }
        let root = self.managers()?;
        let mut fragment = None;
        for root in root {
            if let Some(f) = self.find_fragment(root, section.begin)? {
                fragment = Some(f);
                break;
            }
        }
        let Some(fragment) = fragment else {
            return Ok(Vec::new());
        };
        let heap = self.heap_view(&fragment)?;
        let mut blocks = Vec::new();
        let mut chunk = vec![0u8; 4 * LIST_CHUNK_WORDS];
        let mut first = 0;
        while first < heap.word_count as usize {
            let n = LIST_CHUNK_WORDS.min(heap.word_count as usize - first);
            self.read(heap.words + 4 * first as u64, &mut chunk[..4 * n])?;
            let words = ChunkWords::from_bytes(&chunk[..4 * n]);
            for start in Starts::new(&words) {
                let start = start + 256 * first as u64;
                {
                    if blocks.len() >= MAX_LIST_METHODS {
                        return Ok(blocks);
                    }
                    let at = heap.base + start;
                    match self.resolve(at)? {
                        Resolution::Method(m) if m.start == at => {
                            blocks.push(Resolution::Method(m))
                        }
                        stub @ Resolution::Stub { start, .. } if start == at => blocks.push(stub),
                        _ => {}
                    }
                }
            }
            first += n;
        }
        Ok(blocks)
    }

    fn read_u64(&self, addr: u64) -> Result<u64, RemoteError> {
        let mut bytes = [0u8; 8];
        self.read(addr, &mut bytes)?;
        Ok(u64::from_ne_bytes(bytes))
    }
}

impl<M: Memory> Memory for RemoteReader<M> {
    /// Reads through the reader's memory, counting the read.
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), RemoteError> {
        self.reads.set(self.reads.get() + 1);
        self.memory.read(addr, buf)
    }
}

impl Layout {
    /// Checks that every offset leaves room for its value inside its struct.
    fn check(&self) -> Result<(), RemoteError> {
        let bad = |what| Err(RemoteError::BadDescriptor { what });
        if !(32..=MAX_STRUCT).contains(&self.fragment_size) || !self.root_seq.is_multiple_of(8) {
            return bad("fragment size");
        }
        let in_fragment = [
            (self.fragment_begin, 8),
            (self.fragment_end, 8),
            (self.fragment_next, 8),
            (self.fragment_tag, 8),
            (self.heap_base, 8),
            (self.heap_words, 8),
            (self.heap_ends, 8),
            (self.heap_word_count, 4),
            (self.heap_version, 1),
            (self.image_table, 8),
            (self.image_count, 8),
        ];
        if in_fragment
            .iter()
            .any(|&(off, width)| off + width > self.fragment_size)
        {
            return bad("fragment offsets");
        }
        if self.heap_seq + 8 > 16 || self.heap_id + 8 > 16 {
            return bad("heap trailer offsets");
        }
        if self.prefix_size + 8 > 16 || self.prefix_slot + 8 > 16 {
            return bad("prefix offsets");
        }
        let in_header = [
            self.header_method_id,
            self.header_code_size,
            self.header_name_ptr,
            self.header_name_len,
            self.header_rows_ptr,
            self.header_rows_len,
        ];
        if in_header.iter().any(|&off| off + 8 > MAX_STRUCT) {
            return bad("header offsets");
        }
        let size = self.image_entry_size;
        let in_entry = [
            (self.entry_begin, 4),
            (self.entry_end, 4),
            (self.entry_delta, 4),
            (self.entry_name_len, 4),
            (self.entry_method_id, 8),
            (self.entry_name_ptr, 8),
        ];
        if !(8..=MAX_ENTRY).contains(&size) || in_entry.iter().any(|&(off, w)| off + w > size) {
            return bad("image table offsets");
        }
        Ok(())
    }
}
