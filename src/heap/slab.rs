//! A heap's code headers, side by side in chunks it owns: 64 bytes and one
//! cache line each, no allocation per method, and a million headers in
//! 64 MiB rather than spread over the whole malloc heap, so that random
//! lookups touch fewer pages. A reclaimed header's slot is reused by the
//! next publish.
//!
//! Chunks come from the allocator, doubling from 16 headers to 1,024
//! (64 KiB), so that a small heap takes little. Once a heap that asks for
//! huge pages holds 32,768 headers (2 MiB), its next chunks are 2 MiB
//! mappings advised for transparent huge pages: a lookup at a random
//! address of a large heap then reads its header without a page walk (at a
//! million methods, a third of the find's time).

use std::alloc::{Layout, alloc, dealloc};
use std::ptr::NonNull;

use super::header::CodeHeader;
use crate::mapping::AnonMap;

/// Headers in the first chunk; each next chunk from the allocator holds
/// twice as many, up to [`LARGEST_ALLOCATED`] (64 KiB).
const FIRST_CHUNK: usize = 16;
const LARGEST_ALLOCATED: usize = 1024;
/// Bytes of a mapped chunk: one huge page on 4 KiB-page kernels (where
/// it is aligned and advised as one), 2 MiB of small pages where huge
/// pages are larger.
const MAPPED_BYTES: usize = 2 << 20;
/// Headers in a mapped chunk.
const MAPPED: usize = MAPPED_BYTES / size_of::<CodeHeader>();

/// A run of header slots.
enum Chunk {
    /// From the allocator (with its layout, to give it back).
    Allocated(NonNull<CodeHeader>, Layout),
    /// A 2 MiB mapping, unmapped when dropped.
    Mapped(AnonMap),
}

impl Chunk {
    fn base(&self) -> NonNull<CodeHeader> {
        match self {
            Self::Allocated(base, _) => *base,
            Self::Mapped(map) => map.base().cast(),
        }
    }

    fn slots(&self) -> usize {
        match self {
            Self::Allocated(_, layout) => layout.size() / size_of::<CodeHeader>(),
            Self::Mapped(_) => MAPPED,
        }
    }

    /// A chunk from the allocator of `slots` headers.
    fn allocated(slots: usize) -> Self {
        let layout = Layout::array::<CodeHeader>(slots).expect("at most 64 KiB");
        // SAFETY: the layout is not zero-sized (a header is 64 bytes).
        let base = NonNull::new(unsafe { alloc(layout) })
            .unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        Self::Allocated(base.cast(), layout)
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        if let Self::Allocated(base, layout) = self {
            // SAFETY: allocated in `Chunk::allocated` with this layout, freed
            // once; the heap has taken every header out (or leaks it).
            unsafe { dealloc(base.as_ptr().cast(), *layout) }
        }
    }
}

/// Storage for one heap's headers; serialized by the heap lock. It only
/// holds memory: what is stored is the heap's to take back out (with
/// [`HeaderSlab::remove`]) before the slab drops, or it is leaked, never
/// dropped twice.
pub(crate) struct HeaderSlab {
    chunks: Vec<Chunk>,
    /// Slots of the last chunk handed out so far.
    used: usize,
    /// Slots given back, reused first.
    free: Vec<NonNull<CodeHeader>>,
    /// Whether a large heap's chunks are huge-page mappings.
    huge: bool,
}

// SAFETY: the slab owns its chunks; the heap lock serializes every access to
// it, and readers only read headers they reached through a published slot.
unsafe impl Send for HeaderSlab {}

impl HeaderSlab {
    /// An empty slab; with `huge`, a large heap's chunks are 2 MiB mappings
    /// advised for huge pages.
    pub(crate) fn new(huge: bool) -> Self {
        Self {
            chunks: Vec::new(),
            used: 0,
            free: Vec::new(),
            huge,
        }
    }

    /// Bytes of the chunks mapped rather than allocated (which an
    /// allocator's statistics do not see).
    pub(crate) fn mapped_bytes(&self) -> usize {
        self.chunks
            .iter()
            .filter(|c| matches!(c, Chunk::Mapped(_)))
            .count()
            * MAPPED_BYTES
    }

    /// Stores `header`; the pointer stays valid until it is removed.
    pub(crate) fn insert(&mut self, header: CodeHeader) -> NonNull<CodeHeader> {
        let slot = self.free.pop().unwrap_or_else(|| self.carve());
        // SAFETY: the slot is in a live chunk, aligned for a header, and
        // holds none (fresh, or its header was moved out by `remove`).
        unsafe { slot.as_ptr().write(header) };
        slot
    }

    /// Takes a header back out; its slot is reused.
    ///
    /// # Safety
    /// `slot` came from this slab's [`HeaderSlab::insert`], is removed once,
    /// and no reader can reach it any more (its grace period has passed).
    pub(crate) unsafe fn remove(&mut self, slot: NonNull<CodeHeader>) -> CodeHeader {
        self.free.push(slot);
        // SAFETY: the slot holds the header `insert` wrote (the caller's
        // contract), moved out once; the slot is now free.
        unsafe { slot.as_ptr().read() }
    }

    /// A never-used slot, from the last chunk or a new one.
    fn carve(&mut self) -> NonNull<CodeHeader> {
        if self.chunks.last().is_none_or(|c| self.used == c.slots()) {
            let held: usize = self.chunks.iter().map(Chunk::slots).sum();
            let chunk = match self.chunks.last() {
                // A mapping that fails leaves the heap working on small pages.
                _ if self.huge && held >= MAPPED => {
                    AnonMap::new(MAPPED_BYTES, region::Protection::READ_WRITE, true)
                        .map_or_else(|_| Chunk::allocated(LARGEST_ALLOCATED), Chunk::Mapped)
                }
                None => Chunk::allocated(FIRST_CHUNK),
                Some(last) => Chunk::allocated((2 * last.slots()).min(LARGEST_ALLOCATED)),
            };
            self.chunks.push(chunk);
            self.used = 0;
        }
        let chunk = self.chunks.last().expect("a chunk with room");
        // SAFETY: `used` is below the chunk's slot count (checked above).
        let slot = unsafe { chunk.base().add(self.used) };
        self.used += 1;
        slot
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::heap::header::{HostInfo, NewHeader};
    use crate::info::{CodeInfo, JitKind};

    fn header(id: u64) -> CodeHeader {
        let new = NewHeader {
            info: HostInfo::Owned(CodeInfo::new(id, "", JitKind::Optimized)),
            share: false,
            rows: Box::default(),
            code_size: id * 2,
            registrations: Default::default(),
            generation: id + 1,
            align: 16,
        };
        new.build(None).0
    }

    /// Headers land 64 bytes apart in chunks of 16, 32, ... 1024 slots,
    /// read back as written, and a removed header's slot is the next one
    /// handed out: 3,000 headers, half removed and replaced, take the same
    /// seven chunks.
    #[test]
    fn headers_are_packed_and_slots_reused() {
        let mut slab = HeaderSlab::new(false);
        let slots: Vec<NonNull<CodeHeader>> = (0..3000).map(|id| slab.insert(header(id))).collect();
        let sizes: Vec<usize> = slab.chunks.iter().map(Chunk::slots).collect();
        assert_eq!(sizes, [16, 32, 64, 128, 256, 512, 1024, 1024]);
        for (id, slot) in slots.iter().enumerate() {
            assert_eq!(slot.as_ptr() as usize % 64, 0);
            // SAFETY: inserted above, not removed.
            let h = unsafe { slot.as_ref() };
            assert_eq!(
                (h.method_id(), h.code_size(), h.generation(), h.align()),
                (id as u64, id as u64 * 2, id as u64 + 1, 16)
            );
        }
        let removed: Vec<NonNull<CodeHeader>> = slots.iter().step_by(2).copied().collect();
        for &slot in &removed {
            // SAFETY: each removed once; no reader holds it.
            assert_eq!(unsafe { slab.remove(slot) }.generation() % 2, 1);
        }
        let mut again: Vec<NonNull<CodeHeader>> = (0..removed.len() as u64)
            .map(|id| slab.insert(header(id)))
            .collect();
        let mut expected = removed.clone();
        again.sort_unstable();
        expected.sort_unstable();
        assert_eq!(again, expected);
        assert_eq!(slab.chunks.len(), 8);
        for slot in slots.iter().skip(1).step_by(2).chain(&again) {
            // SAFETY: every live header removed once before the slab drops.
            drop(unsafe { slab.remove(*slot) });
        }
    }

    /// A heap that asks for huge pages takes 2 MiB-aligned 2 MiB mappings
    /// once it holds 32,768 headers (here 33,776: the allocated chunks of
    /// 16 to 512, then 32 of 1,024), and counts them as mapped.
    #[test]
    #[cfg_attr(miri, ignore = "maps memory")]
    fn a_large_heap_maps_huge_chunks() {
        const HELD: usize = 1008 + 32 * 1024;
        let mut slab = HeaderSlab::new(true);
        let slots: Vec<NonNull<CodeHeader>> = (0..HELD as u64 + 2)
            .map(|id| slab.insert(header(id)))
            .collect();
        let sizes: Vec<usize> = slab.chunks.iter().map(Chunk::slots).collect();
        let mut expected = vec![16, 32, 64, 128, 256, 512];
        expected.resize(6 + 32, 1024);
        expected.push(MAPPED);
        assert_eq!(sizes, expected);
        assert_eq!(slab.mapped_bytes(), MAPPED_BYTES);
        let last = slab.chunks.last().unwrap().base().as_ptr() as usize;
        // Aligned as a huge page where it is one.
        if crate::mapping::huge_page() == MAPPED_BYTES {
            assert_eq!(last % MAPPED_BYTES, 0);
        }
        assert_eq!(slots[HELD].as_ptr() as usize, last);
        // SAFETY: inserted above, not removed.
        assert_eq!(
            unsafe { slots[HELD + 1].as_ref() }.method_id(),
            HELD as u64 + 1
        );
        for slot in slots {
            // SAFETY: each removed once before the slab drops.
            drop(unsafe { slab.remove(slot) });
        }
    }
}
