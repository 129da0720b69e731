//! The range-section map: address → range section (a code heap or an image),
//! with the 64-bit layout of the .NET runtime.
//!
//! Five levels of 256 entries index address bits 17..56; bits 57..63 must be
//! zero. Each leaf entry covers a 128 KiB chunk and points to a list of
//! fragments, one per section touching the chunk. Each fragment carries the
//! section's bounds and its own clone of the section's value, so a lookup ends at
//! the fragment without another pointer chase. Lookups are lock-free and bounded:
//! at most five level loads, then the chunk's short fragment list. Inserts and
//! removals are serialized; removal unlinks at once and frees the fragments only
//! after the grace period of the map's [`Domain`].

mod error;

use std::collections::BTreeMap;
use std::ptr;
use std::sync::Arc;

use parking_lot::Mutex;

pub use error::RangeError;

use crate::change_seq::ChangeSeq;
use crate::epoch::{Domain, ForeignGuard, Guard, LastSection};
use crate::sync::{AtomicPtr, AtomicU64, Ordering};

/// The next map's id (see [`RangeSectionMap::find`]); 0 means none.
static NEXT_MAP_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Entries per level.
pub const FANOUT: usize = 256;
/// Bits below the leaf index: each leaf entry covers a 2^17 = 128 KiB chunk.
pub const CHUNK_BITS: u32 = 17;
/// Addresses must be below 2^57.
pub const ADDRESS_BITS: u32 = 57;
/// Number of levels.
pub const LEVELS: usize = 5;
/// The largest section: 4 GiB, the most a code heap spans or an image's 32-bit
/// offsets can address. It costs 32,768 fragments of 64 bytes (2 MiB), which
/// bounds what one insert may allocate.
pub const MAX_SECTION_BYTES: usize = 1 << 32;

/// Address bits below the index of level 2 (the hint's key is the bits above).
const HINT_KEY_SHIFT: u32 = CHUNK_BITS + 16;
/// Levels are page-aligned, so a level pointer shifted right by this many bits
/// loses nothing.
const LEVEL_ALIGN_BITS: u32 = 12;
/// Bits of the shifted level pointer in a hint (pointers below 2^48).
const HINT_PTR_BITS: u32 = 48 - LEVEL_ALIGN_BITS;

/// One level: 256 pointers to the next level down, or (leaf) to fragment lists.
/// Page-aligned so that the level-2 hint can pack a pointer with its key.
#[repr(C, align(4096))]
struct Level {
    entries: [AtomicPtr<u8>; FANOUT],
}

impl Level {
    fn new() -> Self {
        Self {
            entries: std::array::from_fn(|_| AtomicPtr::new(ptr::null_mut())),
        }
    }
}

/// A section's presence in one chunk: its bounds and value. `#[repr(C)]` with the
/// bounds first, for out-of-process readers; cache-line aligned, so a lookup that
/// ends here touches one line when `T` is small.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct Section<T> {
    begin: usize,
    end: usize,
    /// The next fragment in the chunk's list, type-erased like the leaf entries.
    next: AtomicPtr<u8>,
    value: T,
}

impl<T> Section<T> {
    /// First address of the section.
    pub fn begin(&self) -> usize {
        self.begin
    }

    /// One past the last address of the section.
    pub fn end(&self) -> usize {
        self.end
    }

    /// What the section holds.
    pub fn value(&self) -> &T {
        &self.value
    }
}

/// Where out-of-process readers find a fragment's fields (byte offsets).
#[cfg(not(loom))]
pub(crate) struct FragmentLayout {
    pub(crate) size: usize,
    pub(crate) begin: usize,
    pub(crate) end: usize,
    pub(crate) next: usize,
    pub(crate) value: usize,
}

/// The layout of a fragment holding a `T`.
#[cfg(not(loom))]
pub(crate) const fn fragment_layout<T>() -> FragmentLayout {
    FragmentLayout {
        size: size_of::<Section<T>>(),
        begin: std::mem::offset_of!(Section<T>, begin),
        end: std::mem::offset_of!(Section<T>, end),
        next: std::mem::offset_of!(Section<T>, next),
        value: std::mem::offset_of!(Section<T>, value),
    }
}

/// Byte offset of the write sequence in the root.
#[cfg(not(loom))]
pub(crate) const ROOT_SEQ: usize = std::mem::offset_of!(Root, seq);

/// A section's fragments, one per chunk in ascending chunk order, in one
/// allocation: a lookup's fragment shares pages with its neighbours', and a
/// section is freed in one step.
type Slab<T> = *mut [Section<T>];

/// What the writer keeps per live section: its fragments, for unlinking.
struct Live<T> {
    end: usize,
    fragments: Slab<T>,
}

struct Retired<T> {
    tag: u64,
    fragments: Slab<T>,
}

struct Writer<T> {
    live: BTreeMap<usize, Live<T>>,
    retired: Vec<Retired<T>>,
}

/// The top level and the map's write sequence, in one boxed block whose address
/// never changes: out-of-process readers find it through the descriptor
/// ([`crate::remote`]) however the map itself moves.
#[repr(C)]
pub(crate) struct Root {
    top: Level,
    /// Bracketing every link and unlink of fragments, for readers in other
    /// processes (in-process readers rely on guards instead).
    seq: ChangeSeq,
}

/// Address → section map with lock-free, bounded lookups.
pub struct RangeSectionMap<T> {
    root: Box<Root>,
    /// This map's id among every map of the process (for guards' caches).
    id: u64,
    /// The level-2 table of the most recent insert, packed as `key << 36 | ptr >> 12`
    /// where the key is address bits 33..56 (0 = none). Levels are never freed
    /// while the map lives, so a stale hint still names a valid level for its key;
    /// lookups whose key matches skip the top three loads of the walk.
    hint: AtomicU64,
    domain: Arc<Domain>,
    writer: Mutex<Writer<T>>,
}

// SAFETY: the raw pointers are owned by the map (created by `Box::into_raw`, freed
// once, after a grace period); readers only get shared references to `Section<T>`,
// so `T` must be `Sync`, and values are dropped on whichever thread reclaims, so
// `T` must be `Send`.
unsafe impl<T: Send + Sync> Send for RangeSectionMap<T> {}
// SAFETY: as above.
unsafe impl<T: Send + Sync> Sync for RangeSectionMap<T> {}

impl<T: Clone> RangeSectionMap<T> {
    /// An empty map whose removals wait for readers pinned in `domain`.
    pub fn new(domain: &Arc<Domain>) -> Self {
        Self {
            root: Box::new(Root {
                top: Level::new(),
                seq: ChangeSeq::new(),
            }),
            // Relaxed: a unique number, ordering nothing.
            id: NEXT_MAP_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            hint: AtomicU64::new(0),
            domain: Arc::clone(domain),
            writer: Mutex::new(Writer {
                live: BTreeMap::new(),
                retired: Vec::new(),
            }),
        }
    }

    /// The reader domain.
    pub fn domain(&self) -> &Arc<Domain> {
        &self.domain
    }

    /// The address of the root (top level, then the write sequence), for the
    /// out-of-process descriptor.
    #[cfg(not(loom))]
    pub(crate) fn root_address(&self) -> usize {
        ptr::from_ref::<Root>(&self.root).addr()
    }

    /// The write sequence (for the loom model of its readers).
    pub fn change_seq(&self) -> &ChangeSeq {
        &self.root.seq
    }

    /// Finds the section containing `addr`. Lock-free and bounded. A guard from
    /// another domain is refused.
    #[inline]
    pub fn find<'g>(
        &'g self,
        guard: &'g Guard<'_>,
        addr: usize,
    ) -> Result<Option<&'g Section<T>>, ForeignGuard> {
        guard.check(&self.domain)?;
        Ok(self.find_in_domain(guard, addr))
    }

    /// [`RangeSectionMap::find`] under a guard the caller knows to be pinned
    /// in this map's domain (a manager's bound guard): no check.
    #[inline(always)]
    pub(crate) fn find_in_domain<'g>(
        &'g self,
        guard: &'g Guard<'_>,
        addr: usize,
    ) -> Option<&'g Section<T>> {
        let last = guard.last_section().get();
        if addr.wrapping_sub(last.begin) < last.end - last.begin
            && last.map == self.id
            && (crate::sync::defect!(SectionCacheUnchecked) || self.root.seq.read() == last.seq)
        {
            // SAFETY: this map found the fragment under `guard`, which is still
            // pinned, so the fragment is not yet freed; and no change has
            // happened since (the sequence reads as it did before that walk),
            // so it is still linked and this walk would find it again.
            return Some(unsafe { &*last.section.cast::<Section<T>>() });
        }
        let seq = self.root.seq.read();
        let found = self.find_pinned(addr);
        if let Some(section) = found
            && seq & 1 == 0
        {
            guard.last_section().set(LastSection {
                map: self.id,
                seq,
                begin: section.begin,
                end: section.end,
                section: ptr::from_ref(section).cast(),
            });
        }
        found
    }

    /// [`RangeSectionMap::find`] once the guard is checked.
    #[inline]
    fn find_pinned(&self, addr: usize) -> Option<&Section<T>> {
        if addr >> ADDRESS_BITS != 0 {
            return None;
        }
        // Acquire: the hinted level was installed (and initialized) before the hint.
        let hint = self.hint.load(Ordering::Acquire);
        let (mut level, from) =
            if hint != 0 && (hint >> HINT_PTR_BITS) as usize == addr >> HINT_KEY_SHIFT {
                let addr = ((hint & ((1 << HINT_PTR_BITS) - 1)) << LEVEL_ALIGN_BITS) as usize;
                // The writer exposed this level's provenance when it packed the hint.
                let ptr = ptr::with_exposed_provenance::<Level>(addr);
                // SAFETY: the hint holds a level-2 table for this key; levels are freed
                // only when the map drops.
                (unsafe { &*ptr }, 1)
            } else {
                (&self.root.top, LEVELS - 1)
            };
        for depth in (1..=from).rev() {
            // Acquire: a level installed by a writer is fully initialized before
            // its pointer is seen.
            let next = level.entries[index(addr, depth)].load(Ordering::Acquire);
            if next.is_null() {
                return None;
            }
            // SAFETY: non-null upper-level entries point to `Level`s, which are only
            // freed when the map drops.
            level = unsafe { &*next.cast::<Level>() };
        }
        // Acquire: pairs with the Release store that linked the fragment.
        let mut fragment = level.entries[index(addr, 0)]
            .load(Ordering::Acquire)
            .cast::<Section<T>>();
        while !fragment.is_null() {
            // SAFETY: fragments reachable from the map are freed only after every
            // guard pinned before their unlinking has dropped; `guard` is pinned.
            let f = unsafe { &*fragment };
            if f.begin <= addr && addr < f.end {
                return Some(f);
            }
            // Acquire: as above, for fragments linked behind the head.
            fragment = f.next.load(Ordering::Acquire).cast();
        }
        None
    }

    /// Registers `[begin, end)` holding `value` (cloned into each 128 KiB chunk the
    /// range touches). A section spans at most [`MAX_SECTION_BYTES`].
    pub fn insert(&self, begin: usize, end: usize, value: T) -> Result<(), RangeError> {
        if begin >= end {
            return Err(RangeError::Empty { begin, end });
        }
        if (end - 1) >> ADDRESS_BITS != 0 {
            return Err(RangeError::OutOfRange { begin, end });
        }
        if end - begin > MAX_SECTION_BYTES {
            return Err(RangeError::TooLarge { begin, end });
        }
        let mut w = self.writer.lock();
        if let Some((&other, live)) = w.live.range(..end).next_back()
            && live.end > begin
        {
            return Err(RangeError::Overlap {
                begin,
                existing: other,
            });
        }
        let chunks = (begin >> CHUNK_BITS)..=((end - 1) >> CHUNK_BITS);
        let count = chunks.clone().count();
        let oom = |_| RangeError::OutOfMemory { begin, end };
        let mut heads: Vec<&AtomicPtr<u8>> = Vec::new();
        heads.try_reserve_exact(count).map_err(oom)?;
        let mut slab: Vec<Section<T>> = Vec::new();
        slab.try_reserve_exact(count).map_err(oom)?;
        heads.extend(chunks.map(|chunk| {
            &self.leaf_for(chunk << CHUNK_BITS).entries[index(chunk << CHUNK_BITS, 0)]
        }));
        slab.extend(heads.iter().map(|head| Section {
            begin,
            end,
            // Relaxed: writers are serialized by the lock.
            next: AtomicPtr::new(head.load(Ordering::Relaxed)),
            value: value.clone(),
        }));
        let slab = slab.into_boxed_slice();
        // The slab never moves from here on: fragments are linked by address.
        let fragments = Box::into_raw(slab);
        self.root.seq.begin();
        for (n, head) in heads.iter().enumerate() {
            // SAFETY: `n` is within the slab we just allocated and own.
            let fragment = unsafe { &raw mut (*fragments)[n] };
            // Release: the fragment is initialized before a reader can reach it.
            head.store(fragment.cast(), Ordering::Release);
        }
        self.root.seq.end();
        w.live.insert(begin, Live { end, fragments });
        Ok(())
    }

    /// Unregisters the section that begins at `begin`. Readers stop finding it at
    /// once; its memory (and `T`) is dropped after the grace period.
    pub fn remove(&self, begin: usize) -> Result<(), RangeError> {
        self.remove_if(begin, |_| true)
    }

    /// Unregisters the section that begins at `begin` if its value satisfies
    /// `allowed`; otherwise [`RangeError::WrongKind`], and nothing changes.
    pub fn remove_if(
        &self,
        begin: usize,
        allowed: impl FnOnce(&T) -> bool,
    ) -> Result<(), RangeError> {
        let mut w = self.writer.lock();
        let live = w.live.get(&begin).ok_or(RangeError::NotFound { begin })?;
        // SAFETY: a live slab is non-empty (one fragment per chunk) and freed only
        // by this writer, whose lock we hold.
        if !allowed(unsafe { &(*live.fragments)[0].value }) {
            return Err(RangeError::WrongKind { begin });
        }
        let live = w
            .live
            .remove(&begin)
            .ok_or(RangeError::NotFound { begin })?;
        // Fragments were created one per chunk, in ascending chunk order.
        self.root.seq.begin();
        for n in 0..live.fragments.len() {
            // SAFETY: `n` is within the live slab, which only this writer frees.
            let fragment = unsafe { &raw mut (*live.fragments)[n] };
            self.unlink(((begin >> CHUNK_BITS) + n) << CHUNK_BITS, fragment);
        }
        self.root.seq.end();
        let tag = self.domain.retire_tag();
        w.retired.push(Retired {
            tag,
            fragments: live.fragments,
        });
        drop(w);
        self.try_reclaim();
        Ok(())
    }

    /// Frees every removed section whose grace period has passed; returns how
    /// many were freed.
    pub fn try_reclaim(&self) -> usize {
        let mut w = self.writer.lock();
        if w.retired.is_empty() {
            return 0;
        }
        let safe_before = self.domain.safe_before();
        let (done, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut w.retired)
            .into_iter()
            .partition(|r| r.tag < safe_before);
        w.retired = kept;
        drop(w);
        let freed = done.len();
        for r in done {
            free_fragments(r.fragments);
        }
        freed
    }

    /// The values of the registered sections, in address order.
    pub fn values(&self) -> Vec<T> {
        let w = self.writer.lock();
        w.live
            .values()
            // SAFETY: a live slab is non-empty and freed only by this writer,
            // whose lock we hold.
            .map(|live| unsafe { &(*live.fragments)[0] }.value.clone())
            .collect()
    }

    /// Number of registered sections.
    pub fn len(&self) -> usize {
        self.writer.lock().live.len()
    }

    /// Whether no section is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Removed sections still waiting for their grace period.
    pub fn retired(&self) -> usize {
        self.writer.lock().retired.len()
    }

    /// Unlinks `fragment` from the list of the chunk at `chunk_addr`.
    fn unlink(&self, chunk_addr: usize, fragment: *mut Section<T>) {
        let leaf = self.leaf_for(chunk_addr);
        let mut link = &leaf.entries[index(chunk_addr, 0)];
        loop {
            // Relaxed: writers are serialized by the lock; they see their own stores.
            let current = link.load(Ordering::Relaxed).cast::<Section<T>>();
            if current.is_null() {
                return;
            }
            // SAFETY: fragments in a list are live while the writer lock is held.
            let next = unsafe { &(*current).next };
            if current == fragment {
                // Relaxed load: our own earlier store. Release store: readers that
                // follow the new link see the fragments behind it initialized.
                link.store(next.load(Ordering::Relaxed), Ordering::Release);
                return;
            }
            link = next;
        }
    }

    /// The leaf level for `addr`, creating missing levels on the way, and the
    /// level-2 hint updated to point at its parent.
    fn leaf_for(&self, addr: usize) -> &Level {
        let mut level = &self.root.top;
        for depth in (1..LEVELS).rev() {
            if depth == 1 {
                let ptr = ptr::from_ref(level).expose_provenance() as u64;
                if ptr >> 48 == 0 {
                    let key = (addr >> HINT_KEY_SHIFT) as u64;
                    // Release: readers that use the hint see the level initialized.
                    self.hint.store(
                        key << HINT_PTR_BITS | ptr >> LEVEL_ALIGN_BITS,
                        Ordering::Release,
                    );
                }
            }
            let entry = &level.entries[index(addr, depth)];
            // Acquire: see a level another writer installed.
            let mut next = entry.load(Ordering::Acquire);
            if next.is_null() {
                let fresh = Box::into_raw(Box::new(Level::new())).cast::<u8>();
                // AcqRel: Release publishes the zeroed level to readers; Acquire on
                // failure sees the level that won.
                next = match entry.compare_exchange(
                    ptr::null_mut(),
                    fresh,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => fresh,
                    Err(winner) => {
                        // SAFETY: `fresh` was never published; we still own it.
                        drop(unsafe { Box::from_raw(fresh.cast::<Level>()) });
                        winner
                    }
                };
            }
            // SAFETY: levels are freed only when the map drops.
            level = unsafe { &*next.cast::<Level>() };
        }
        level
    }
}

impl<T> Drop for RangeSectionMap<T> {
    fn drop(&mut self) {
        // A change that never ends: a reader in another process that read the
        // sequence before this drop and checks it after sees it odd (or, once
        // the root's memory is reused, some other value), so nothing it read
        // from the freed levels and fragments is ever confirmed.
        self.root.seq.begin();
        let w = self.writer.get_mut();
        for (_, live) in std::mem::take(&mut w.live) {
            free_fragments(live.fragments);
        }
        for r in std::mem::take(&mut w.retired) {
            free_fragments(r.fragments);
        }
        free_levels(&self.root.top, LEVELS - 1);
    }
}

fn free_fragments<T>(fragments: Slab<T>) {
    // SAFETY: the slab came from `Box::into_raw` and is freed exactly once, after no
    // reader can reach it.
    drop(unsafe { Box::from_raw(fragments) });
}

fn free_levels(level: &Level, depth: usize) {
    if depth == 0 {
        return;
    }
    for entry in &level.entries {
        // Relaxed: the map is being dropped; no reader or writer remains.
        let child = entry.load(Ordering::Relaxed);
        if !child.is_null() {
            // SAFETY: upper-level entries point to boxed `Level`s owned by the map.
            let child = unsafe { Box::from_raw(child.cast::<Level>()) };
            free_levels(&child, depth - 1);
        }
    }
}

/// Index into the level at `depth` (0 = leaf) for `addr`.
pub(crate) fn index(addr: usize, depth: usize) -> usize {
    (addr >> (CHUNK_BITS as usize + 8 * depth)) & (FANOUT - 1)
}
