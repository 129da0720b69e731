//! A reservation: private code space between `reserve` and `publish` or `abort`.

use std::mem::ManuallyDrop;
use std::ops::Range;

use super::{CodeHeap, CodeRef, HeapError, Payload, Publish, StubKind};
use crate::info::CodeInfo;

/// Space reserved in a heap, invisible to every reader. It is consumed by
/// [`Reservation::publish`] or [`Reservation::abort`]; dropping it aborts.
pub struct Reservation<'h> {
    pub(super) heap: &'h CodeHeap,
    pub(super) start: u64,
    pub(super) size: u64,
    pub(super) align: u64,
    pub(super) extent: Range<u64>,
}

impl Reservation<'_> {
    /// The address the code will run at (the executable view).
    pub fn address(&self) -> usize {
        self.heap.base() + self.start as usize
    }

    /// Code size in bytes, as asked of [`CodeHeap::reserve`].
    pub fn len(&self) -> u64 {
        self.size
    }

    /// Always false: reservations are never empty.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The code bytes, writable (through the write view in W^X mode).
    pub fn code_mut(&mut self) -> &mut [u8] {
        // SAFETY: the allocator gave this extent to this reservation alone, it is
        // committed and writable, and no reader touches code bytes of unpublished
        // blocks; `&mut self` makes the slice unique.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.heap.memory.write_base().add(self.start as usize),
                self.size as usize,
            )
        }
    }

    /// Publishes the code as a method. Only now can readers find it. On error the
    /// space is given back, as by `abort`.
    pub fn publish(self, info: CodeInfo) -> Result<CodeRef, HeapError> {
        self.publish_payload(Payload::Method(super::HostInfo::Owned(info)))
    }

    /// Publishes the code as a stub of `kind`. Stubs are found as stubs, never
    /// as methods. On error the space is given back.
    pub fn publish_stub(self, kind: StubKind) -> Result<CodeRef, HeapError> {
        self.publish_payload(Payload::Stub(kind))
    }

    fn publish_payload(self, payload: Payload) -> Result<CodeRef, HeapError> {
        // The publish consumes the extent (or gives it back on error), so the
        // reservation's drop, which would abort, must not run.
        let this = ManuallyDrop::new(self);
        this.heap.publish(Publish {
            start: this.start,
            size: this.size,
            align: this.align,
            extent: this.extent.clone(),
            payload,
            code: None,
            // Evaluated by `publish`, outside the heap's lock.
            rows: Box::default(),
        })
    }

    /// Gives the space back at once. Nothing was ever visible to readers.
    pub fn abort(self) {
        drop(self);
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.heap.release(self.extent.clone());
    }
}
