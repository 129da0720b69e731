//! A single-producer, single-consumer ring of fixed-size records, allocated once.
//!
//! The producer is one thread's signal handler (samples) or one thread's probes
//! (probe records); the consumer is the collector. Pushing is a few loads and
//! stores into memory that already exists: no allocation, no lock, no system
//! call. A full ring drops the new record and counts it.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;

/// What a push did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pushed {
    /// The ring was full: the record was dropped, and counted.
    Dropped,
    /// The record waits for the consumer.
    Kept,
    /// Kept, and it filled the ring to its bell level (half full unless
    /// set otherwise, [`Ring::with_bell`]): once each time the ring fills
    /// from empty, since the consumer drains it whole. The producer then
    /// asks for a drain ([`super::doorbell`]).
    KeptAtBell,
}

/// A ring of `capacity` records of type `T`, each with `width` trailing items of
/// type `F` (a sample's frames; zero for probe records).
pub(crate) struct Ring<T, F> {
    /// Records the consumer has finished with (it alone writes this).
    head: CachePadded<AtomicUsize>,
    /// Records the producer has completed (it alone writes this).
    tail: CachePadded<AtomicUsize>,
    dropped: AtomicU64,
    records: Box<[UnsafeCell<T>]>,
    items: Box<[UnsafeCell<F>]>,
    width: usize,
    /// The count of waiting records at which a push says
    /// [`Pushed::KeptAtBell`], 1 to the capacity.
    bell_at: usize,
}

// SAFETY: a slot is written only by the one producer while it lies outside
// [head, tail), and read only by the one consumer while it lies inside; the
// Release/Acquire pair on `tail` and on `head` hands each slot over. The owner
// guarantees one producer and one consumer at a time.
unsafe impl<T: Send, F: Send> Sync for Ring<T, F> {}

impl<T: Copy + Default, F: Copy + Default> Ring<T, F> {
    /// A ring of `capacity` (at least 1) records with `width` items each,
    /// whose bell rings at half full (rounded up).
    pub(crate) fn new(capacity: usize, width: usize) -> Self {
        Self::with_bell(capacity, width, capacity.div_ceil(2))
    }

    /// [`Ring::new`] whose bell rings when `bell_at` records wait (clamped
    /// to 1..=capacity).
    pub(crate) fn with_bell(capacity: usize, width: usize, bell_at: usize) -> Self {
        Self {
            head: CachePadded::new(AtomicUsize::new(0)),
            tail: CachePadded::new(AtomicUsize::new(0)),
            dropped: AtomicU64::new(0),
            records: (0..capacity)
                .map(|_| UnsafeCell::new(T::default()))
                .collect(),
            items: (0..capacity * width)
                .map(|_| UnsafeCell::new(F::default()))
                .collect(),
            width,
            bell_at: bell_at.clamp(1, capacity.max(1)),
        }
    }

    /// Bytes this ring holds (records and items).
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.records.len() * size_of::<T>() + self.items.len() * size_of::<F>()
    }

    /// Records dropped because the ring was full.
    pub(crate) fn dropped(&self) -> u64 {
        // Relaxed: a statistic; the collector reads it after draining.
        self.dropped.load(Ordering::Relaxed)
    }

    /// Records waiting for the consumer (a snapshot).
    pub(crate) fn len(&self) -> usize {
        // Acquire on both: a consistent-enough snapshot; `tail` is read last so
        // the difference is never negative.
        let head = self.head.load(Ordering::Acquire);
        let tail = self.tail.load(Ordering::Acquire);
        tail.wrapping_sub(head)
    }

    /// Counts a record dropped without trying (the producer could not write).
    /// Any thread; async-signal-safe.
    pub(crate) fn count_drop(&self) {
        // Relaxed: a statistic.
        self.dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// Producer: fills the next free slot with `fill` and publishes it. A
    /// full ring drops the record and counts it ([`Pushed`]).
    ///
    /// # Safety
    /// Only one producer at a time: one thread, or its signal handler for a
    /// signal that cannot nest, but never both for the same ring.
    #[inline]
    pub(crate) unsafe fn push(&self, fill: impl FnOnce(&mut T, &mut [F])) -> Pushed {
        // Relaxed: only this producer writes `tail`.
        let tail = self.tail.load(Ordering::Relaxed);
        // Acquire: the consumer's reads of a slot happen before it advanced
        // `head` past it (Release), so the slot may be overwritten now.
        let head = self.head.load(Ordering::Acquire);
        let capacity = self.records.len();
        let waiting = tail.wrapping_sub(head);
        if waiting >= capacity {
            self.count_drop();
            return Pushed::Dropped;
        }
        let index = tail % capacity;
        // SAFETY: slot `index` lies outside [head, tail), so the consumer does not
        // read it, and this is the only producer (the caller's contract).
        let record = unsafe { &mut *self.records[index].get() };
        let items = &self.items[index * self.width..(index + 1) * self.width];
        // SAFETY: `UnsafeCell<F>` has the layout of `F`, and the slot's items
        // belong to the producer as above.
        let items = unsafe {
            std::slice::from_raw_parts_mut(UnsafeCell::raw_get(items.as_ptr()), items.len())
        };
        fill(record, items);
        // Release: the slot's contents happen before the consumer's Acquire load
        // of `tail` that lets it read them.
        self.tail.store(tail.wrapping_add(1), Ordering::Release);
        // Counted from the `head` read above: a drain since then only means
        // the consumer is already at work.
        if waiting + 1 == self.bell_at {
            Pushed::KeptAtBell
        } else {
            Pushed::Kept
        }
    }

    /// Consumer: hands every published record to `take`, oldest first, then
    /// frees their slots. Returns how many there were.
    ///
    /// # Safety
    /// Only one consumer at a time.
    pub(crate) unsafe fn drain(&self, mut take: impl FnMut(&T, &[F])) -> usize {
        // Relaxed: only this consumer writes `head`.
        let head = self.head.load(Ordering::Relaxed);
        // Acquire: pairs with the producer's Release store of `tail`, so the
        // slots below it are complete.
        let tail = self.tail.load(Ordering::Acquire);
        let capacity = self.records.len();
        let count = tail.wrapping_sub(head);
        for n in 0..count {
            let index = head.wrapping_add(n) % capacity;
            // SAFETY: slot `index` lies inside [head, tail): published, and the
            // producer does not write it until `head` moves past it.
            let record = unsafe { &*self.records[index].get() };
            let items = &self.items[index * self.width..(index + 1) * self.width];
            // SAFETY: as above, for the slot's items; `UnsafeCell<F>` has the
            // layout of `F`.
            let items =
                unsafe { std::slice::from_raw_parts(items.as_ptr().cast::<F>(), items.len()) };
            take(record, items);
        }
        // Release: the reads above happen before the producer's Acquire load of
        // `head` that lets it reuse these slots.
        self.head.store(tail, Ordering::Release);
        count
    }
}

#[cfg(test)]
mod tests {
    use super::{Pushed, Ring};

    #[test]
    fn fills_drops_and_drains_in_order() {
        let ring: Ring<u64, u32> = Ring::new(3, 2);
        for i in 0..5u64 {
            // SAFETY: one producer (this thread).
            let pushed = unsafe {
                ring.push(|r, items| {
                    *r = i;
                    items.copy_from_slice(&[i as u32, i as u32 * 10]);
                })
            };
            // Half of 3, rounded up, is 2: the second push says so.
            let expected = match i {
                1 => Pushed::KeptAtBell,
                0 | 2 => Pushed::Kept,
                _ => Pushed::Dropped,
            };
            assert_eq!(pushed, expected, "push {i}");
        }
        assert_eq!(ring.dropped(), 2);
        let mut seen = Vec::new();
        // SAFETY: one consumer (this thread).
        let n = unsafe { ring.drain(|r, items| seen.push((*r, items.to_vec()))) };
        assert_eq!(n, 3);
        assert_eq!(
            seen,
            vec![(0, vec![0, 0]), (1, vec![1, 10]), (2, vec![2, 20])]
        );
        // Wrapping keeps the order.
        // Space again after the drain, and the ring says half full again at
        // the second record of this filling.
        for (i, expected) in [(10u64, Pushed::Kept), (11, Pushed::KeptAtBell)] {
            // SAFETY: one producer.
            assert_eq!(unsafe { ring.push(|r, _| *r = i) }, expected);
        }
        seen.clear();
        // SAFETY: one consumer.
        unsafe { ring.drain(|r, _| seen.push((*r, Vec::new()))) };
        assert_eq!(seen.iter().map(|s| s.0).collect::<Vec<_>>(), vec![10, 11]);
        assert_eq!(ring.bytes(), 3 * 8 + 6 * 4);
    }

    /// A ring whose bell is set rings it at that count, once per filling,
    /// and a bell past the capacity rings when the ring is full.
    #[test]
    fn a_set_bell_rings_at_its_count() {
        let ring: Ring<u64, u32> = Ring::with_bell(8, 0, 6);
        for round in 0..2 {
            let pushed: Vec<Pushed> = (0..9u64)
                // SAFETY: one producer (this thread).
                .map(|i| unsafe { ring.push(|r, _| *r = i) })
                .collect();
            let bells: Vec<usize> = (0..9)
                .filter(|&i| pushed[i] == Pushed::KeptAtBell)
                .collect();
            assert_eq!(bells, [5], "round {round}");
            assert_eq!(pushed[8], Pushed::Dropped);
            // SAFETY: one consumer.
            assert_eq!(unsafe { ring.drain(|_, _| {}) }, 8);
        }
        let full: Ring<u64, u32> = Ring::with_bell(2, 0, 9);
        // SAFETY: one producer.
        let pushed = [0, 1].map(|i| unsafe { full.push(|r, _| *r = i) });
        assert_eq!(pushed, [Pushed::Kept, Pushed::KeptAtBell]);
    }

    #[test]
    fn concurrent_producer_and_consumer_lose_nothing_they_kept() {
        let ring: Ring<u64, u64> = Ring::new(64, 1);
        // Miri interprets every access, and explores interleavings and weak
        // memory on its own: a few thousand pushes cover the wrap-arounds.
        let total = if cfg!(miri) { 2_000 } else { 200_000u64 };
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 0..total {
                    // SAFETY: the only producer.
                    unsafe { ring.push(|r, items| (*r, items[0]) = (i, !i)) };
                }
            });
            let mut last = None;
            let mut got = 0u64;
            while got + ring.dropped() < total {
                // SAFETY: the only consumer.
                got += unsafe {
                    ring.drain(|r, items| {
                        assert_eq!(items[0], !*r, "a torn slot");
                        assert!(last.is_none_or(|l| *r > l), "out of order");
                        last = Some(*r);
                    })
                } as u64;
            }
            assert_eq!(got + ring.dropped(), total);
        });
    }
}
