//! Lookups through a guard bound to its manager: pinned once per stack walk
//! or sample, then every lookup answers `Option`, because a guard from another
//! manager's domain cannot reach them.

use std::ops::Deref;

use crate::epoch::Guard;
use crate::heap::{BlockKind, StubKind};
use crate::range::{RangeSectionMap, Section};

use super::{CodeBlock, ExecutionManager, SectionKind};

/// What is at an address.
#[derive(Clone, Copy, Debug)]
pub enum Lookup<'g> {
    /// A method (JIT or image code).
    Method(CodeBlock<'g>),
    /// A stub block in a code heap.
    Stub {
        /// The stub kind.
        kind: StubKind,
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
    /// [`ManagerGuard::classify_bounded`] (never from the other lookups).
    TooFar,
}

/// A pinned guard bound to the manager it was pinned for, from
/// [`ExecutionManager::pin`]. Every lookup goes through it: lock-free,
/// allocation-free, no system call (signal-safe), and it keeps what it found
/// alive until it drops. It also derefs to the plain [`Guard`], for the
/// lower layers' lookups ([`crate::CodeHeap::find`]).
///
/// ```
/// use jitmap::{CodeInfo, ExecutionManager, HeapConfig, JitKind};
/// let manager = ExecutionManager::new(4);
/// let heap = manager.create_heap(HeapConfig { span: 1 << 20, ..HeapConfig::default() })?;
/// let mut r = heap.reserve(4)?;
/// r.code_mut().fill(0xC3);
/// let code = r.publish(CodeInfo::new(9, "f", JitKind::Optimized))?;
/// let reader = manager.register_reader()?;
/// let guard = manager.pin(&reader)?;
/// assert_eq!(guard.find(code.start() + 2).map(|b| b.offset()), Some(2));
/// assert!(guard.find(code.start() + 4).is_none());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct ManagerGuard<'r> {
    guard: Guard<'r>,
    /// The manager's range map itself, not the manager handle: a lookup
    /// starts one load closer to it.
    ranges: &'r RangeSectionMap<SectionKind>,
}

impl<'r> ManagerGuard<'r> {
    /// Binds `guard`, which the caller checked to be pinned in `manager`'s
    /// domain.
    #[inline]
    pub(super) fn new(guard: Guard<'r>, manager: &'r ExecutionManager) -> Self {
        Self {
            guard,
            ranges: manager.ranges(),
        }
    }

    /// The range map's change sequence ([`crate::change_seq::ChangeSeq`]):
    /// even between changes, and different after any section is added or
    /// removed. A lookup that found no section after reading an even value
    /// still holds while the sequence reads the same.
    #[inline]
    pub(crate) fn sections_seq(&self) -> u64 {
        self.ranges.change_seq().read()
    }

    /// The epoch guard under this one.
    #[inline]
    pub(crate) fn epoch_guard(&self) -> &Guard<'r> {
        &self.guard
    }

    /// The section containing `ip`.
    #[inline(always)]
    pub fn section(&self, ip: usize) -> Option<&Section<SectionKind>> {
        self.ranges.find_in_domain(&self.guard, ip)
    }

    /// Classifies `ip`. Bounded in v2 heaps and images; in a v1 heap the map
    /// walk grows with the method's size (see [`crate::MapVersion`]).
    #[inline]
    pub fn classify(&self, ip: usize) -> Lookup<'_> {
        self.classify_bounded(ip, usize::MAX)
    }

    /// [`ManagerGuard::classify`] reading at most `v1_words` map words of a v1
    /// heap (and as many end words): beyond that, [`Lookup::TooFar`]. What a
    /// caller with a budget uses, such as the agent's signal handler, so that
    /// a sample in a large v1 method costs bounded time.
    ///
    /// ```
    /// use jitmap::{CodeInfo, ExecutionManager, HeapConfig, JitKind, MapVersion, manager::Lookup};
    /// let manager = ExecutionManager::new(2);
    /// let heap = manager.create_heap(HeapConfig { span: 1 << 20, version: MapVersion::V1, ..HeapConfig::default() })?;
    /// let mut r = heap.reserve(64 << 10)?;
    /// r.code_mut().fill(0xC3);
    /// let code = r.publish(CodeInfo::new(1, "big", JitKind::Optimized))?;
    /// let reader = manager.register_reader()?;
    /// let guard = manager.pin(&reader)?;
    /// let deep = code.start() + (40 << 10); // 160 words past the start
    /// assert!(matches!(guard.classify_bounded(deep, 64), Lookup::TooFar));
    /// assert!(matches!(guard.classify_bounded(deep, 256), Lookup::Method(_)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn classify_bounded(&self, ip: usize, v1_words: usize) -> Lookup<'_> {
        self.classify_sectioned(ip, v1_words)
            .unwrap_or(Lookup::Nothing)
    }

    /// [`ManagerGuard::classify_bounded`], but `None` when no section holds
    /// `ip` (where it says [`Lookup::Nothing`] both for that and for free
    /// space inside a section): what the agent's handler tells native code
    /// from a heap's gaps with, in one walk of the range map per frame.
    #[inline]
    pub(crate) fn classify_sectioned(&self, ip: usize, v1_words: usize) -> Option<Lookup<'_>> {
        self.section(ip)
            .map(|section| classify_in(section, ip, v1_words))
    }

    /// The method block containing `ip`, or `None` (stubs, thunks, free
    /// space, headers, no section). Exact: an address past a block's end is
    /// `None`.
    #[inline(always)]
    pub fn find(&self, ip: usize) -> Option<CodeBlock<'_>> {
        match classify_in(self.section(ip)?, ip, usize::MAX) {
            Lookup::Method(block) => Some(block),
            _ => None,
        }
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
    pub fn find_return_address(&self, ra: usize) -> Option<CodeBlock<'_>> {
        self.find(ra.checked_sub(1)?)
    }

    /// The method id whose entry point is exactly `addr` (the analogue of
    /// `NonVirtualEntry2MethodDesc`).
    pub fn entry_to_method(&self, addr: usize) -> Option<u64> {
        let section = self.section(addr)?;
        match section.value() {
            SectionKind::Heap(s) => match s.heap().find(&self.guard, addr) {
                Ok(Some(b)) if b.offset() == 0 => match b.kind() {
                    BlockKind::Method(h) => Some(h.method_id()),
                    BlockKind::Stub(_) => None,
                },
                _ => None,
            },
            SectionKind::Image(image) => image
                .method_at_entry((addr - section.begin()) as u64)
                .map(|m| m.method_id),
        }
    }
}

impl<'r> Deref for ManagerGuard<'r> {
    type Target = Guard<'r>;

    fn deref(&self) -> &Guard<'r> {
        &self.guard
    }
}

/// What is at `ip` inside `section` (which contains it). Inlined into
/// `find` and `classify`, so that `find` builds no `Lookup` in memory.
#[inline(always)]
fn classify_in(section: &Section<SectionKind>, ip: usize, v1_words: usize) -> Lookup<'_> {
    match section.value() {
        SectionKind::Heap(s) => {
            // SAFETY: the section was found under a guard pinned in the domain
            // every heap of the manager shares (a `ManagerGuard` is made only
            // for its manager's domain), which keeps the section, and the
            // `Arc` in it keeps the heap, alive as long as the guard.
            let hit = match unsafe { s.lookup.find_capped(section.begin(), ip, v1_words) } {
                Ok(Some(hit)) => hit,
                Ok(None) => return Lookup::Nothing,
                Err(_) => return Lookup::TooFar,
            };
            // The maps alone made the hit exact. With no stub ever published
            // in the heap, the block is a method; otherwise the end map says
            // whether it is a stub, and only a stub's prefix is read.
            if !s.heap.may_hold_stubs() || !hit.is_stub() {
                return Lookup::Method(CodeBlock::jit(hit, section.begin()));
            }
            match hit.kind() {
                BlockKind::Stub(kind) => Lookup::Stub {
                    kind,
                    start: hit.start,
                    size: hit.size(),
                },
                BlockKind::Method(_) => Lookup::Method(CodeBlock::jit(hit, section.begin())),
            }
        }
        SectionKind::Image(image) => {
            let rel = (ip - section.begin()) as u64;
            if image.is_thunk(rel) {
                return Lookup::Thunk;
            }
            match image.lookup(rel) {
                Some(hit) => Lookup::Method(CodeBlock::image(image, hit)),
                None => Lookup::Nothing,
            }
        }
    }
}
