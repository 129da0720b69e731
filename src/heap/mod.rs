//! The executable code heap: reserve, write, publish, abort and free compiled
//! code, and find the block containing any instruction pointer, lock-free.
//!
//! Every block is laid out as `[code size][header slot][code...]`. The two prefix
//! words sit right before the code start, so a lookup checks the block's extent
//! and kind from the same cache line. The slot holds a pointer to the block's
//! [`CodeHeader`] (kept outside executable memory), or a stub kind 1..=15.

mod alloc;
pub(crate) mod end_storage;
pub(crate) mod end_words;
mod error;
mod frame_registration;
pub(crate) mod header;
pub(crate) mod lookup;
mod memory;
mod names;
mod patch;
mod reservation;
mod slab;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, VecDeque};
use std::mem::ManuallyDrop;
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

pub use alloc::PREFIX;
pub use error::HeapError;
use frame_registration::FrameRegistration;
pub use header::CodeHeader;
use header::{HostInfo, NewHeader, Registrations};
use names::NameArena;
use slab::HeaderSlab;

pub use crate::info::{CodeInfo, DebugEntry, EhFrame, GcInfo, InfoError, JitKind, UnwindEntry};
pub use memory::{CoreSync, MemoryMode, core_sync};
pub use reservation::{PublishRefused, Reservation};

use crate::change_seq::ChangeSeq;
use crate::epoch::{Domain, ForeignGuard, Guard};
use crate::events::{
    BlockId, CodeEvent, CodeFree, CodeLoad, CodeMove, Listeners, current_tid, monotonic_ns,
};
#[cfg(feature = "gdb-jit")]
use crate::gdb::GdbRegistration;
use crate::hex::hex_struct;
use crate::map_words::MmapWords;
use crate::nibble::encoding::MAX_SPAN;
use crate::nibble::{MapVersion, MapWriter, NibbleMap};
use crate::unwind::UnwindRow;
use alloc::FreeSpace;
use end_storage::EndMap;
use lookup::prefix_at;
pub(crate) use lookup::{HeapLookup, Hit};
use memory::CodeMemory;
use patch::word_stores;

/// Granularity of committing memory as the heap grows (small pages).
const COMMIT_CHUNK: u64 = 64 * 1024;
/// Retired blocks accumulated before a free tries to reclaim.
const RECLAIM_BATCH: usize = 32;
/// Retired extent bytes accumulated before a free tries to reclaim.
const RECLAIM_BYTES: u64 = 1 << 20;
/// Moves remembered, so that freeing a moved block's old reference is told apart
/// from a double free.
const MOVES_REMEMBERED: usize = 4096;
/// Largest stub kind; slot values above it are header pointers.
pub const MAX_STUB_KIND: u8 = 15;

/// A stub block's kind, 1 to [`MAX_STUB_KIND`]: the host's to name (precode,
/// jump stub, dispatch cell), stored in the block's header slot where larger
/// values are header pointers. Validated once, when it is made, so a publish
/// cannot be given a bad one.
///
/// ```
/// use jitmap::heap::StubKind;
/// const PRECODE: StubKind = StubKind::new(1).unwrap();
/// assert_eq!(PRECODE.get(), 1);
/// assert!(StubKind::new(0).is_none() && StubKind::new(16).is_none());
/// assert!(StubKind::try_from(16u8).is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StubKind(u8);

impl StubKind {
    /// `kind`, if it is 1 to [`MAX_STUB_KIND`].
    pub const fn new(kind: u8) -> Option<Self> {
        if kind >= 1 && kind <= MAX_STUB_KIND {
            Some(Self(kind))
        } else {
            None
        }
    }

    /// The kind's number.
    pub const fn get(self) -> u8 {
        self.0
    }
}

impl TryFrom<u8> for StubKind {
    type Error = HeapError;

    fn try_from(kind: u8) -> Result<Self, HeapError> {
        Self::new(kind).ok_or(HeapError::BadStubKind { kind })
    }
}

impl std::fmt::Display for StubKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// How to build a heap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapConfig {
    /// Bytes to reserve (rounded up to pages); under 4 GiB.
    pub span: u64,
    /// Nibble-map version.
    pub version: MapVersion,
    /// Memory mapping mode.
    pub mode: MemoryMode,
    /// Default code alignment: a power of two, at least 8 (the header slot is a
    /// pointer and must be aligned), at most the page size.
    pub align: u64,
    /// Back large heaps and maps with transparent huge pages where the system
    /// allows (RWX mode): fewer TLB misses for lookups of random addresses, at the
    /// cost of committing memory a huge page at a time, and a heap of at
    /// least one huge page: 2 MiB on 4 KiB-page kernels, 32 MiB on 16 KiB
    /// and 512 MiB on 64 KiB ones (aarch64), where a first write may fault
    /// in that much. Turn it off for small heaps there.
    pub huge_pages: bool,
    /// Register each method's `.eh_frame` ([`CodeInfo::eh_frame`]) with the
    /// process's unwinder when it is published, so panics, C++ exceptions and
    /// backtraces unwind through JIT frames. The host builds the section for the
    /// code's final address ([`Reservation::address`]); such a method cannot move.
    /// The registration is withdrawn when the method is reclaimed. It uses
    /// libgcc's `__register_frame` (a whole `.eh_frame` section per call), the
    /// unwinder of Linux GNU targets; a host that links LLVM's libunwind instead,
    /// which takes one FDE per call, must register its frames itself.
    pub register_unwind: bool,
    /// Announce each method to debuggers through the GDB JIT interface (an
    /// in-memory ELF object naming it), withdrawn when it is reclaimed. Needs
    /// the `gdb-jit` feature, which exports the interface's two symbols;
    /// without it a heap that asks is refused with
    /// [`HeapError::GdbJitUnavailable`].
    pub gdb_jit: bool,
    /// Bytes kept free after each block's code, at most
    /// [`MAX_UNWIND_ROOM`]. `perf inject --jit` places a method's unwinding
    /// tables right after its code, and perf's DWARF unwinder
    /// (`perf record --call-graph dwarf`) reads them there, through the
    /// method's mapping. With no room, the next method's code lies there:
    /// the jitdump then leaves the tables out of the mapping
    /// ([`CodeLoad::room`](crate::events::CodeLoad::room)) and perf stops at the
    /// method. 256 bytes fit the tables of a method with a few dozen CFI rows.
    /// 0 by default: the room costs heap space and only perf uses it.
    pub unwind_room: u64,
}

/// The most [`HeapConfig::unwind_room`] a heap takes.
pub const MAX_UNWIND_ROOM: u64 = 1 << 16;

impl Default for HeapConfig {
    fn default() -> Self {
        Self {
            span: 64 << 20,
            version: MapVersion::V2,
            mode: MemoryMode::Rwx,
            align: 16,
            huge_pages: true,
            register_unwind: false,
            gdb_jit: false,
            unwind_room: 0,
        }
    }
}

/// A handle to a published block, used to free it. Carries a generation, so a
/// stale handle is recognised as a double free.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CodeRef {
    heap: u64,
    start: usize,
    size: u64,
    generation: u64,
}

impl std::fmt::Debug for CodeRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        hex_struct!(f, "CodeRef", "start" => self.start, "size" => self.size, "heap" => self.heap, "generation" => self.generation)
    }
}

impl CodeRef {
    /// Address of the first code byte.
    pub fn start(&self) -> usize {
        self.start
    }

    /// Code size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The block's identity in code events ([`BlockId`]): its heap and
    /// generation.
    ///
    /// ```
    /// # use jitmap::{CodeHeap, CodeInfo, Domain, HeapConfig, JitKind};
    /// let heap = CodeHeap::new(HeapConfig { span: 1 << 20, ..HeapConfig::default() }, &Domain::new(1))?;
    /// let mut r = heap.reserve(1)?;
    /// r.code_mut()[0] = 0xC3;
    /// let code = r.publish(CodeInfo::new(1, "f", JitKind::Optimized))?;
    /// assert_eq!(code.block_id().heap, heap.id());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn block_id(&self) -> BlockId {
        BlockId {
            heap: self.heap,
            generation: self.generation,
        }
    }

    /// The reference as four numbers (heap id, start, size, generation), for
    /// a host that keeps it outside Rust, such as the C ABI.
    ///
    /// ```
    /// # use jitmap::{CodeInfo, CodeRef, ExecutionManager, HeapConfig, JitKind};
    /// let manager = ExecutionManager::new(4);
    /// let heap = manager.create_heap(HeapConfig { span: 1 << 20, ..HeapConfig::default() })?;
    /// let mut r = heap.reserve(1)?;
    /// r.code_mut()[0] = 0xC3;
    /// let code = r.publish(CodeInfo::new(1, "f", JitKind::Optimized))?;
    /// let raw = code.to_raw();
    /// assert_eq!(CodeRef::from_raw(raw), code);
    /// // A forged reference is refused, never acted on.
    /// let forged = CodeRef::from_raw([raw[0], raw[1], raw[2] + 16, raw[3]]);
    /// assert!(heap.free(forged).is_err());
    /// heap.free(code)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn to_raw(self) -> [u64; 4] {
        [self.heap, self.start as u64, self.size, self.generation]
    }

    /// Rebuilds a reference from [`CodeRef::to_raw`]'s numbers. Safe for any
    /// numbers: every heap operation checks a reference against its live
    /// blocks (heap, start, size and generation) and refuses one it did not
    /// hand out with [`HeapError::ForeignRef`], [`HeapError::UnknownRef`],
    /// [`HeapError::DoubleFree`] or [`HeapError::Moved`].
    pub fn from_raw(raw: [u64; 4]) -> Self {
        Self {
            heap: raw[0],
            start: raw[1] as usize,
            size: raw[2],
            generation: raw[3],
        }
    }

    /// The block's entry as a function pointer of the signature `F`, to call
    /// from Rust or to store in a [`crate::CallCell`] (see [`crate::call`]).
    ///
    /// # Safety
    /// The block's first byte is the entry of a function with `F`'s ABI and
    /// signature, and nothing calls the pointer after the block is freed and
    /// every executor has passed a quiescent point.
    pub unsafe fn entry<F: crate::call::FnPtr>(&self) -> F {
        // SAFETY: the caller's contract.
        unsafe { F::from_address(self.start) }
    }
}

/// What a lookup found: the start and offset come from the maps; the size
/// and kind are read from the block's prefix only when asked for.
#[derive(Clone, Copy)]
pub struct HeapBlock<'a> {
    hit: Hit<'a>,
}

impl<'a> HeapBlock<'a> {
    /// Address of the first code byte.
    #[inline]
    pub fn start(&self) -> usize {
        self.hit.start
    }

    /// Offset of the looked-up address from the start.
    #[inline]
    pub fn offset(&self) -> u64 {
        self.hit.offset
    }

    /// Code size in bytes (reads the block's prefix).
    pub fn size(&self) -> u64 {
        self.hit.size()
    }

    /// Method (with its header) or stub (reads the block's prefix).
    pub fn kind(&self) -> BlockKind<'a> {
        self.hit.kind()
    }
}

impl std::fmt::Debug for HeapBlock<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeapBlock")
            .field("start", &crate::hex::Hex(self.start() as u64))
            .field("size", &crate::hex::Hex(self.size()))
            .field("offset", &crate::hex::Hex(self.offset()))
            .field("kind", &self.kind())
            .finish()
    }
}

/// Whether a block is a method (with its header) or a stub.
#[derive(Clone, Copy, Debug)]
pub enum BlockKind<'a> {
    /// A method and its header.
    Method(&'a CodeHeader),
    /// A stub of the given kind.
    Stub(StubKind),
}

/// A published block, as listed by [`CodeHeap::live_blocks`].
#[derive(Clone, Debug)]
pub struct LiveBlock {
    /// The reference that frees or moves it.
    pub code: CodeRef,
    /// The method's info; `None` for a stub.
    pub info: Option<Arc<CodeInfo>>,
}

/// Bytes and block counts of a heap.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeapStats {
    /// Bytes reserved.
    pub span: u64,
    /// Bytes committed (accessible).
    pub committed: u64,
    /// Bytes in extents that are reserved, published or awaiting reclamation.
    pub used: u64,
    /// Bytes in free ranges.
    pub free: u64,
    /// Largest free range.
    pub largest_free: u64,
    /// Published blocks.
    pub live_blocks: usize,
    /// Freed blocks waiting for their grace period.
    pub retired_blocks: usize,
    /// Extent bytes given back by reclamation so far.
    pub reclaimed_bytes: u64,
    /// Times the heap made every other thread serialize its instruction
    /// stream (`membarrier` `SYNC_CORE`), counted when it succeeded: once
    /// per patch (an unchanged one too), per [`CodeHeap::make_visible`],
    /// and per publish where the architecture needs it: none on x86-64;
    /// on aarch64 every publish, but a flip-mode publish of fresh pages.
    pub core_syncs: u64,
}

/// A header stored in the heap's slab, owned by the block it describes.
#[derive(Clone, Copy)]
struct HeaderPtr(NonNull<CodeHeader>);

// SAFETY: the writer's state owns the header; it is only taken out of the slab
// under the heap lock.
unsafe impl Send for HeaderPtr {}

impl HeaderPtr {
    /// The header.
    ///
    /// # Safety
    /// The header is still in the slab: its block is live, or retired and not
    /// yet reclaimed (which needs the heap lock the caller holds or excludes).
    unsafe fn get<'a>(self) -> &'a CodeHeader {
        // SAFETY: the caller's contract.
        unsafe { self.0.as_ref() }
    }
}

/// A live block, as the writer knows it: read from the maps, the block's
/// prefix and its header (a stub's generation and alignment from the stub
/// table).
#[derive(Clone, Copy)]
struct Live {
    generation: u64,
    /// Code size in bytes.
    size: u64,
    /// The alignment it was reserved with (kept by moves).
    align: u64,
    header: Option<HeaderPtr>,
}

/// What the writer keeps of a live stub (a method keeps it in its header).
#[derive(Clone, Copy)]
struct StubRecord {
    generation: u64,
    align: u64,
}

struct Retired {
    tag: u64,
    extent: Range<u64>,
    /// Code start and size, for clearing the end map.
    start: u64,
    size: u64,
    header: Option<HeaderPtr>,
}

/// What a publish puts in the slot.
pub(crate) enum Payload {
    Method(HostInfo),
    Stub(StubKind),
}

/// Writer state, serialized by the heap lock. Live methods are not listed:
/// the maps name their starts, and each one's prefix its header.
struct Writer {
    map: MapWriter<MmapWords>,
    free: FreeSpace,
    committed: u64,
    headers: HeaderSlab,
    names: NameArena,
    /// Live stubs by code start (offset).
    stubs: HashMap<u64, StubRecord>,
    /// Live methods.
    methods: usize,
    retired: Vec<Retired>,
    /// Extent bytes in `retired`.
    retired_bytes: u64,
    /// Generation of a moved block's old reference → its new start, for the last
    /// [`MOVES_REMEMBERED`] moves (oldest first in `move_order`).
    moved: HashMap<u64, usize>,
    move_order: VecDeque<u64>,
    next_generation: u64,
    reclaimed_bytes: u64,
    /// Cross-core syncs made ([`HeapStats::core_syncs`]).
    core_syncs: u64,
    /// The end of the highest extent ever published: bytes below it may have
    /// held code that a core executed (see `arch::REUSE_NEEDS_CORE_SYNC`).
    published_end: u64,
}

impl Writer {
    /// Takes a reclaimed (or never published) header out of the slab and
    /// gives its name back.
    ///
    /// # Safety
    /// `header` is in this writer's slab and no reader can reach it any more.
    unsafe fn drop_header(&mut self, header: HeaderPtr) {
        // SAFETY: the caller's contract.
        let header = unsafe { self.headers.remove(header.0) };
        if let Some(name) = header.arena_name() {
            // SAFETY: the name was inserted for this header, which is gone.
            unsafe { self.names.free(name) };
        }
    }
}

/// An executable code heap with a nibble map and lock-free lookups.
pub struct CodeHeap {
    id: u64,
    span: u64,
    align: u64,
    /// Bytes committed at a time: a huge page when huge pages back the heap,
    /// so a whole huge page is accessible when it first faults.
    commit_chunk: u64,
    /// Read side of `map` and `ends`, valid as long as both are (for the heap's life).
    lookup: HeapLookup,
    /// The executable view's first byte.
    base: usize,
    map: Arc<NibbleMap<MmapWords>>,
    domain: Arc<Domain>,
    listeners: Arc<Listeners>,
    /// Whether a stub was ever published here. Until one is, a lookup that a v2
    /// pointer word answers needs no prefix read to know it found a method.
    stubs: AtomicBool,
    /// [`HeapConfig::register_unwind`].
    register_unwind: bool,
    /// [`HeapConfig::gdb_jit`].
    gdb_jit: bool,
    /// [`HeapConfig::unwind_room`].
    unwind_room: u64,
    memory: CodeMemory,
    /// Where each block ends (see `ends`): exact lookups without code reads.
    ends: EndMap,
    writer: Mutex<Writer>,
}

impl std::fmt::Debug for CodeHeap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CodeHeap")
            .field("base", &format_args!("{:#x}", self.base()))
            .field("span", &self.span)
            .field("version", &self.map.version())
            .field("mode", &self.memory.mode())
            .finish_non_exhaustive()
    }
}

static NEXT_HEAP_ID: AtomicU64 = AtomicU64::new(1);

impl CodeHeap {
    /// Reserves a heap. Readers that look up in it must pin in `domain`.
    pub fn new(config: HeapConfig, domain: &Arc<Domain>) -> Result<Self, HeapError> {
        Self::with_listeners(config, domain, Arc::new(Listeners::default()))
    }

    /// Reserves a heap whose code events go to `listeners` (shared, for example,
    /// by all heaps of a manager).
    pub fn with_listeners(
        config: HeapConfig,
        domain: &Arc<Domain>,
        listeners: Arc<Listeners>,
    ) -> Result<Self, HeapError> {
        let page = region::page::size() as u64;
        let span = match config.span.checked_next_multiple_of(page) {
            Some(span) if config.span != 0 && span < MAX_SPAN => span,
            _ => return Err(HeapError::BadSpan { span: config.span }),
        };
        check_align(config.align)?;
        if config.unwind_room > MAX_UNWIND_ROOM {
            return Err(HeapError::BadUnwindRoom {
                room: config.unwind_room,
            });
        }
        if config.gdb_jit && !cfg!(feature = "gdb-jit") {
            return Err(HeapError::GdbJitUnavailable);
        }
        let memory = CodeMemory::reserve(span as usize, config.mode, config.huge_pages)?;
        let map = MapWriter::with_huge_pages(config.version, span, config.huge_pages)
            .map_err(HeapError::Map)?;
        // Relaxed: only uniqueness matters.
        let id = NEXT_HEAP_ID.fetch_add(1, Ordering::Relaxed);
        let ends = EndMap::new(map.map().word_count(), id, config.huge_pages)?;
        let huge_page = crate::mapping::huge_page();
        let huge_commit =
            config.huge_pages && config.mode == MemoryMode::Rwx && span >= huge_page as u64;
        // SAFETY: the view is stored in the heap next to the maps and memory it reads,
        // and is only used while the heap is alive.
        let lookup = unsafe { HeapLookup::new(map.map().words(), ends.raw(), config.version) };
        Ok(Self {
            commit_chunk: if huge_commit {
                huge_page as u64
            } else {
                COMMIT_CHUNK
            },
            lookup,
            base: memory.exec_base(),
            id,
            span,
            align: config.align,
            register_unwind: config.register_unwind,
            gdb_jit: config.gdb_jit,
            unwind_room: config.unwind_room,
            map: Arc::clone(map.map()),
            domain: Arc::clone(domain),
            listeners,
            stubs: AtomicBool::new(false),
            memory,
            ends,
            writer: Mutex::new(Writer {
                map,
                free: FreeSpace::with_granule(
                    span,
                    if config.mode == MemoryMode::FlipOnPublish {
                        page
                    } else {
                        8
                    },
                ),
                committed: 0,
                headers: HeaderSlab::new(config.huge_pages),
                names: NameArena::default(),
                stubs: HashMap::new(),
                methods: 0,
                retired: Vec::with_capacity(RECLAIM_BATCH),
                retired_bytes: 0,
                moved: HashMap::new(),
                move_order: VecDeque::new(),
                next_generation: 1,
                reclaimed_bytes: 0,
                core_syncs: 0,
                published_end: 0,
            }),
        })
    }

    /// Address of the first byte (executable view); also the map's base.
    pub fn base(&self) -> usize {
        self.base
    }

    /// Bytes reserved.
    pub fn span(&self) -> u64 {
        self.span
    }

    /// Whether `ip` lies in this heap's span.
    pub fn contains(&self, ip: usize) -> bool {
        (ip.wrapping_sub(self.base()) as u64) < self.span
    }

    /// The nibble map (offsets relative to [`CodeHeap::base`]).
    pub fn map(&self) -> &NibbleMap<MmapWords> {
        &self.map
    }

    /// The reader domain whose guards protect lookups in this heap.
    pub fn domain(&self) -> &Arc<Domain> {
        &self.domain
    }

    /// The listeners that receive this heap's code events.
    pub fn listeners(&self) -> &Arc<Listeners> {
        &self.listeners
    }

    /// Memory mode.
    pub fn mode(&self) -> MemoryMode {
        self.memory.mode()
    }

    /// Reserves `size` bytes of code at the heap's default alignment.
    pub fn reserve(&self, size: u64) -> Result<Reservation<'_>, HeapError> {
        self.reserve_aligned(size, self.align)
    }

    /// Reserves `size` bytes of code whose start is aligned to `align`.
    pub fn reserve_aligned(&self, size: u64, align: u64) -> Result<Reservation<'_>, HeapError> {
        if size == 0 {
            return Err(HeapError::ZeroSize);
        }
        let max = self.span.saturating_sub(PREFIX + self.unwind_room);
        if size > max {
            return Err(HeapError::TooLarge { size, max });
        }
        check_align(align)?;
        // The extent holds the room after the code; the code size stays `size`.
        let taken = size + self.unwind_room;
        let mut w = self.writer.lock();
        let mut placement = w.free.allocate(taken, align);
        // Reclaim before failing, and before committing more memory: retired
        // blocks never make the heap grow while their grace period has passed.
        if placement
            .as_ref()
            .is_none_or(|p| p.extent.end > w.committed)
            && self.reclaim(&mut w) > 0
        {
            if let Some(p) = placement.take() {
                w.free.release(p.extent);
            }
            placement = w.free.allocate(taken, align);
        }
        let placement = placement.ok_or(HeapError::HeapFull { size })?;
        if placement.extent.end > w.committed {
            let to = placement
                .extent
                .end
                .next_multiple_of(self.commit_chunk)
                .min(self.span);
            if let Err(e) = self.memory.commit(w.committed as usize, to as usize) {
                w.free.release(placement.extent);
                return Err(e.into());
            }
            w.committed = to;
        }
        // Reused pages may still be read-execute from their previous block.
        let extent = &placement.extent;
        if let Err(e) = self
            .memory
            .flip(extent.start as usize, extent.end as usize, false)
        {
            w.free.release(placement.extent);
            return Err(e.into());
        }
        Ok(Reservation {
            heap: self,
            start: placement.start,
            size,
            align,
            extent: placement.extent,
        })
    }

    /// Finds the block containing `ip`: exact, lock-free, no allocation, no system
    /// call; safe in a signal handler. It reads the maps only, never code memory:
    /// in v2 at most two start-map words and two end-map words; a v1 lookup walks
    /// back over the method, so its cost grows with the method's size. The
    /// block's size and kind are read on demand. A guard from another domain is
    /// refused.
    ///
    /// Inlined always, like [`ManagerGuard::find`](crate::ManagerGuard::find):
    /// left to the heuristics, a caller in another crate (the simulator's
    /// timed loop) called it, and got its answer back through memory.
    #[inline(always)]
    pub fn find<'a>(
        &'a self,
        guard: &'a Guard<'_>,
        ip: usize,
    ) -> Result<Option<HeapBlock<'a>>, ForeignGuard> {
        guard.check(&self.domain)?;
        // SAFETY: `self` outlives `'a`, and `guard` is pinned in this heap's domain
        // for `'a` (checked above).
        Ok(unsafe { self.lookup.find(self.base, ip) }.map(|hit| HeapBlock { hit }))
    }

    /// Bytes of the heap's lookup structures resident in memory: the nibble
    /// map's words and the end map's (pages never touched cost nothing).
    pub fn map_resident_bytes(&self) -> std::io::Result<usize> {
        Ok(self.map.words().resident_bytes()? + self.ends.resident_bytes()?)
    }

    /// Bytes of method headers the heap mapped itself rather than
    /// allocated: a large heap's 2 MiB huge-page chunks of headers
    /// ([`HeapConfig::huge_pages`]). A count of the allocator's bytes (such
    /// as `mallinfo2`) does not see them; add these.
    ///
    /// ```
    /// # use jitmap::{CodeHeap, CodeInfo, Domain, HeapConfig, JitKind};
    /// let heap = CodeHeap::new(HeapConfig { span: 1 << 20, ..HeapConfig::default() }, &Domain::new(1))?;
    /// let mut r = heap.reserve(1)?;
    /// r.code_mut()[0] = 0xC3;
    /// r.publish(CodeInfo::new(1, "f", JitKind::Optimized))?;
    /// // A small heap's headers come from the allocator.
    /// assert_eq!(heap.header_mapped_bytes(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn header_mapped_bytes(&self) -> usize {
        self.writer.lock().headers.mapped_bytes()
    }

    /// Bytes the lookup structures reserve: span / 64 for the nibble map plus
    /// span / 32 for the end map.
    pub fn map_reserved_bytes(&self) -> usize {
        self.map.word_count() * 4 + self.ends.reserved_bytes()
    }

    /// Whether this heap may hold stubs. Read after the Acquire load of the map
    /// word that named a block: a stub's publish sets it before its map store.
    #[inline]
    pub(crate) fn may_hold_stubs(&self) -> bool {
        // Relaxed: ordered after the caller's Acquire load of the map word, which
        // synchronizes with the Release map store that follows the flag's store.
        self.stubs.load(Ordering::Relaxed)
    }

    /// The heap's read side, for sections that look up without touching the heap.
    pub(crate) fn lookup(&self) -> HeapLookup {
        self.lookup
    }

    /// The heap's change sequence (in the end map's trailer), bracketing every
    /// change of the start and end maps for readers in other processes (see
    /// [`crate::remote`]); in-process readers rely on guards.
    fn seq(&self) -> &ChangeSeq {
        self.ends.seq()
    }

    /// The heap's id (unique in the process).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Unpublishes a block at once; its bytes and header are reused only after every
    /// guard that might have seen it has dropped.
    ///
    /// Reclamation is automatic and runs on the writer side: a free reclaims once 32
    /// blocks or 1 MiB await their grace period, and a reservation reclaims before
    /// it would commit more memory or fail. So while no reader stays pinned, what
    /// retired blocks hold is bounded by that batch. [`CodeHeap::try_reclaim`] does
    /// it on demand.
    ///
    /// A guard protects *lookups*, not execution. Threads that run code from this
    /// heap register as [`crate::Executor`]s of its domain; then freed bytes are
    /// also held until every online executor has passed a quiescent point after
    /// the free, so code that is still running, or will be returned into, stays
    /// intact.
    pub fn free(&self, code: CodeRef) -> Result<(), HeapError> {
        let offset = self.offset_of(code)?;
        let mut w = self.writer.lock();
        let live = self.check_live(&w, code, offset)?;
        if let (Some(info), _) = self.unpublish(&mut w, offset, live) {
            self.listeners.emit(CodeEvent::Free(CodeFree {
                timestamp: monotonic_ns(),
                block: code.block_id(),
                start: code.start,
                size: code.size,
                info,
            }));
        }
        if w.retired.len() >= RECLAIM_BATCH || w.retired_bytes >= RECLAIM_BYTES {
            self.reclaim(&mut w);
        }
        drop(w);
        self.listeners.throttle();
        Ok(())
    }

    /// Moves a published method to a new address with the alignment it was
    /// reserved with: copies its code and info into a new block, publishes the
    /// copy, and frees the original through the grace period, as one step under
    /// the heap lock. Emits a move event, not a load. The method's unwind rows
    /// (by code offset) come along, and its `.eh_frame` is rewritten for the
    /// new address ([`HeapError::PositionDependent`] if it cannot be).
    pub fn move_block(&self, code: CodeRef) -> Result<CodeRef, HeapError> {
        let offset = self.offset_of(code)?;
        let align = self.check_live(&self.writer.lock(), code, offset)?.align;
        let mut target = ManuallyDrop::new(self.reserve_aligned(code.size, align)?);
        let mut w = self.writer.lock();
        // Checked again: the block may have been freed while the lock was free.
        let live = match self.check_live(&w, code, offset) {
            Ok(live) => live,
            Err(e) => {
                w.free.release(target.extent.clone());
                return Err(e);
            }
        };
        let info = live.header.map(|h| {
            // SAFETY: the block is live and we hold the lock, so its header
            // cannot be retired or reclaimed meanwhile.
            let header = unsafe { h.get() };
            (header.to_info(), Box::<[_]>::from(header.unwind_rows()))
        });
        let Some((info, rows)) = info else {
            w.free.release(target.extent.clone());
            return Err(HeapError::NotAMethod { start: code.start });
        };
        if self.register_unwind && info.eh_frame.is_some() {
            w.free.release(target.extent.clone());
            return Err(HeapError::PositionDependent { start: code.start });
        }
        // The `.eh_frame` names the code's address: it moves with the code,
        // or the move is refused. (The rows are by code offset: they stay.)
        let new_start = self.base() + target.start as usize;
        let info = match &info.eh_frame {
            None => HostInfo::Shared(info),
            Some(eh) => match header::relocated_eh_frame(&eh.frame, code.start, new_start) {
                Some(frame) => HostInfo::Owned(CodeInfo {
                    eh_frame: Some(EhFrame {
                        frame,
                        header: eh.header.clone(),
                    }),
                    ..(*info).clone()
                }),
                None => {
                    w.free.release(target.extent.clone());
                    return Err(HeapError::PositionDependent { start: code.start });
                }
            },
        };
        // SAFETY: the source block is live (checked under the lock that free needs),
        // so its bytes are committed and unchanging; the target is our reservation.
        let source = unsafe {
            std::slice::from_raw_parts(
                self.memory.write_base().add(offset as usize),
                code.size as usize,
            )
        };
        target.code_mut().copy_from_slice(source);
        let published = self.publish_locked(
            &mut w,
            Publish {
                start: target.start,
                size: code.size,
                align,
                extent: target.extent.clone(),
                payload: Payload::Method(info),
                code: None,
                rows,
            },
            Announce::Later,
        );
        let (moved, notice) = match published {
            Ok(published) => published,
            Err(e) => {
                w.free.release(target.extent.clone());
                return Err(e);
            }
        };
        // The new block is published: nothing below can refuse.
        let (_, retire_tag) = self.unpublish(&mut w, offset, live);
        // Announced once the old copy is unpublished, with the tag it was
        // retired at: a reader that pins after that tag cannot find the old
        // copy, so a profiler may forget it once the tag is safe. A reader
        // may find the new copy a moment before the event is queued (still
        // under this lock); the event's timestamp was taken before that.
        if let Some((timestamp, info)) = notice {
            let unpublished = monotonic_ns();
            self.listeners.emit(CodeEvent::Move(CodeMove {
                timestamp,
                tid: current_tid(),
                old_block: code.block_id(),
                new_block: moved.block_id(),
                old_start: code.start,
                new_start: moved.start,
                size: code.size,
                info,
                retire_tag,
                unpublished,
            }));
        }
        if w.move_order.len() == MOVES_REMEMBERED
            && let Some(oldest) = w.move_order.pop_front()
        {
            w.moved.remove(&oldest);
        }
        w.moved.insert(code.generation, moved.start);
        w.move_order.push_back(code.generation);
        drop(w);
        self.listeners.throttle();
        Ok(moved)
    }

    /// Patches a published method in place (inline caches, call sites,
    /// counters): `patch` edits a copy of the block's code bytes, and the bytes
    /// it changed are then written into the live code under the heap lock.
    /// Afterwards the instruction cache is maintained for the executable
    /// addresses, and every other thread is made to serialize its instruction
    /// stream before it next runs user code
    /// (`membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE)`, on x86-64 and
    /// aarch64 alike), so none executes a stale mix after this call returns.
    ///
    /// The closure runs with no lock held, on a copy (allocated: patching a
    /// megabyte method copies a megabyte). So it may call back into the heap
    /// (another patch, a lookup, even a free of this block, after which this
    /// patch returns the free's typed error and writes nothing), and a closure
    /// that panics leaves the live code untouched: the panic reaches the caller
    /// and there is nothing to roll back or flush. Only the aligned words that
    /// hold a byte the closure changed are written, each by one store of the
    /// word's width (8 bytes on x86-64, one 32-bit instruction on aarch64),
    /// with its other bytes as the live code holds them: a concurrent patch
    /// of other bytes of the same block is kept.
    ///
    /// So a thread running the code meanwhile fetches each word old or new,
    /// never a mix: a `call rel32` or a `mov imm32` whose changed bytes lie
    /// in one aligned 8-byte word on x86-64, or a `b`/`bl`/`nop` replaced
    /// by another on aarch64, is switched whole. A change spanning words is
    /// written word by word in ascending order, and an instruction across a
    /// word boundary may be fetched half old, half new: that patch is the
    /// host's to make safe. In W^X mode the words are written through the
    /// writable view; in RWX mode in place. Flip mode keeps no writable alias
    /// of published code (a thread running it would fault while its pages
    /// were writable), so it refuses with [`HeapError::NotPatchable`].
    /// Nothing changes when an error is returned.
    ///
    /// A patch that changes nothing still flushes the block and syncs the
    /// cores (a `membarrier`), so it is not free: a host that wrote the
    /// block in place and calls it to make those bytes visible gets what it
    /// asked for. [`CodeHeap::make_visible`] does that for a range.
    ///
    /// ```
    /// # #[cfg(target_arch = "x86_64")] {
    /// use jitmap::{CodeHeap, CodeInfo, Domain, HeapConfig, JitKind, MemoryMode};
    /// let heap = CodeHeap::new(
    ///     HeapConfig { span: 1 << 20, mode: MemoryMode::WriteXorExecute, ..HeapConfig::default() },
    ///     &Domain::new(1),
    /// )?;
    /// let mut r = heap.reserve(6)?;
    /// r.code_mut().copy_from_slice(&[0xB8, 1, 0, 0, 0, 0xC3]); // mov eax, 1; ret
    /// let code = r.publish(CodeInfo::new(1, "one", JitKind::Optimized))?;
    /// heap.patch(code, |bytes| bytes[1] = 2)?; // now mov eax, 2
    /// // SAFETY: the bytes are a complete sysv64 function taking nothing.
    /// let f: extern "sysv64" fn() -> u32 = unsafe { code.entry() };
    /// assert_eq!(f(), 2);
    /// # }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn patch(&self, code: CodeRef, patch: impl FnOnce(&mut [u8])) -> Result<(), HeapError> {
        let offset = self.offset_of(code)?;
        if self.memory.mode() == MemoryMode::FlipOnPublish {
            return Err(HeapError::NotPatchable { start: code.start });
        }
        let before = {
            let w = self.writer.lock();
            self.check_live(&w, code, offset)?;
            // SAFETY: the block is live (checked under the lock, which free and
            // move need), so its committed bytes are readable and not reused
            // while the lock is held; the copy is taken before it is released.
            unsafe {
                std::slice::from_raw_parts(
                    self.memory.write_base().add(offset as usize),
                    code.size as usize,
                )
            }
            .to_vec()
        };
        let mut after = before.clone();
        patch(&mut after);
        // Even unchanged, the block is made coherent below (see the doc).
        let mut w = self.writer.lock();
        self.check_live(&w, code, offset)?;
        let how = memory::sync_cores_ready()?;
        let block = self.memory.write_base().wrapping_add(offset as usize);
        let stores = {
            // The block's bytes through the end of its last word: the block
            // starts on a multiple of its reservation's alignment (at least
            // 8), in a view that starts on a page, and its extent ends on a
            // multiple of 8, so its last word holds no other block's bytes.
            let len = (code.size as usize).next_multiple_of(crate::arch::PATCH_WORD);
            // SAFETY: the block is still live (checked again under the
            // lock), so these bytes of its extent are committed and
            // readable through the writable view, which lives as long as
            // `self`; the reference ends before the stores below.
            let live = unsafe { std::slice::from_raw_parts(block, len) };
            word_stores::<{ crate::arch::PATCH_WORD }>(&before, &after, live)
        };
        for (at, word) in stores {
            // SAFETY: `at` is a multiple of the word size inside the block's
            // extent (above), the block's address in the page-aligned
            // writable view is a multiple of 8, the lock makes this the
            // only writer, and no reference to these bytes is alive.
            unsafe { crate::arch::store_patch_word(block.add(at), word) };
        }
        self.memory
            .flush_icache(offset as usize, code.size as usize);
        memory::sync_cores(how)?;
        w.core_syncs += 1;
        drop(w);
        Ok(())
    }

    /// Makes bytes `range` (offsets in the block) of a live block, written
    /// in place through its [`CodeHeap::write_address`], visible to every
    /// thread that runs them: the instruction-cache maintenance for their
    /// executable addresses (aarch64), then every other thread made to
    /// serialize its instruction stream before it next runs user code, as
    /// [`CodeHeap::patch`] does. What a running thread sees while the host
    /// writes is the host's to make safe (`patch` writes whole words).
    /// Flip mode has no writable alias ([`HeapError::NotPatchable`]); a
    /// range not inside `code`'s size is [`HeapError::OutsideBlock`],
    /// checked before whether the block is still live (as `patch` checks its
    /// bounds first). Nothing is done when an error is returned, but for a
    /// failed sync after the flush (a flush changes no byte).
    ///
    /// ```
    /// # #[cfg(target_arch = "x86_64")] {
    /// use jitmap::{CodeHeap, CodeInfo, Domain, HeapConfig, JitKind};
    /// let heap = CodeHeap::new(HeapConfig { span: 1 << 20, ..HeapConfig::default() }, &Domain::new(1))?;
    /// let mut r = heap.reserve(6)?;
    /// r.code_mut().copy_from_slice(&[0xB8, 1, 0, 0, 0, 0xC3]); // mov eax, 1; ret
    /// let code = r.publish(CodeInfo::new(1, "one", JitKind::Optimized))?;
    /// // The host rewrites the constant in place, then makes it visible.
    /// let write = heap.write_address(code)? as *mut u8;
    /// // SAFETY: the block is live and 6 bytes long; byte 1 is the imm32's low byte.
    /// unsafe { write.add(1).write(7) };
    /// heap.make_visible(code, 1..5)?;
    /// // SAFETY: the bytes are a complete sysv64 function taking nothing.
    /// let f: extern "sysv64" fn() -> u32 = unsafe { code.entry() };
    /// assert_eq!(f(), 7);
    /// # }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn make_visible(&self, code: CodeRef, range: Range<u64>) -> Result<(), HeapError> {
        let offset = self.offset_of(code)?;
        if self.memory.mode() == MemoryMode::FlipOnPublish {
            return Err(HeapError::NotPatchable { start: code.start });
        }
        if range.start > range.end || range.end > code.size {
            return Err(HeapError::OutsideBlock {
                start: code.start,
                begin: range.start,
                end: range.end,
                size: code.size,
            });
        }
        let mut w = self.writer.lock();
        self.check_live(&w, code, offset)?;
        let how = memory::sync_cores_ready()?;
        self.memory.flush_icache(
            (offset + range.start) as usize,
            (range.end - range.start) as usize,
        );
        memory::sync_cores(how)?;
        w.core_syncs += 1;
        Ok(())
    }

    /// The writable address of a live block's first code byte: the random,
    /// unrelated alias in W^X mode, the code itself in RWX mode. Flip mode keeps
    /// no writable alias ([`HeapError::NotPatchable`]). It stays valid while
    /// the block is live: until it is freed, or moved (the moved block has a
    /// new one). Writing through it skips the cache and cross-core handling,
    /// so a host that writes code in place follows with
    /// [`CodeHeap::make_visible`] (or patches with [`CodeHeap::patch`]).
    /// Such writes must not overlap a [`CodeHeap::patch`] of the same
    /// aligned word: a patch writes whole words, and would put back the
    /// word's other bytes as it read them under its lock.
    pub fn write_address(&self, code: CodeRef) -> Result<usize, HeapError> {
        let offset = self.offset_of(code)?;
        if self.memory.mode() == MemoryMode::FlipOnPublish {
            return Err(HeapError::NotPatchable { start: code.start });
        }
        self.check_live(&self.writer.lock(), code, offset)?;
        Ok(self.memory.write_base() as usize + offset as usize)
    }

    /// Reclaims every retired block whose grace period has passed; returns the
    /// extent bytes given back.
    pub fn try_reclaim(&self) -> u64 {
        self.reclaim(&mut self.writer.lock())
    }

    /// The published blocks, in address order: for a profiler or debugger that
    /// attaches after code was published.
    pub fn live_blocks(&self) -> Vec<LiveBlock> {
        let w = self.writer.lock();
        self.map
            .starts()
            .filter_map(|offset| {
                let live = self.live_at(&w, offset)?;
                Some(LiveBlock {
                    code: CodeRef {
                        heap: self.id,
                        start: self.base() + offset as usize,
                        size: live.size,
                        generation: live.generation,
                    },
                    // SAFETY: the block is live and we hold the lock that
                    // retiring and reclaiming it need.
                    info: live.header.map(|h| unsafe { h.get() }.to_info()),
                })
            })
            .collect()
    }

    /// The reference of the live block whose code starts at `start`: for a
    /// host that keeps code addresses, not references (a C JIT that frees
    /// by the address it runs), to free, patch or move it.
    /// [`HeapError::UnknownRef`] when no live block starts there (an
    /// address inside a block, a freed block's start, another heap's).
    ///
    /// ```
    /// use jitmap::{CodeHeap, CodeInfo, Domain, HeapConfig, HeapError, JitKind};
    /// let heap = CodeHeap::new(HeapConfig { span: 1 << 20, ..HeapConfig::default() }, &Domain::new(1))?;
    /// let mut r = heap.reserve(16)?;
    /// r.code_mut().fill(0xC3);
    /// let code = r.publish(CodeInfo::new(1, "f", JitKind::Optimized))?;
    /// assert_eq!(heap.code_at(code.start())?, code);
    /// heap.free(heap.code_at(code.start())?)?;
    /// assert_eq!(heap.code_at(code.start()), Err(HeapError::UnknownRef { start: code.start() }));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn code_at(&self, start: usize) -> Result<CodeRef, HeapError> {
        let unknown = HeapError::UnknownRef { start };
        let offset = start.checked_sub(self.base()).ok_or(unknown)? as u64;
        let w = self.writer.lock();
        let live = self.live_at(&w, offset).ok_or(unknown)?;
        Ok(CodeRef {
            heap: self.id,
            start,
            size: live.size,
            generation: live.generation,
        })
    }

    /// Current usage.
    pub fn stats(&self) -> HeapStats {
        let w = self.writer.lock();
        HeapStats {
            span: self.span,
            committed: w.committed,
            used: self.span - w.free.free_bytes(),
            free: w.free.free_bytes(),
            largest_free: w.free.largest(),
            live_blocks: w.methods + w.stubs.len(),
            retired_blocks: w.retired.len(),
            reclaimed_bytes: w.reclaimed_bytes,
            core_syncs: w.core_syncs,
        }
    }

    fn reclaim(&self, w: &mut Writer) -> u64 {
        if w.retired.is_empty() {
            return 0;
        }
        let safe_before = self.domain.safe_before();
        let mut bytes = 0;
        let mut i = 0;
        while i < w.retired.len() {
            if w.retired[i].tag >= safe_before {
                i += 1;
                continue;
            }
            let r = w.retired.swap_remove(i);
            bytes += r.extent.end - r.extent.start;
            self.ends.writer().clear(r.start, r.size);
            w.free.release(r.extent);
            if let Some(header) = r.header {
                // SAFETY: retired before every guard now pinned began, so no
                // reader can reach it; we hold the lock.
                unsafe { w.drop_header(header) };
            }
        }
        w.retired_bytes -= bytes;
        w.reclaimed_bytes += bytes;
        bytes
    }

    /// Gives an unpublished extent back (abort).
    fn release(&self, extent: Range<u64>) {
        self.writer.lock().free.release(extent);
    }

    /// Publishes a reservation's block. The code bytes are copied for listeners
    /// before the lock is taken (the reservation is private until the map store).
    fn publish(&self, publish: Publish) -> Result<CodeRef, HeapError> {
        let mut publish = publish;
        if matches!(publish.payload, Payload::Method(_)) && !self.listeners.is_empty() {
            // SAFETY: the reservation owns these committed bytes, and nobody else
            // writes or frees them until it is published.
            let code = unsafe {
                std::slice::from_raw_parts(
                    self.memory.write_base().add(publish.start as usize),
                    publish.size as usize,
                )
            };
            publish.code = Some(code.into());
        }
        if let Payload::Method(info) = &publish.payload {
            publish.rows = header::unwind_rows(
                info.get(),
                self.base() + publish.start as usize,
                publish.size,
            );
        }
        let mut w = self.writer.lock();
        let result = self
            .publish_locked(&mut w, publish, Announce::Now)
            .map(|(code, _)| code);
        drop(w);
        self.listeners.throttle();
        result
    }

    /// Publishes a block, announcing a load now, or for a move returning what
    /// its event needs (the timestamp taken before the copy became visible,
    /// and the info; none without listeners) for `move_block` to announce
    /// once the original is unpublished. On error
    /// the extent stays reserved (the caller gives it back or keeps it) and
    /// no event was queued. The block is recorded as live before any event
    /// is queued, so the heap's state never depends on a listener.
    fn publish_locked(
        &self,
        w: &mut Writer,
        publish: Publish,
        announce: Announce,
    ) -> Result<(CodeRef, Option<MoveNotice>), HeapError> {
        let Publish {
            start,
            size,
            align,
            extent,
            payload,
            code,
            rows,
        } = publish;
        // Every step that can refuse comes before the code event: listeners
        // hear only of code that becomes visible (the map store at the end is
        // checked here, and nothing else writes the map while `w` is held).
        if let Payload::Method(info) = &payload {
            info.get().validate(size).map_err(HeapError::Info)?;
        }
        w.map.check_allocated(start, size).map_err(HeapError::Map)?;
        // Taken before the code becomes visible, as perf requires of load records.
        let timestamp = if self.listeners.is_empty() {
            0
        } else {
            monotonic_ns()
        };
        let registrations = match &payload {
            Payload::Method(info) => self.registrations(info.get(), start, size)?,
            Payload::Stub(_) => Registrations::default(),
        };
        let generation = w.next_generation;
        debug_assert!(generation < header::GENERATION_LIMIT);
        let (header, slot, info) = match payload {
            Payload::Method(info) => {
                let new = NewHeader {
                    info,
                    share: !self.listeners.is_empty(),
                    rows,
                    code_size: size,
                    registrations,
                    generation,
                    align,
                };
                let name = new
                    .name_in_arena()
                    .then(|| w.names.insert(&new.info.get().name));
                let (header, shared) = new.build(name);
                let header = HeaderPtr(w.headers.insert(header));
                (Some(header), header.0.as_ptr() as usize, shared)
            }
            Payload::Stub(kind) => {
                // Relaxed: published by the map's Release store below; readers load
                // it after their Acquire load of the map word.
                self.stubs.store(true, Ordering::Relaxed);
                (None, usize::from(kind.get()), None)
            }
        };
        // SAFETY: `start` was placed by the allocator in this heap's committed
        // memory, and the write view lives as long as `self`.
        let prefix = unsafe { prefix_at(self.memory.write_base() as usize, start) };
        // Relaxed: published to readers by the map's Release store below.
        prefix.size.store(size as usize, Ordering::Relaxed);
        // Relaxed: as above.
        prefix.slot.store(slot, Ordering::Relaxed);
        self.memory.flush_icache(start as usize, size as usize);
        // Code over bytes that may have held executed code, or that were
        // executable before it was written: on aarch64 every other core
        // serializes its instruction stream before this block becomes
        // reachable (the reasons are at `arch::REUSE_NEEDS_CORE_SYNC` and
        // `arch::FRESH_NEEDS_CORE_SYNC`).
        let sync = if extent.start < w.published_end {
            crate::arch::REUSE_NEEDS_CORE_SYNC
        } else {
            crate::arch::FRESH_NEEDS_CORE_SYNC && self.memory.mode() != MemoryMode::FlipOnPublish
        };
        let synced = if sync {
            memory::sync_cores_ready().and_then(memory::sync_cores)
        } else {
            Ok(())
        };
        if let Err(e) = synced.and_then(|()| {
            self.memory
                .flip(extent.start as usize, extent.end as usize, true)
        }) {
            if let Some(header) = header {
                // SAFETY: never published: no map names the block.
                unsafe { w.drop_header(header) };
            }
            return Err(e.into());
        }
        w.published_end = w.published_end.max(extent.end);
        // Counted once it happened, with the publish that needed it.
        w.core_syncs += u64::from(sync);
        let new_start = self.base() + start as usize;
        let block = BlockId {
            heap: self.id,
            generation,
        };
        let is_stub = header.is_none();
        // A load's event goes out before the code is visible: a profiler that
        // finds the block and then waits for the events delivered so far
        // knows it. A move's goes out later, from `move_block`.
        let notice = match (announce, info) {
            (Announce::Now, Some(info)) => {
                self.listeners.emit(CodeEvent::Load(CodeLoad {
                    timestamp,
                    tid: current_tid(),
                    block,
                    start: new_start,
                    code: code.unwrap_or_default(),
                    info,
                    room: self.room_after(start + size, extent.end),
                }));
                None
            }
            (Announce::Later, info) => info.map(|info| (timestamp, info)),
            (Announce::Now, None) => None,
        };
        self.seq().begin();
        self.ends.writer().mark(start, size, is_stub);
        w.map.set_checked(start, size);
        self.seq().end();
        w.next_generation += 1;
        match header {
            Some(_) => w.methods += 1,
            None => {
                w.stubs.insert(start, StubRecord { generation, align });
            }
        }
        Ok((
            CodeRef {
                heap: self.id,
                start: new_start,
                size,
                generation,
            },
            notice,
        ))
    }

    /// What the heap registers outside itself for a method about to be published
    /// at offset `start`: its `.eh_frame` with the unwinder, its name with gdb.
    fn registrations(
        &self,
        info: &CodeInfo,
        start: u64,
        size: u64,
    ) -> Result<Registrations, HeapError> {
        let frame = match &info.eh_frame {
            Some(eh) if self.register_unwind => Some(FrameRegistration::new(&eh.frame)?),
            _ => None,
        };
        #[cfg(feature = "gdb-jit")]
        let gdb = self.gdb_jit.then(|| {
            GdbRegistration::new(&info.name, (self.base() as u64) + start, size, &info.debug)
        });
        #[cfg(not(feature = "gdb-jit"))]
        let _ = (self.gdb_jit, start, size);
        Ok(Registrations {
            frame,
            #[cfg(feature = "gdb-jit")]
            gdb,
        })
    }

    /// The offset of a reference from this heap.
    fn offset_of(&self, code: CodeRef) -> Result<u64, HeapError> {
        if code.heap != self.id {
            return Err(HeapError::ForeignRef);
        }
        Ok(code.start.wrapping_sub(self.base()) as u64)
    }

    /// The live block starting at `offset`, if any: the maps name the start,
    /// its prefix the size and header (a stub's record is in the stub table).
    fn live_at(&self, w: &Writer, offset: u64) -> Option<Live> {
        if offset < PREFIX || offset >= self.span || !offset.is_multiple_of(8) {
            return None;
        }
        let start = self.base() + offset as usize;
        // SAFETY: the caller holds the heap lock (`w`), so no block is
        // published, unpublished or reclaimed while the hit is used: the lock
        // keeps what a guard would.
        let hit = unsafe { self.lookup.find(self.base, start) }.filter(|h| h.start == start)?;
        let size = hit.size();
        if hit.is_stub() {
            let stub = w.stubs.get(&offset)?;
            return Some(Live {
                generation: stub.generation,
                size,
                align: stub.align,
                header: None,
            });
        }
        // SAFETY: not a stub, so the slot holds the header's pointer.
        let header = unsafe { hit.header() };
        Some(Live {
            generation: header.generation(),
            size,
            align: header.align(),
            header: Some(HeaderPtr(NonNull::from(header))),
        })
    }

    /// Checks that `code` is live, and returns what the writer knows of it.
    fn check_live(&self, w: &Writer, code: CodeRef, offset: u64) -> Result<Live, HeapError> {
        match self.live_at(w, offset) {
            // The size too: a reference rebuilt from raw parts
            // ([`CodeRef::from_raw`]) must match the block in every field.
            Some(live) if live.generation == code.generation => {
                if live.size == code.size {
                    Ok(live)
                } else {
                    Err(HeapError::UnknownRef { start: code.start })
                }
            }
            _ if w.moved.contains_key(&code.generation) => Err(HeapError::Moved {
                start: code.start,
                to: w.moved[&code.generation],
            }),
            _ if code.generation < w.next_generation => {
                Err(HeapError::DoubleFree { start: code.start })
            }
            _ => Err(HeapError::UnknownRef { start: code.start }),
        }
    }

    /// Unpublishes the live block at `offset` and retires it; returns the
    /// method's info for listeners (None for a stub, or without listeners)
    /// and the tag it was retired at (a reader pinned after it cannot find
    /// the block; 0 in the unreachable case where nothing was retired).
    /// It cannot fail: `live` came from [`CodeHeap::live_at`] under the lock
    /// `w` holds, so the map names a start at `offset` (aligned, in range)
    /// and its delete succeeds.
    fn unpublish(&self, w: &mut Writer, offset: u64, live: Live) -> (Option<Arc<CodeInfo>>, u64) {
        self.seq().begin();
        let deleted = w.map.delete(offset);
        self.seq().end();
        if deleted.is_err() {
            // Unreachable (see above). Were it reached, the block would stay
            // published and its memory never reused: safe, if not tidy.
            debug_assert_eq!(deleted, Ok(()), "live_at found the start under this lock");
            return (None, 0);
        }
        match live.header {
            Some(_) => w.methods -= 1,
            None => {
                w.stubs.remove(&offset);
            }
        }
        let tag = self.domain.retire_tag();
        let info = live.header.filter(|_| !self.listeners.is_empty()).map(|h| {
            // SAFETY: the header was just retired, not reclaimed, and we hold the
            // lock that reclamation needs.
            unsafe { h.get() }.to_info()
        });
        let extent = w.free.extent_of(offset, live.size + self.unwind_room);
        w.retired_bytes += extent.end - extent.start;
        w.retired.push(Retired {
            tag,
            start: offset,
            size: live.size,
            extent,
            header: live.header,
        });
        (info, tag)
    }
}

/// What a move's event needs from its publish: the timestamp taken before
/// the copy became visible, and the method's info.
type MoveNotice = (u64, Arc<CodeInfo>);

/// When a publish announces its block: a load at once, before the code is
/// visible; a move after its original is unpublished, with the tag the
/// original was retired at ([`CodeMove::retire_tag`]).
#[derive(Clone, Copy)]
enum Announce {
    Now,
    Later,
}

/// Everything a publish needs about the block.
pub(crate) struct Publish {
    /// Code start (offset from the heap base).
    start: u64,
    size: u64,
    /// The alignment it was reserved with.
    align: u64,
    extent: Range<u64>,
    payload: Payload,
    /// A copy of the code bytes for a load event, when listeners want one.
    code: Option<Box<[u8]>>,
    /// A method's unwind rows, evaluated before the lock is taken.
    rows: Box<[UnwindRow]>,
}

impl Drop for CodeHeap {
    fn drop(&mut self) {
        let base = self.base();
        let mut w = self.writer.lock();
        let starts: Vec<u64> = self.map.starts().collect();
        for offset in starts {
            let Some(Live {
                generation,
                size,
                header: Some(header),
                ..
            }) = self.live_at(&w, offset)
            else {
                continue;
            };
            // Its code goes with the heap: listeners hear of it as of a free
            // (an agent forgets the version, a perf map need not keep it).
            if !self.listeners.is_empty() {
                self.listeners.emit(CodeEvent::Free(CodeFree {
                    timestamp: monotonic_ns(),
                    block: BlockId {
                        heap: self.id,
                        generation,
                    },
                    start: base + offset as usize,
                    size,
                    // SAFETY: the header is in the slab until `drop_header`
                    // below; `&mut self` excludes the writer.
                    info: unsafe { header.get() }.to_info(),
                }));
            }
            // SAFETY: the heap is going: `&mut self` means no reader holds a
            // guard on it (guards borrow it), and the header is dropped once.
            unsafe { w.drop_header(header) };
        }
        for r in std::mem::take(&mut w.retired) {
            if let Some(header) = r.header {
                // SAFETY: as above; retired headers are listed once.
                unsafe { w.drop_header(header) };
            }
        }
    }
}

impl CodeHeap {
    /// Bytes after a block's code (ending at offset `code_end`, its extent at
    /// `extent_end`) where no other block's code can lie while it is live:
    /// the rest of its extent, then the next block's prefix (a block's code
    /// starts `PREFIX` bytes into its extent), unless the heap ends there.
    fn room_after(&self, code_end: u64, extent_end: u64) -> u64 {
        let prefix = if extent_end < self.span { PREFIX } else { 0 };
        extent_end - code_end + prefix
    }
}

fn check_align(align: u64) -> Result<(), HeapError> {
    let page = region::page::size() as u64;
    if align.is_power_of_two() && (8..=page).contains(&align) {
        Ok(())
    } else {
        Err(HeapError::BadAlignment { align })
    }
}
