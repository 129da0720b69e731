//! A heap's code headers, side by side in chunks it owns: 64 bytes and one
//! cache line each, no allocation per method, and a million headers in
//! 64 MiB rather than spread over the whole malloc heap, so that random
//! lookups touch fewer pages. A reclaimed header's slot is reused by the
//! next publish.

use std::alloc::{Layout, alloc, dealloc};
use std::ptr::NonNull;

use super::header::CodeHeader;

/// Headers in the first chunk; each next chunk holds twice as many, up to
/// [`LARGEST_CHUNK`] (64 KiB), so that a small heap takes little and a large
/// one wastes at most part of one chunk.
const FIRST_CHUNK: usize = 16;
const LARGEST_CHUNK: usize = 1024;

/// Storage for one heap's headers; serialized by the heap lock. It only
/// holds memory: what is stored is the heap's to take back out (with
/// [`HeaderSlab::remove`]) before the slab drops, or it is leaked, never
/// dropped twice.
#[derive(Default)]
pub(crate) struct HeaderSlab {
    chunks: Vec<(NonNull<CodeHeader>, Layout)>,
    /// Slots of the last chunk handed out so far.
    used: usize,
    /// Slots given back, reused first.
    free: Vec<NonNull<CodeHeader>>,
}

// SAFETY: the slab owns its chunks; the heap lock serializes every access to
// it, and readers only read headers they reached through a published slot.
unsafe impl Send for HeaderSlab {}

impl HeaderSlab {
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
        let full = self
            .chunks
            .last()
            .is_none_or(|(_, l)| self.used * size_of::<CodeHeader>() == l.size());
        if full {
            let slots = self.chunks.last().map_or(FIRST_CHUNK, |(_, l)| {
                (2 * l.size() / size_of::<CodeHeader>()).min(LARGEST_CHUNK)
            });
            let layout = Layout::array::<CodeHeader>(slots).expect("at most 64 KiB");
            // SAFETY: the layout is not zero-sized (a header is 64 bytes).
            let chunk = NonNull::new(unsafe { alloc(layout) })
                .unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
            self.chunks.push((chunk.cast(), layout));
            self.used = 0;
        }
        let (chunk, _) = self.chunks.last().expect("a chunk with room");
        // SAFETY: `used` is below the chunk's slot count (checked above).
        let slot = unsafe { chunk.add(self.used) };
        self.used += 1;
        slot
    }
}

impl Drop for HeaderSlab {
    fn drop(&mut self) {
        for &(chunk, layout) in &self.chunks {
            // SAFETY: allocated in `carve` with this layout, freed once; the
            // heap has taken every header out (or leaks it, never drops it).
            unsafe { dealloc(chunk.as_ptr().cast(), layout) }
        }
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
            shared: false,
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
        let mut slab = HeaderSlab::default();
        let slots: Vec<NonNull<CodeHeader>> = (0..3000).map(|id| slab.insert(header(id))).collect();
        let sizes: Vec<usize> = slab.chunks.iter().map(|(_, l)| l.size() / 64).collect();
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
}
