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

impl<'h> Reservation<'h> {
    /// The address the code will run at (the executable view).
    pub fn address(&self) -> usize {
        self.heap.base() + self.start as usize
    }

    /// Code size in bytes: as asked of [`CodeHeap::reserve`], or as set by
    /// [`Reservation::shrink_to`].
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

    /// Sets the code's final size, `size` bytes of the `len()` reserved, and
    /// gives the space past it back to the heap at once: a JIT that reserves
    /// an upper bound learns the real size only when it has emitted the
    /// code, and lookups past the end would otherwise still name the method.
    /// The bytes kept are unchanged; the bytes past `size` are the heap's
    /// again, and another reservation may take them at once: write none
    /// through an address kept from before. Refused, with nothing changed,
    /// for 0 or more than the reservation.
    ///
    /// ```
    /// use jitmap::{CodeHeap, CodeInfo, Domain, HeapConfig, HeapError, JitKind};
    ///
    /// let heap = CodeHeap::new(HeapConfig::default(), &Domain::new(2)).unwrap();
    /// let mut r = heap.reserve(4096).unwrap();
    /// r.code_mut()[..3].copy_from_slice(&[0x90, 0x90, 0xC3]);
    /// let free = heap.stats().free;
    /// r.shrink_to(3).unwrap();
    /// assert_eq!(r.len(), 3);
    /// assert!(heap.stats().free > free + 4000);
    /// assert_eq!(r.shrink_to(4), Err(HeapError::BeyondReservation { size: 4, reserved: 3 }));
    /// let code = r.publish(CodeInfo::new(1, "f", JitKind::Optimized)).unwrap();
    /// assert_eq!(code.size(), 3);
    /// ```
    pub fn shrink_to(&mut self, size: u64) -> Result<(), HeapError> {
        if size == 0 || size > self.size {
            return Err(HeapError::BeyondReservation {
                size,
                reserved: self.size,
            });
        }
        let mut w = self.heap.writer.lock();
        // The extent follows from the start and the size taken (the code
        // and the room after it): the same start gives the same beginning,
        // and a smaller size an end no later.
        let extent = w.free.extent_of(self.start, size + self.heap.unwind_room);
        if extent.end < self.extent.end {
            w.free.release(extent.end..self.extent.end);
        }
        drop(w);
        self.extent = extent;
        self.size = size;
        Ok(())
    }

    /// Publishes the code as a method. Only now can readers find it. On error the
    /// space is given back, as by `abort`.
    pub fn publish(self, info: CodeInfo) -> Result<CodeRef, HeapError> {
        self.try_publish(info).map_err(|refused| refused.error)
    }

    /// [`Reservation::publish`], giving the reservation back, unchanged, with
    /// the error when the publish is refused (an info that does not fit the
    /// code, an `.eh_frame` the system unwinder refuses, a failed
    /// protection change): the host may fix the cause and publish again, or
    /// abort. No reader ever saw it, and no listener heard of it.
    ///
    /// ```
    /// use jitmap::heap::{CodeInfo, DebugEntry, JitKind};
    /// let manager = jitmap::ExecutionManager::new(2);
    /// let heap = manager.create_heap(jitmap::HeapConfig::default())?;
    /// let mut r = heap.reserve(4)?;
    /// r.code_mut().fill(0xC3);
    /// let mut info = CodeInfo::new(1, "f", JitKind::Optimized);
    /// info.debug = vec![DebugEntry { offset: 9, line: 1, column: 0, file: "f.rs".into() }];
    /// let refused = r.try_publish(info).unwrap_err(); // a row past the code's end
    /// let code = refused.reservation.publish(CodeInfo::new(1, "f", JitKind::Optimized))?;
    /// assert_eq!(code.size(), 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_publish(self, info: CodeInfo) -> Result<CodeRef, PublishRefused<'h>> {
        self.publish_payload(Payload::Method(super::HostInfo::Owned(info)))
    }

    /// Publishes the code as a stub of `kind`. Stubs are found as stubs, never
    /// as methods. On error the space is given back.
    pub fn publish_stub(self, kind: StubKind) -> Result<CodeRef, HeapError> {
        self.try_publish_stub(kind).map_err(|refused| refused.error)
    }

    /// [`Reservation::publish_stub`], giving the reservation back with the
    /// error when the publish is refused.
    pub fn try_publish_stub(self, kind: StubKind) -> Result<CodeRef, PublishRefused<'h>> {
        self.publish_payload(Payload::Stub(kind))
    }

    fn publish_payload(self, payload: Payload) -> Result<CodeRef, PublishRefused<'h>> {
        let published = self.heap.publish(Publish {
            start: self.start,
            size: self.size,
            align: self.align,
            extent: self.extent.clone(),
            payload,
            code: None,
            // Evaluated by `publish`, outside the heap's lock.
            rows: Box::default(),
        });
        match published {
            Ok(code) => {
                // The block owns the extent now: the reservation's drop, which
                // would give it back, must not run.
                let _ = ManuallyDrop::new(self);
                Ok(code)
            }
            // A refused publish leaves the extent reserved, and this
            // reservation its owner.
            Err(error) => Err(PublishRefused {
                reservation: self,
                error,
            }),
        }
    }

    /// Gives the space back at once. Nothing was ever visible to readers.
    pub fn abort(self) {
        drop(self);
    }
}

impl std::fmt::Debug for Reservation<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation")
            .field("address", &format_args!("{:#x}", self.address()))
            .field("len", &self.size)
            .finish_non_exhaustive()
    }
}

/// A refused [`Reservation::try_publish`]: why, and the reservation, as it was.
#[derive(Debug)]
pub struct PublishRefused<'h> {
    /// The reservation: its space still reserved, its bytes as written.
    pub reservation: Reservation<'h>,
    /// Why the publish was refused.
    pub error: HeapError,
}

impl std::fmt::Display for PublishRefused<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "publish refused: {}", self.error)
    }
}

impl std::error::Error for PublishRefused<'_> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.heap.release(self.extent.clone());
    }
}
