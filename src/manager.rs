//! The execution manager: one lookup for every code heap and precompiled image,
//! answering the contract's full API for the block containing an address.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use crate::epoch::{Domain, EpochError, Executor, ForeignGuard, Guard, Reader};
use crate::events::Listeners;
use crate::heap::{
    BlockKind, CodeHeader, CodeHeap, DebugEntry, GcInfo, HeapConfig, HeapError, HeapLookup, Hit,
    JitKind, LiveBlock,
};
use crate::hex::hex_struct;
use crate::image::{ImageError, ImageHit, ImageInfo, ImageSection, RegionInfo};
use crate::perf::{PerfConfig, PerfError, PerfOutput};
use crate::range::{RangeError, RangeSectionMap, Section};
use crate::remote;

/// What a range section holds (cloned into each chunk the section touches).
///
/// A tag word (0: heap, 1: image) then the variant's fields: the layout an
/// out-of-process reader relies on (see [`crate::remote`]).
#[derive(Clone, Debug)]
#[repr(usize)]
pub enum SectionKind {
    /// JIT code.
    Heap(HeapSection) = 0,
    /// A precompiled image.
    Image(Arc<ImageSection>) = 1,
}

/// A code heap's section: the heap, and its read side inline, so a lookup goes
/// from the range map's fragment to the map word without visiting the heap.
#[derive(Clone, Debug)]
pub struct HeapSection {
    lookup: HeapLookup,
    heap: Arc<CodeHeap>,
}

/// Where out-of-process readers find a heap section's fields, as byte offsets
/// from the start of a `SectionKind::Heap` value.
pub(crate) struct HeapSectionLayout {
    pub(crate) lookup: usize,
}

/// Byte offset of a variant's fields in a [`SectionKind`]: after the tag word,
/// aligned for the fields (`repr(usize)` lays each variant out as a `repr(C)`
/// struct that starts with the tag).
pub(crate) const SECTION_PAYLOAD: usize =
    size_of::<usize>().next_multiple_of(align_of::<HeapSection>());

/// The layout of a heap section, for the descriptor.
pub(crate) const HEAP_SECTION_LAYOUT: HeapSectionLayout = HeapSectionLayout {
    lookup: SECTION_PAYLOAD + std::mem::offset_of!(HeapSection, lookup),
};

impl HeapSection {
    /// The heap.
    pub fn heap(&self) -> &Arc<CodeHeap> {
        &self.heap
    }
}

/// A rejected manager operation; the manager is unchanged.
#[derive(Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ManagerError {
    /// Creating the heap failed.
    Heap(HeapError),
    /// The range map refused (overlap, out of range, too large, unknown section).
    Range(RangeError),
    /// The image failed validation.
    Image(ImageError),
    /// `unload_image` was given the base of something that is not an image (a
    /// code heap is unregistered only by dropping its handle).
    NotAnImage {
        /// The base address given.
        base: usize,
    },
    /// A guard from another manager's domain.
    ForeignGuard,
    /// The reader registry refused.
    Epoch(EpochError),
}

impl fmt::Display for ManagerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Heap(e) => write!(f, "{e}"),
            Self::Range(e) => write!(f, "{e}"),
            Self::Image(e) => write!(f, "{e}"),
            Self::NotAnImage { base } => write!(f, "the section at {base:#x} is not an image"),
            Self::ForeignGuard => write!(f, "{ForeignGuard}"),
            Self::Epoch(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ManagerError {}

impl fmt::Debug for ManagerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Heap(e) => f.debug_tuple("Heap").field(e).finish(),
            Self::Range(e) => f.debug_tuple("Range").field(e).finish(),
            Self::Image(e) => f.debug_tuple("Image").field(e).finish(),
            Self::NotAnImage { base } => hex_struct!(f, "NotAnImage", "base" => *base),
            Self::ForeignGuard => f.write_str("ForeignGuard"),
            Self::Epoch(e) => f.debug_tuple("Epoch").field(e).finish(),
        }
    }
}

impl From<HeapError> for ManagerError {
    fn from(e: HeapError) -> Self {
        Self::Heap(e)
    }
}

impl From<RangeError> for ManagerError {
    fn from(e: RangeError) -> Self {
        Self::Range(e)
    }
}

impl From<ImageError> for ManagerError {
    fn from(e: ImageError) -> Self {
        Self::Image(e)
    }
}

impl From<ForeignGuard> for ManagerError {
    fn from(_: ForeignGuard) -> Self {
        Self::ForeignGuard
    }
}

impl From<EpochError> for ManagerError {
    fn from(e: EpochError) -> Self {
        Self::Epoch(e)
    }
}

/// Routes any address to its heap or image and answers for the block there.
pub struct ExecutionManager {
    /// This manager's entry in the out-of-process descriptor, if it got one.
    /// Declared first so that it is withdrawn before the range map is dropped.
    remote: Option<remote::Registration>,
    ranges: RangeSectionMap<SectionKind>,
    listeners: Arc<Listeners>,
}

/// A code heap registered with a manager; dropping it unregisters the heap, and
/// its memory is unmapped once readers pinned before that have unpinned.
pub struct ManagedHeap<'m> {
    heap: Arc<CodeHeap>,
    manager: &'m ExecutionManager,
}

impl Deref for ManagedHeap<'_> {
    type Target = CodeHeap;

    fn deref(&self) -> &CodeHeap {
        &self.heap
    }
}

impl ManagedHeap<'_> {
    /// The shared heap.
    pub fn heap(&self) -> &Arc<CodeHeap> {
        &self.heap
    }
}

impl Drop for ManagedHeap<'_> {
    fn drop(&mut self) {
        self.manager.unregister_heap(&self.heap);
    }
}

/// A code heap registered with a shared manager, with no lifetime: a runtime
/// keeps its `Arc<ExecutionManager>` and its heaps side by side in one struct.
/// Dropping it unregisters the heap, as [`ManagedHeap`] does.
///
/// ```
/// use std::sync::Arc;
/// use jitmap::{ExecutionManager, HeapConfig, OwnedHeap};
///
/// struct Runtime {
///     manager: Arc<ExecutionManager>,
///     tier0: OwnedHeap,
/// }
/// let manager = Arc::new(ExecutionManager::new(8));
/// let tier0 = manager.create_owned_heap(HeapConfig { span: 1 << 20, ..HeapConfig::default() })?;
/// let runtime = Runtime { manager, tier0 };
/// assert_eq!(runtime.manager.heaps().len(), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct OwnedHeap {
    heap: Arc<CodeHeap>,
    manager: Arc<ExecutionManager>,
}

impl Deref for OwnedHeap {
    type Target = CodeHeap;

    fn deref(&self) -> &CodeHeap {
        &self.heap
    }
}

impl OwnedHeap {
    /// The shared heap.
    pub fn heap(&self) -> &Arc<CodeHeap> {
        &self.heap
    }

    /// The manager the heap is registered with.
    pub fn manager(&self) -> &Arc<ExecutionManager> {
        &self.manager
    }
}

impl Drop for OwnedHeap {
    fn drop(&mut self) {
        self.manager.unregister_heap(&self.heap);
    }
}

/// What is at an address.
#[derive(Clone, Copy, Debug)]
pub enum Lookup<'g> {
    /// A method (JIT or image code).
    Method(CodeBlock<'g>),
    /// A stub block in a code heap.
    Stub {
        /// The stub kind.
        kind: u8,
        /// Address (or offset) of the block's first code byte.
        start: usize,
        /// Size in bytes.
        size: u64,
    },
    /// An image's delay-load thunks.
    Thunk,
    /// Nothing: no section, free space, headers, padding.
    Nothing,
    /// In a v1 heap, but the start lies further back than the cap of
    /// [`ExecutionManager::classify_bounded`] (never from the other lookups).
    TooFar,
}

impl ExecutionManager {
    /// A manager whose readers and executors share a domain of `reader_slots`
    /// slots (see [`Domain::new`]).
    ///
    /// The manager registers its range map in the process's descriptor
    /// ([`crate::remote`]), so readers in other processes can find it, while one
    /// of its [`remote::MAX_MANAGERS`] entries is free.
    pub fn new(reader_slots: usize) -> Self {
        let ranges = RangeSectionMap::new(&Domain::new(reader_slots));
        let remote = remote::Registration::new(ranges.root_address());
        Self {
            remote,
            ranges,
            listeners: Arc::new(Listeners::default()),
        }
    }

    /// This manager's index among the descriptor's managers, or `None` when
    /// every entry was taken by other live managers.
    pub fn remote_index(&self) -> Option<usize> {
        self.remote.as_ref().map(remote::Registration::index)
    }

    /// The listeners every heap of this manager emits code events to.
    pub fn listeners(&self) -> &Arc<Listeners> {
        &self.listeners
    }

    /// The reader domain.
    pub fn domain(&self) -> &Arc<Domain> {
        self.ranges.domain()
    }

    /// Registers the calling thread as an executor of this manager's code (see
    /// [`Executor`]): frees then wait for its quiescent points before reusing
    /// bytes it may still be running.
    pub fn register_executor(&self) -> Result<Executor, EpochError> {
        self.domain().register_executor()
    }

    /// Registers a reader for the calling thread.
    pub fn register(&self) -> Result<Reader, EpochError> {
        self.domain().register()
    }

    /// Turns on the profiler output that `JITMAP_PERF` (`jitdump`, `map`, `both` or
    /// `off`) and `JITMAP_PERF_DIR` (default `/tmp`) ask for, for every heap of
    /// this manager. A host calls it once, right after creating the manager: the
    /// library reads no environment variable on its own.
    ///
    /// ```
    /// let manager = jitmap::ExecutionManager::new(8);
    /// let output = manager.perf_from_env()?; // JITMAP_PERF unset: nothing opened
    /// assert!(output.jitdump.is_none() && output.perf_map.is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn perf_from_env(&self) -> Result<PerfOutput, PerfError> {
        PerfConfig::from_env()?.install(&self.listeners)
    }

    /// Creates a code heap and registers its range. Also reclaims sections removed
    /// earlier whose grace period has passed (as every manager writer call does).
    pub fn create_heap(&self, config: HeapConfig) -> Result<ManagedHeap<'_>, ManagerError> {
        Ok(ManagedHeap {
            heap: self.register_heap(config)?,
            manager: self,
        })
    }

    /// [`ExecutionManager::create_heap`] for a shared manager: the handle owns an
    /// `Arc` of the manager instead of borrowing it.
    pub fn create_owned_heap(
        self: &Arc<Self>,
        config: HeapConfig,
    ) -> Result<OwnedHeap, ManagerError> {
        Ok(OwnedHeap {
            heap: self.register_heap(config)?,
            manager: Arc::clone(self),
        })
    }

    fn register_heap(&self, config: HeapConfig) -> Result<Arc<CodeHeap>, ManagerError> {
        self.ranges.try_reclaim();
        let heap = CodeHeap::with_listeners(config, self.domain(), Arc::clone(&self.listeners))?;
        let heap = Arc::new(heap);
        let (begin, end) = (heap.base(), heap.base() + heap.span() as usize);
        let section = HeapSection {
            lookup: heap.lookup(),
            heap: Arc::clone(&heap),
        };
        self.ranges.insert(begin, end, SectionKind::Heap(section))?;
        Ok(heap)
    }

    fn unregister_heap(&self, heap: &CodeHeap) {
        // The section was registered by `register_heap` and only the heap's one
        // handle removes it, so it is present.
        let _ = self.ranges.remove(heap.base());
    }

    /// The registered heaps, in address order (for a profiler or debugger that
    /// attaches late).
    pub fn heaps(&self) -> Vec<Arc<CodeHeap>> {
        self.ranges
            .values()
            .into_iter()
            .filter_map(|kind| match kind {
                SectionKind::Heap(s) => Some(s.heap),
                SectionKind::Image(_) => None,
            })
            .collect()
    }

    /// Every live block of every heap, in address order within each heap.
    pub fn live_blocks(&self) -> Vec<LiveBlock> {
        self.heaps().iter().flat_map(|h| h.live_blocks()).collect()
    }

    /// Validates and registers an image; returns its base.
    pub fn load_image(&self, info: ImageInfo) -> Result<usize, ManagerError> {
        self.ranges.try_reclaim();
        let (base, size) = (info.base, info.size);
        let image = ImageSection::new(info).map_err(ManagerError::Image)?;
        let end = base
            .checked_add(size)
            .ok_or(ManagerError::Range(RangeError::OutOfRange {
                begin: base,
                end: usize::MAX,
            }))?;
        self.ranges
            .insert(base, end, SectionKind::Image(Arc::new(image)))
            .map_err(ManagerError::Range)?;
        Ok(base)
    }

    /// Unregisters the image loaded at `base`. Anything else there (a code heap)
    /// is refused with [`ManagerError::NotAnImage`] and stays registered.
    pub fn unload_image(&self, base: usize) -> Result<(), ManagerError> {
        match self
            .ranges
            .remove_if(base, |kind| matches!(kind, SectionKind::Image(_)))
        {
            Err(RangeError::WrongKind { .. }) => Err(ManagerError::NotAnImage { base }),
            other => Ok(other?),
        }
    }

    /// Frees removed sections (and unmaps retired heaps no one else holds) whose
    /// grace period has passed. Returns the number of sections freed.
    ///
    /// Removal reclaims at once when no reader is pinned; a section removed while
    /// one was is freed by the next manager writer call (`create_heap`,
    /// `load_image`, `unload_image`, a heap handle's drop) or by this one.
    pub fn try_reclaim(&self) -> usize {
        self.ranges.try_reclaim()
    }

    /// The section containing `ip`.
    pub fn section<'g>(
        &'g self,
        guard: &'g Guard<'_>,
        ip: usize,
    ) -> Result<Option<&'g Section<SectionKind>>, ForeignGuard> {
        self.ranges.find(guard, ip)
    }

    /// Classifies `ip`. Lock-free, allocation-free, no system call: signal-safe.
    /// Bounded in v2 heaps and images; in a v1 heap the map walk grows with the
    /// method's size (see [`crate::MapVersion`]).
    #[inline]
    pub fn classify<'g>(
        &'g self,
        guard: &'g Guard<'_>,
        ip: usize,
    ) -> Result<Lookup<'g>, ForeignGuard> {
        self.classify_bounded(guard, ip, usize::MAX)
    }

    /// [`ExecutionManager::classify`] reading at most `v1_words` map words of
    /// a v1 heap (and as many end words): beyond that, [`Lookup::TooFar`]. What
    /// a caller with a budget uses, such as the agent's signal handler, so that
    /// a sample in a large v1 method costs bounded time.
    ///
    /// ```
    /// use jitmap::{CodeInfo, ExecutionManager, HeapConfig, JitKind, MapVersion, manager::Lookup};
    /// let manager = ExecutionManager::new(2);
    /// let heap = manager.create_heap(HeapConfig { span: 1 << 20, version: MapVersion::V1, ..HeapConfig::default() })?;
    /// let mut r = heap.reserve(64 << 10)?;
    /// r.code_mut().fill(0xC3);
    /// let code = r.publish(CodeInfo::new(1, "big", JitKind::Optimized))?;
    /// let reader = manager.register()?;
    /// let guard = reader.pin()?;
    /// let deep = code.start() + (40 << 10); // 160 words past the start
    /// assert!(matches!(manager.classify_bounded(&guard, deep, 64)?, Lookup::TooFar));
    /// assert!(matches!(manager.classify_bounded(&guard, deep, 256)?, Lookup::Method(_)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn classify_bounded<'g>(
        &'g self,
        guard: &'g Guard<'_>,
        ip: usize,
        v1_words: usize,
    ) -> Result<Lookup<'g>, ForeignGuard> {
        Ok(match self.ranges.find(guard, ip)? {
            Some(section) => Self::classify_in(section, ip, v1_words),
            None => Lookup::Nothing,
        })
    }

    /// What is at `ip` inside `section` (which contains it). Inlined into
    /// `find` and `classify`, so that `find` builds no `Lookup` in memory.
    #[inline(always)]
    fn classify_in(section: &Section<SectionKind>, ip: usize, v1_words: usize) -> Lookup<'_> {
        match section.value() {
            // SAFETY: `classify` found the section under a guard the range map
            // checked to be pinned in the domain every managed heap shares, which
            // keeps the section, and the `Arc` in it keeps the heap, alive for 'g.
            SectionKind::Heap(s) => {
                // SAFETY: as above.
                let hit = match unsafe { s.lookup.find_capped(section.begin(), ip, v1_words) } {
                    Ok(Some(hit)) => hit,
                    Ok(None) => return Lookup::Nothing,
                    Err(_) => return Lookup::TooFar,
                };
                let method = CodeBlock {
                    start: hit.start,
                    offset: hit.offset,
                    source: Source::Jit {
                        hit,
                        heap_base: section.begin(),
                    },
                };
                // The maps alone made the hit exact. With no stub ever published
                // in the heap, the block is a method; otherwise the end map says
                // whether it is a stub, and only a stub's prefix is read.
                if !s.heap.may_hold_stubs() || !hit.is_stub() {
                    return Lookup::Method(method);
                }
                match hit.kind() {
                    BlockKind::Stub(kind) => Lookup::Stub {
                        kind,
                        start: hit.start,
                        size: hit.size(),
                    },
                    BlockKind::Method(_) => Lookup::Method(method),
                }
            }
            SectionKind::Image(image) => {
                let rel = (ip - section.begin()) as u64;
                if image.is_thunk(rel) {
                    return Lookup::Thunk;
                }
                match image.lookup(rel) {
                    Some(hit) => Lookup::Method(CodeBlock {
                        start: image.base() + image.function(hit.main).begin as usize,
                        offset: hit.offset,
                        source: Source::Image { image, hit },
                    }),
                    None => Lookup::Nothing,
                }
            }
        }
    }

    /// The method block containing `ip`, or `None` (stubs, thunks, free space,
    /// headers, no section). Exact: an address past a block's end is `None`.
    #[inline(always)]
    pub fn find<'g>(
        &'g self,
        guard: &'g Guard<'_>,
        ip: usize,
    ) -> Result<Option<CodeBlock<'g>>, ForeignGuard> {
        let Some(section) = self.ranges.find(guard, ip)? else {
            return Ok(None);
        };
        Ok(match Self::classify_in(section, ip, usize::MAX) {
            Lookup::Method(block) => Some(block),
            _ => None,
        })
    }

    /// The method block containing the return address `ra`: looks up `ra - 1`.
    ///
    /// A stack walker holds return addresses, which point *after* a call. When a
    /// call is a method's last instruction (a call to a function that never
    /// returns, such as a throw helper), the return address is the first byte past
    /// the method: the next method, or nothing. The call instruction itself, and
    /// so the frame, ends at `ra - 1`. Only the innermost frame's pc (or a frame
    /// interrupted by a signal) is looked up as is.
    #[inline]
    pub fn find_return_address<'g>(
        &'g self,
        guard: &'g Guard<'_>,
        ra: usize,
    ) -> Result<Option<CodeBlock<'g>>, ForeignGuard> {
        match ra.checked_sub(1) {
            Some(pc) => self.find(guard, pc),
            None => guard.check(self.domain()).map(|()| None),
        }
    }

    /// The method id whose entry point is exactly `addr` (the analogue of
    /// `NonVirtualEntry2MethodDesc`).
    pub fn entry_to_method(
        &self,
        guard: &Guard<'_>,
        addr: usize,
    ) -> Result<Option<u64>, ForeignGuard> {
        let Some(section) = self.ranges.find(guard, addr)? else {
            return Ok(None);
        };
        Ok(match section.value() {
            SectionKind::Heap(s) => match s.heap.find(guard, addr)? {
                Some(b) if b.offset() == 0 => match b.kind() {
                    BlockKind::Method(h) => Some(h.method_id()),
                    BlockKind::Stub(_) => None,
                },
                _ => None,
            },
            SectionKind::Image(image) => image
                .method_at_entry((addr - section.begin()) as u64)
                .map(|m| m.method_id),
        })
    }
}

#[derive(Clone, Copy)]
enum Source<'g> {
    /// JIT code: the map's hit (the header is read from its slot on demand).
    Jit { hit: Hit<'g>, heap_base: usize },
    Image {
        image: &'g ImageSection,
        hit: ImageHit,
    },
}

/// The header of a JIT method found by a lookup.
fn jit_header(hit: Hit<'_>) -> &CodeHeader {
    // SAFETY: `classify` builds a JIT `CodeBlock` only for a method (its slot was
    // read as a header pointer, or the heap has never held a stub), and the guard
    // behind the hit's lifetime keeps the header alive.
    unsafe { hit.header() }
}

/// The method block containing a looked-up address. Fields beyond the start and
/// offset are read on demand, so a lookup touches no more memory than it needs.
#[derive(Clone, Copy)]
pub struct CodeBlock<'g> {
    start: usize,
    offset: u64,
    source: Source<'g>,
}

impl fmt::Debug for CodeBlock<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CodeBlock")
            .field("method_id", &self.method_id())
            .field("start", &format_args!("{:#x}", self.start))
            .field("offset", &self.offset)
            .finish_non_exhaustive()
    }
}

impl<'g> CodeBlock<'g> {
    /// The runtime's method id.
    pub fn method_id(&self) -> u64 {
        match self.source {
            Source::Jit { hit, .. } => jit_header(hit).method_id(),
            Source::Image { image, hit } => image.method(hit.method).method_id,
        }
    }

    /// Address of the method's entry (its main body's first byte).
    pub fn start(&self) -> usize {
        self.start
    }

    /// Offset of the address within the method; in a cold part, the hot part's
    /// size plus the offset into the cold part.
    pub fn relative_offset(&self) -> u64 {
        self.offset
    }

    /// Start of the funclet containing the address, or the method start if the
    /// address is in the main body or its cold part.
    pub fn funclet_start(&self) -> usize {
        match self.source {
            Source::Jit { hit, .. } => match jit_header(hit).unwind_at(self.offset) {
                Some((index, entry)) if index > 0 => self.start + entry.begin as usize,
                _ => self.start,
            },
            Source::Image { image, hit } if !hit.cold => {
                image.base() + image.function(hit.function).begin as usize
            }
            Source::Image { .. } => self.start,
        }
    }

    /// Whether the address is in a funclet.
    pub fn is_funclet(&self) -> bool {
        self.funclet_start() != self.start
    }

    /// Hot and cold extents of the method.
    pub fn region(&self) -> RegionInfo {
        match self.source {
            Source::Jit { hit, .. } => {
                let header = jit_header(hit);
                match header.info().cold_offset {
                    Some(hot) => RegionInfo {
                        hot_size: u64::from(hot),
                        cold_start: Some(self.start + hot as usize),
                        cold_size: header.code_size() - u64::from(hot),
                    },
                    None => RegionInfo {
                        hot_size: header.code_size(),
                        cold_start: None,
                        cold_size: 0,
                    },
                }
            }
            Source::Image { image, hit } => image.region(hit.main),
        }
    }

    /// Unwind data for the function (main body, funclet or cold fragment) at the
    /// address.
    pub fn unwind_info(&self) -> Option<&'g [u8]> {
        match self.source {
            Source::Jit { hit, .. } => jit_header(hit)
                .unwind_at(self.offset)
                .map(|(_, e)| &*e.data),
            Source::Image { image, hit } => Some(&image.function(hit.function).unwind),
        }
    }

    /// The address unwind data is relative to: the heap base or the image base.
    pub fn unwind_base(&self) -> usize {
        match self.source {
            Source::Jit { heap_base, .. } => heap_base,
            Source::Image { image, .. } => image.base(),
        }
    }

    /// The method's native-offset → source rows.
    pub fn debug_info(&self) -> &'g [DebugEntry] {
        match self.source {
            Source::Jit { hit, .. } => &jit_header(hit).info().debug,
            Source::Image { image, hit } => &image.method(hit.method).debug,
        }
    }

    /// The source row in effect at the address.
    pub fn debug_at(&self) -> Option<&'g DebugEntry> {
        let rows = self.debug_info();
        let i = rows.partition_point(|e| u64::from(e.offset) <= self.offset);
        rows.get(i.checked_sub(1)?)
    }

    /// GC info and its version.
    pub fn gc_info(&self) -> Option<&'g GcInfo> {
        match self.source {
            Source::Jit { hit, .. } => jit_header(hit).info().gc.as_ref(),
            Source::Image { image, hit } => image.method(hit.method).gc.as_ref(),
        }
    }

    /// The tier that produced the code.
    pub fn jit_kind(&self) -> JitKind {
        match self.source {
            Source::Jit { hit, .. } => jit_header(hit).info().kind,
            Source::Image { .. } => JitKind::Precompiled,
        }
    }

    /// Whether the block is JIT code (in a heap) rather than a precompiled
    /// image's method. A JIT block's start and the time it was found identify
    /// the published version exactly: the code events say which version was
    /// placed at that start last before then (see [`crate::agent`]).
    pub fn is_jit(&self) -> bool {
        matches!(self.source, Source::Jit { .. })
    }

    /// The method's name (JIT code only; images carry no names).
    pub fn name(&self) -> Option<&'g str> {
        match self.source {
            Source::Jit { hit, .. } => Some(jit_header(hit).name()),
            Source::Image { .. } => None,
        }
    }
}
