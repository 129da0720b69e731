//! The execution manager: one lookup for every code heap and precompiled image,
//! answering the contract's full API for the block containing an address.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use parking_lot::Mutex;

mod block;
pub(crate) mod descriptor;
mod pinned;
pub(crate) mod stub_names;

pub use block::CodeBlock;
pub use pinned::{Lookup, ManagerGuard};
pub use stub_names::{BadStubName, StubKindName, stub_frame_label};

use crate::epoch::{Domain, EpochError, Executor, Reader};
use crate::events::{CodeEvent, ImageLoad, ImageUnload, Listeners, monotonic_ns};
use crate::heap::{CodeHeap, HeapConfig, HeapError, HeapLookup, LiveBlock, StubKind};
use crate::hex::hex_struct;
use crate::image::{ImageError, ImageInfo, ImageSection};
use crate::range::{RangeError, RangeSectionMap};

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
    Image(ImageEntry) = 1,
}

/// A precompiled image's section: the image, and inline the address and
/// length of its function table, so that a reader in another process goes
/// from the range map's fragment to the table (descriptor layout 3).
#[derive(Clone, Debug)]
pub struct ImageEntry {
    table: usize,
    count: usize,
    image: Arc<ImageSection>,
}

impl ImageEntry {
    fn new(image: Arc<ImageSection>) -> Self {
        let table = image.remote_functions();
        Self {
            table: table.as_ptr() as usize,
            count: table.len(),
            image,
        }
    }

    /// The image.
    pub fn image(&self) -> &Arc<ImageSection> {
        &self.image
    }
}

impl Deref for ImageEntry {
    type Target = ImageSection;

    fn deref(&self) -> &ImageSection {
        &self.image
    }
}

/// Where out-of-process readers find an image section's table, as byte
/// offsets from the start of a `SectionKind::Image` value.
pub(crate) struct ImageSectionLayout {
    pub(crate) table: usize,
    pub(crate) count: usize,
}

/// The layout of an image section, for the descriptor.
pub(crate) const IMAGE_SECTION_LAYOUT: ImageSectionLayout = ImageSectionLayout {
    table: IMAGE_PAYLOAD + std::mem::offset_of!(ImageEntry, table),
    count: IMAGE_PAYLOAD + std::mem::offset_of!(ImageEntry, count),
};

/// [`SECTION_PAYLOAD`] for the image variant.
const IMAGE_PAYLOAD: usize = size_of::<usize>().next_multiple_of(align_of::<ImageEntry>());

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
    /// The reader registry refused.
    Epoch(EpochError),
    /// A stub kind's name was refused ([`StubKindName::new`]).
    BadStubName {
        /// Why.
        why: BadStubName,
    },
    /// The stub kind already has another name
    /// ([`ExecutionManager::name_stub_kind`]; [`ExecutionManager::stub_kind_name`]
    /// gives it).
    StubKindNamed {
        /// The kind.
        kind: StubKind,
    },
}

impl fmt::Display for ManagerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Heap(e) => write!(f, "{e}"),
            Self::Range(e) => write!(f, "{e}"),
            Self::Image(e) => write!(f, "{e}"),
            Self::NotAnImage { base } => write!(f, "the section at {base:#x} is not an image"),
            Self::Epoch(e) => write!(f, "{e}"),
            Self::BadStubName { why } => write!(f, "a stub kind's name was refused: {why}"),
            Self::StubKindNamed { kind } => {
                write!(f, "stub kind {kind} already has another name")
            }
        }
    }
}

/// Each wrapper shows its inner error's message, so its source is the inner
/// error's own source: a chain printed whole names each cause once.
impl std::error::Error for ManagerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Heap(e) => e.source(),
            Self::Range(e) => e.source(),
            Self::Image(e) => e.source(),
            Self::Epoch(e) => e.source(),
            Self::NotAnImage { .. } | Self::BadStubName { .. } | Self::StubKindNamed { .. } => None,
        }
    }
}

impl fmt::Debug for ManagerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Heap(e) => f.debug_tuple("Heap").field(e).finish(),
            Self::Range(e) => f.debug_tuple("Range").field(e).finish(),
            Self::Image(e) => f.debug_tuple("Image").field(e).finish(),
            Self::NotAnImage { base } => hex_struct!(f, "NotAnImage", "base" => *base),
            Self::Epoch(e) => f.debug_tuple("Epoch").field(e).finish(),
            Self::BadStubName { why } => f.debug_struct("BadStubName").field("why", why).finish(),
            Self::StubKindNamed { kind } => {
                f.debug_struct("StubKindNamed").field("kind", kind).finish()
            }
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

impl From<EpochError> for ManagerError {
    fn from(e: EpochError) -> Self {
        Self::Epoch(e)
    }
}

/// Routes any address to its heap or image and answers for the block there.
///
/// A cheap handle: cloning it shares the one manager, so a runtime keeps it in
/// its own struct, hands clones to its threads and to the agent, and the
/// manager lives until the last handle and the last heap drop. Every code heap
/// it creates is an [`OwnedHeap`] that holds a handle too.
///
/// ```
/// use jitmap::{ExecutionManager, HeapConfig, OwnedHeap};
///
/// struct Runtime {
///     manager: ExecutionManager,
///     tier0: OwnedHeap,
/// }
/// let manager = ExecutionManager::new(8);
/// let tier0 = manager.create_heap(HeapConfig { span: 1 << 20, ..HeapConfig::default() })?;
/// let runtime = Runtime { manager, tier0 };
/// assert_eq!(runtime.manager.heaps().len(), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct ExecutionManager {
    inner: Arc<Inner>,
}

struct Inner {
    /// This manager's entry in the out-of-process descriptor, if it got one.
    /// Declared first so that it is withdrawn before the range map is dropped.
    remote: Option<descriptor::Registration>,
    ranges: RangeSectionMap<SectionKind>,
    listeners: Arc<Listeners>,
    /// Values handed to [`ExecutionManager::retire`], each with its retire
    /// tag, dropped once the domain's grace period has passed it.
    retired: Mutex<Vec<(u64, Box<dyn Send>)>>,
    /// Bit k set: stubs of kind k push no frame
    /// ([`ExecutionManager::declare_frameless_stub`]).
    frameless_stubs: AtomicU32,
    /// The names of its stub kinds ([`ExecutionManager::name_stub_kind`]);
    /// the lock also makes one thread at a time write the descriptor's
    /// labels.
    stub_names: Mutex<stub_names::Names>,
}

impl fmt::Debug for ExecutionManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecutionManager")
            .field("remote_index", &self.remote_index())
            .finish_non_exhaustive()
    }
}

/// A code heap registered with its manager: the one handle a runtime keeps
/// for a heap (it derefs to the [`CodeHeap`]). It holds a handle of the
/// manager, so it needs no lifetime. Dropping it unregisters the heap; its
/// memory is unmapped once readers pinned before that have unpinned and
/// executors have passed a quiescent point.
pub struct OwnedHeap {
    heap: Arc<CodeHeap>,
    manager: ExecutionManager,
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
    pub fn manager(&self) -> &ExecutionManager {
        &self.manager
    }
}

impl Drop for OwnedHeap {
    fn drop(&mut self) {
        self.manager.unregister_heap(&self.heap);
    }
}

impl ExecutionManager {
    /// A manager whose readers and executors share a domain of `reader_slots`
    /// slots (see [`Domain::new`]).
    ///
    /// Every thread that looks code up ([`ExecutionManager::register_reader`]),
    /// runs it ([`ExecutionManager::register_executor`]) or is attached to the
    /// agent takes one slot while registered: size it for all of them.
    ///
    /// The manager also takes one of the process's [`crate::remote::MAX_MANAGERS`]
    /// (8) entries in the out-of-process descriptor ([`crate::remote`]), so
    /// that `jitmap inspect`, the eBPF profiler and debuggers find its range
    /// map. A manager created while all of them are taken by live managers
    /// works in process exactly as any other, but readers in other processes
    /// do not see it: [`ExecutionManager::remote_index`] says `None`, and it
    /// does not take an entry freed later.
    pub fn new(reader_slots: usize) -> Self {
        let ranges = RangeSectionMap::new(&Domain::new(reader_slots));
        let remote = descriptor::Registration::new(ranges.root_address());
        Self {
            inner: Arc::new(Inner {
                remote,
                ranges,
                listeners: Arc::new(Listeners::default()),
                retired: Mutex::new(Vec::new()),
                frameless_stubs: AtomicU32::new(0),
                stub_names: Mutex::new(Default::default()),
            }),
        }
    }

    /// The range map (for the bound guard's lookups).
    #[inline]
    pub(crate) fn ranges(&self) -> &RangeSectionMap<SectionKind> {
        &self.inner.ranges
    }

    /// This manager's index among the descriptor's managers, or `None` when
    /// every entry was taken by other live managers.
    pub fn remote_index(&self) -> Option<usize> {
        self.inner
            .remote
            .as_ref()
            .map(descriptor::Registration::index)
    }

    /// The listeners every heap of this manager emits code events to.
    pub fn listeners(&self) -> &Arc<Listeners> {
        &self.inner.listeners
    }

    /// Declares that stubs of `kind` push no frame: a thread stopped in one
    /// has its caller's return address on top of its stack, and the frame
    /// pointer still names the caller's caller (a trampoline that jumps on,
    /// `jmp [cell]`, is such a stub). Stack walkers then step a stub of this
    /// kind caught as the innermost frame by that rule instead of by its
    /// frame pointer, which would skip the caller. Stubs of other kinds are
    /// taken to keep frame pointers.
    ///
    /// ```
    /// use jitmap::ExecutionManager;
    /// use jitmap::heap::StubKind;
    ///
    /// let manager = ExecutionManager::new(2);
    /// let trampoline = StubKind::new(3).unwrap();
    /// assert!(!manager.is_frameless_stub(trampoline));
    /// manager.declare_frameless_stub(trampoline);
    /// assert!(manager.is_frameless_stub(trampoline));
    /// ```
    pub fn declare_frameless_stub(&self, kind: StubKind) {
        // Relaxed: a walker that has not seen the bit yet steps the stub by
        // its frame pointer, as before the declaration; nothing else is
        // ordered by it.
        self.inner
            .frameless_stubs
            .fetch_or(1 << kind.get(), Ordering::Relaxed);
        // Readers in other processes find them beside the manager's entry.
        if let Some(remote) = &self.inner.remote {
            remote.add_frameless(1 << kind.get());
        }
    }

    /// Whether stubs of `kind` were declared frameless
    /// ([`ExecutionManager::declare_frameless_stub`]).
    pub fn is_frameless_stub(&self, kind: StubKind) -> bool {
        self.frameless_stubs() & (1 << kind.get()) != 0
    }

    /// Names stubs of `kind`: what they are and who makes them, so that
    /// listings and profiles, in this process and from outside it (`jitmap
    /// inspect --list`, `jitmap profile`, the agent's profiles), say
    /// `trampoline (jitmap-cranelift)` instead of a number. Naming a kind
    /// again with the same name does nothing; with another name it fails,
    /// and the first name stays.
    ///
    /// ```
    /// use jitmap::{ExecutionManager, ManagerError, StubKindName};
    /// use jitmap::heap::StubKind;
    ///
    /// let manager = ExecutionManager::new(2);
    /// let kind = StubKind::new(2).unwrap();
    /// let name = StubKindName::new("my-runtime", "call counter")?;
    /// manager.name_stub_kind(kind, name.clone())?;
    /// assert_eq!(manager.stub_kind_name(kind), Some(name.clone()));
    /// let other = StubKindName::new("my-runtime", "precode")?;
    /// assert_eq!(
    ///     manager.name_stub_kind(kind, other),
    ///     Err(ManagerError::StubKindNamed { kind })
    /// );
    /// assert_eq!(manager.stub_kind_name(kind), Some(name));
    /// # Ok::<(), ManagerError>(())
    /// ```
    pub fn name_stub_kind(&self, kind: StubKind, name: StubKindName) -> Result<(), ManagerError> {
        let slot = stub_names::slot(kind);
        let mut names = self.inner.stub_names.lock();
        match &names[slot] {
            Some(existing) if *existing == name => return Ok(()),
            Some(_) => return Err(ManagerError::StubKindNamed { kind }),
            None => {}
        }
        if let Some(remote) = &self.inner.remote {
            remote.set_label(slot, &name);
        }
        names[slot] = Some(name);
        Ok(())
    }

    /// The name given to `kind` ([`ExecutionManager::name_stub_kind`]), if
    /// any. Takes a lock: not for a signal handler.
    pub fn stub_kind_name(&self, kind: StubKind) -> Option<StubKindName> {
        self.inner.stub_names.lock()[stub_names::slot(kind)].clone()
    }

    /// Every stub kind's name, slot k - 1 for kind k, in one lock.
    pub(crate) fn stub_kind_names(&self) -> stub_names::Names {
        self.inner.stub_names.lock().clone()
    }

    /// The frameless stub kinds, bit k for kind k: one load, for a walker in
    /// a signal handler.
    #[inline]
    pub(crate) fn frameless_stubs(&self) -> u32 {
        // Relaxed: as in `declare_frameless_stub`.
        self.inner.frameless_stubs.load(Ordering::Relaxed)
    }

    /// The reader domain.
    pub fn domain(&self) -> &Arc<Domain> {
        self.inner.ranges.domain()
    }

    /// Registers the calling thread as an executor of this manager's code (see
    /// [`Executor`]): frees then wait for its quiescent points before reusing
    /// bytes it may still be running.
    pub fn register_executor(&self) -> Result<Executor, EpochError> {
        self.domain().register_executor()
    }

    /// Registers a reader for the calling thread (register it outside signal
    /// handlers; a handler pins it). Lookups go through
    /// [`ExecutionManager::pin`].
    pub fn register_reader(&self) -> Result<Reader, EpochError> {
        self.domain().register()
    }

    /// Pins `reader` and binds the guard to this manager: lookups through it
    /// answer `Option`, with no per-lookup check. Lock-free, no allocation, no
    /// system call: a signal handler may pin (pins nest). A reader registered
    /// with another manager is refused with [`EpochError::ForeignReader`].
    ///
    /// ```
    /// let manager = jitmap::ExecutionManager::new(2);
    /// let other = jitmap::ExecutionManager::new(1);
    /// let reader = manager.register_reader()?;
    /// assert!(manager.pin(&reader)?.find(0x1000).is_none());
    /// assert_eq!(other.pin(&reader).err(), Some(jitmap::EpochError::ForeignReader));
    /// # Ok::<(), jitmap::EpochError>(())
    /// ```
    #[inline]
    pub fn pin<'r>(&'r self, reader: &'r Reader) -> Result<ManagerGuard<'r>, EpochError> {
        if !Arc::ptr_eq(reader.domain(), self.domain()) {
            return Err(EpochError::ForeignReader);
        }
        Ok(ManagerGuard::new(reader.pin()?, self))
    }

    /// Creates a code heap and registers its range. Also reclaims sections
    /// removed earlier whose grace period has passed (as every manager writer
    /// call does).
    pub fn create_heap(&self, config: HeapConfig) -> Result<OwnedHeap, ManagerError> {
        Ok(OwnedHeap {
            heap: self.register_heap(config)?,
            manager: self.clone(),
        })
    }

    fn register_heap(&self, config: HeapConfig) -> Result<Arc<CodeHeap>, ManagerError> {
        self.try_reclaim_sections();
        let heap =
            CodeHeap::with_listeners(config, self.domain(), Arc::clone(&self.inner.listeners))?;
        let heap = Arc::new(heap);
        let (begin, end) = (heap.base(), heap.base() + heap.span() as usize);
        let section = HeapSection {
            lookup: heap.lookup(),
            heap: Arc::clone(&heap),
        };
        self.inner
            .ranges
            .insert(begin, end, SectionKind::Heap(section))?;
        Ok(heap)
    }

    fn unregister_heap(&self, heap: &CodeHeap) {
        // The section was registered by `register_heap` and only the heap's one
        // handle removes it, so it is present.
        let _ = self.inner.ranges.remove(heap.base());
        self.reclaim_retired();
    }

    /// The registered heaps, in address order (for a profiler or debugger that
    /// attaches late).
    pub fn heaps(&self) -> Vec<Arc<CodeHeap>> {
        self.inner
            .ranges
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

    /// The loaded images, in address order (for a profiler that attaches
    /// late and names image methods).
    pub fn images(&self) -> Vec<Arc<ImageSection>> {
        self.inner
            .ranges
            .values()
            .into_iter()
            .filter_map(|kind| match kind {
                SectionKind::Image(entry) => Some(entry.image),
                SectionKind::Heap(_) => None,
            })
            .collect()
    }

    /// Validates and registers an image; returns its base. Listeners get a
    /// [`CodeEvent::ImageLoad`] once lookups can find it.
    ///
    /// ```
    /// use jitmap::image::{ImageFunction, ImageInfo, ImageMethod};
    /// use jitmap::{ExecutionManager, Lookup};
    ///
    /// let manager = ExecutionManager::new(4);
    /// let base = 0x7000_0000_0000;
    /// manager.load_image(ImageInfo {
    ///     base,
    ///     size: 0x100,
    ///     functions: vec![ImageFunction { begin: 0, end: 0x40, unwind: Box::new([]) }],
    ///     methods: vec![ImageMethod {
    ///         entry: 0,
    ///         method_id: 7,
    ///         gc: None,
    ///         debug: vec![],
    ///         name: "guest::leaf".into(),
    ///     }],
    ///     ..ImageInfo::default()
    /// })?;
    /// let reader = manager.register_reader()?;
    /// let guard = manager.pin(&reader)?;
    /// let Lookup::Method(block) = guard.classify(base + 0x10) else { panic!() };
    /// assert_eq!((block.method_id(), block.offset()), (7, 0x10));
    /// drop(guard);
    /// manager.unload_image(base)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn load_image(&self, info: ImageInfo) -> Result<usize, ManagerError> {
        self.load_image_section(info).map(|image| image.base())
    }

    /// [`ExecutionManager::load_image`], returning the validated image: for
    /// a host that answers questions about it without a lookup.
    pub fn load_image_section(&self, info: ImageInfo) -> Result<Arc<ImageSection>, ManagerError> {
        self.try_reclaim_sections();
        let (base, size) = (info.base, info.size);
        let image = Arc::new(ImageSection::new(info).map_err(ManagerError::Image)?);
        let end = base
            .checked_add(size)
            .ok_or(ManagerError::Range(RangeError::OutOfRange {
                begin: base,
                end: usize::MAX,
            }))?;
        self.inner
            .ranges
            .insert(
                base,
                end,
                SectionKind::Image(ImageEntry::new(Arc::clone(&image))),
            )
            .map_err(ManagerError::Range)?;
        // After the insert: an event is never sent for an image that did
        // not load. A handler may find the image before its event is
        // queued; the agent's collector waits a pass for it.
        let listeners = &self.inner.listeners;
        if !listeners.is_empty() {
            listeners.emit(CodeEvent::ImageLoad(ImageLoad {
                timestamp: monotonic_ns(),
                image: Arc::clone(&image),
            }));
            listeners.throttle();
        }
        Ok(image)
    }

    /// Unregisters the image loaded at `base`. Anything else there (a code heap)
    /// is refused with [`ManagerError::NotAnImage`] and stays registered.
    /// Listeners get a [`CodeEvent::ImageUnload`].
    pub fn unload_image(&self, base: usize) -> Result<(), ManagerError> {
        let mut image_id = 0;
        let removed = self.inner.ranges.remove_if(base, |kind| match kind {
            SectionKind::Image(entry) => {
                image_id = entry.image.id();
                true
            }
            SectionKind::Heap(_) => false,
        });
        match removed {
            Err(RangeError::WrongKind { .. }) => Err(ManagerError::NotAnImage { base }),
            Err(e) => Err(ManagerError::Range(e)),
            Ok(()) => {
                let listeners = &self.inner.listeners;
                if !listeners.is_empty() {
                    listeners.emit(CodeEvent::ImageUnload(ImageUnload {
                        timestamp: monotonic_ns(),
                        base,
                        image_id,
                    }));
                    listeners.throttle();
                }
                Ok(())
            }
        }
    }

    /// Frees removed sections (and unmaps retired heaps no one else holds) whose
    /// grace period has passed, and drops the values [`ExecutionManager::retire`]
    /// was given whose grace period has passed. Returns the number of sections
    /// freed (a heap's own [`CodeHeap::try_reclaim`] returns the bytes of blocks
    /// it reclaimed).
    ///
    /// Removal reclaims at once when no reader is pinned; a section removed while
    /// one was is freed by the next manager writer call (`create_heap`,
    /// `load_image`, `unload_image`, a heap handle's drop, `retire`) or by this
    /// one.
    pub fn try_reclaim_sections(&self) -> usize {
        self.reclaim_retired();
        self.inner.ranges.try_reclaim()
    }

    /// Drops `value` once every reader pinned now has unpinned and every
    /// executor online now has passed a quiescent point: for what JIT code or
    /// lookups may still reach after the host stops publishing it, such as a
    /// module's call cells or constant pools, or metadata a lookup's answer
    /// points into. The drop happens in a later manager writer call (see
    /// [`ExecutionManager::try_reclaim_sections`]), or in this one when no
    /// thread holds the grace period back, or when the manager itself drops.
    ///
    /// ```
    /// use std::sync::Arc;
    ///
    /// let manager = jitmap::ExecutionManager::new(2);
    /// let cells = Arc::new([0usize; 4]);
    /// let executor = manager.register_executor()?; // online: may run code that reads `cells`
    /// manager.retire(Arc::clone(&cells));
    /// assert_eq!(Arc::strong_count(&cells), 2); // held back by the executor
    /// executor.quiescent();
    /// manager.try_reclaim_sections();
    /// assert_eq!(Arc::strong_count(&cells), 1);
    /// # Ok::<(), jitmap::EpochError>(())
    /// ```
    pub fn retire<T: Send + 'static>(&self, value: T) {
        let tag = self.domain().retire_tag();
        self.inner.retired.lock().push((tag, Box::new(value)));
        self.reclaim_retired();
    }

    /// Drops the retired values whose grace period has passed, outside the lock
    /// (a value's drop may call back into the manager).
    fn reclaim_retired(&self) {
        let done: Vec<Box<dyn Send>> = {
            let mut retired = self.inner.retired.lock();
            if retired.is_empty() {
                return;
            }
            let safe_before = self.domain().safe_before();
            let (done, kept) = std::mem::take(&mut *retired)
                .into_iter()
                .partition(|(tag, _)| *tag < safe_before);
            *retired = kept;
            done.into_iter().map(|(_, value)| value).collect()
        };
        drop(done);
    }
}
