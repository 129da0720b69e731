//! The handle table: slots that stand for objects, addressed by handles that
//! carry a slot index and the slot's generation, so that a handle the table
//! never gave out, one of another kind, one used after its object was
//! removed and a second removal are each refused, without reading anything
//! the handle points to.
//!
//! Each slot's state word holds the generation, the kind (0 when free) and a
//! count of uses. Taking a use is one compare-and-swap, with no lock, no
//! allocation and no system call: async-signal-safe. Removing succeeds only
//! when the count is 0, so an object is never dropped under a use. Free slots
//! form a lock-free list, its head tagged against ABA.
//!
//! Built alone under loom by `loom-tests` (this file, with loom's atomics),
//! which models takes racing removals, slot reuse and exclusive uses.

use std::marker::PhantomData;

#[cfg(loom)]
use loom::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

const COUNT_BITS: u32 = 24;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
const KIND_SHIFT: u32 = COUNT_BITS;
const KIND_MASK: u64 = 0xFF << KIND_SHIFT;
const GEN_SHIFT: u32 = 32;

/// Why a handle names no object that can be used (or removed) as asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The handle is 0 (NULL).
    Null,
    /// The table never gave out this handle.
    BadHandle,
    /// The handle's object is of another kind.
    WrongKind,
    /// The handle's object was removed.
    Destroyed,
    /// The object is in use (removal, or an exclusive use, refused), or its
    /// use count is full.
    InUse,
    /// Every slot is taken.
    Full,
}

/// One cache line each, so that threads using different handles (each its
/// executor, say) do not contend.
#[repr(align(64))]
struct Slot {
    /// generation (32 bits) | kind (8) | uses (24).
    state: AtomicU64,
    object: AtomicPtr<()>,
    /// The next free slot's index plus one (0: none), while this one is on
    /// the free list.
    next_free: AtomicU32,
}

impl Slot {
    #[cfg(not(loom))]
    const fn new() -> Self {
        Self {
            state: AtomicU64::new(0),
            object: AtomicPtr::new(std::ptr::null_mut()),
            next_free: AtomicU32::new(0),
        }
    }

    #[cfg(loom)]
    fn new() -> Self {
        Self {
            state: AtomicU64::new(0),
            object: AtomicPtr::new(std::ptr::null_mut()),
            next_free: AtomicU32::new(0),
        }
    }
}

/// `N` slots.
pub struct Table<const N: usize> {
    slots: [Slot; N],
    /// The free list's head: a tag (32 bits, bumped by every change, so that
    /// a pop that read a stale head fails its compare-and-swap) and the
    /// first free slot's index plus one (0: empty).
    free_head: AtomicU64,
    /// Slots handed out at least once; those above were never used.
    high: AtomicU32,
}

fn generation(state: u64) -> u32 {
    (state >> GEN_SHIFT) as u32
}

fn kind_bits(state: u64) -> u64 {
    (state & KIND_MASK) >> KIND_SHIFT
}

/// A handle's bits: generation (high 32) and slot index (low 32). Generation
/// 0 is never handed out, so 0 and small integers are never handles.
fn pack(index: u32, generation: u32) -> usize {
    ((u64::from(generation) << 32) | u64::from(index)) as usize
}

fn unpack(bits: usize) -> (usize, u32) {
    let bits = bits as u64;
    ((bits & 0xFFFF_FFFF) as usize, (bits >> 32) as u32)
}

/// Why `bits` names no live object of `kind`, given its slot's `state`.
fn refuse(bits: usize, state: u64, kind: u8) -> Refusal {
    let (_, g) = unpack(bits);
    let live = kind_bits(state);
    if g == 0 || g > generation(state) {
        Refusal::BadHandle
    } else if g < generation(state) || live == 0 {
        Refusal::Destroyed
    } else if live != u64::from(kind) {
        Refusal::WrongKind
    } else {
        Refusal::InUse
    }
}

impl<const N: usize> Table<N> {
    /// An empty table.
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        Self {
            slots: [const { Slot::new() }; N],
            free_head: AtomicU64::new(0),
            high: AtomicU32::new(0),
        }
    }

    /// An empty table.
    #[cfg(loom)]
    pub fn new() -> Self {
        Self {
            slots: std::array::from_fn(|_| Slot::new()),
            free_head: AtomicU64::new(0),
            high: AtomicU32::new(0),
        }
    }

    /// The slot `bits` names, and the generation it carries.
    fn slot(&self, bits: usize) -> Result<(usize, &Slot, u32), Refusal> {
        if bits == 0 {
            return Err(Refusal::Null);
        }
        let (index, g) = unpack(bits);
        let slot = self.slots.get(index).ok_or(Refusal::BadHandle)?;
        Ok((index, slot, g))
    }

    /// A free slot's index, from the free list or never used before.
    fn pop_free(&self) -> Option<u32> {
        // Acquire: pairs with `push_free`'s Release, so the slot's
        // `next_free` and its last removal are visible.
        let mut head = self.free_head.load(Ordering::Acquire);
        while head as u32 != 0 {
            let index = head as u32 - 1;
            // Relaxed: written before the push that published this head (its
            // Release, our Acquire); a stale value fails the CAS through the
            // tag.
            let next = self.slots[index as usize].next_free.load(Ordering::Relaxed);
            let new = (((head >> 32) + 1) << 32) | u64::from(next);
            // Acquire on both: as the load above.
            match self.free_head.compare_exchange_weak(
                head,
                new,
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(index),
                Err(now) => head = now,
            }
        }
        // Relaxed: a counter; each index it hands out is handed out once.
        self.high
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |high| {
                ((high as usize) < N).then_some(high + 1)
            })
            .ok()
    }

    /// Puts a removed slot on the free list.
    fn push_free(&self, index: u32) {
        // Relaxed: the CAS below publishes.
        let mut head = self.free_head.load(Ordering::Relaxed);
        loop {
            // Relaxed: published by the Release CAS.
            self.slots[index as usize]
                .next_free
                .store(head as u32, Ordering::Relaxed);
            let new = (((head >> 32) + 1) << 32) | u64::from(index + 1);
            // Release: the slot's removal and `next_free` happen before a
            // pop that takes it. Relaxed on failure: retried.
            match self.free_head.compare_exchange_weak(
                head,
                new,
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(now) => head = now,
            }
        }
    }

    /// Puts `object` in a free slot as a `kind` (1 to 255); returns its
    /// handle's bits.
    pub fn insert<T: Send + Sync>(&self, kind: u8, object: Box<T>) -> Result<usize, Refusal> {
        debug_assert_ne!(kind, 0);
        let index = self.pop_free().ok_or(Refusal::Full)?;
        let slot = &self.slots[index as usize];
        // Relaxed: the slot is free and ours alone (the pop's Acquire
        // ordered it after its last removal).
        let old = slot.state.load(Ordering::Relaxed);
        let generation = generation(old).wrapping_add(1).max(1);
        // Relaxed: published by the Release store of the state below.
        slot.object
            .store(Box::into_raw(object).cast(), Ordering::Relaxed);
        // Release: a thread that decodes this handle with an Acquire load of
        // the state sees the object pointer and the object.
        slot.state.store(
            (u64::from(generation) << GEN_SHIFT) | (u64::from(kind) << KIND_SHIFT),
            Ordering::Release,
        );
        Ok(pack(index, generation))
    }

    /// Takes a use of the object `bits` names, which must be a `kind` (of
    /// type `T`, which the caller's kinds fix).
    pub fn take<T>(&self, bits: usize, kind: u8) -> Result<Use<'_, T, N>, Refusal> {
        let (index, slot, g) = self.slot(bits)?;
        // Acquire: pairs with insert's Release, so the object is visible.
        let mut state = slot.state.load(Ordering::Acquire);
        loop {
            if generation(state) != g
                || kind_bits(state) != u64::from(kind)
                || state & COUNT_MASK == COUNT_MASK
            {
                return Err(refuse(bits, state, kind));
            }
            // Acquire on success: as the load above. Acquire on failure: the
            // retry reads a state that may be a newer insert's.
            match slot.state.compare_exchange_weak(
                state,
                state + 1,
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(now) => state = now,
            }
        }
        // Relaxed: ordered by the Acquire above; the pointer cannot change
        // while a use is held (removal needs a count of 0).
        let object = slot.object.load(Ordering::Relaxed).cast::<T>();
        Ok(Use {
            table: self,
            index,
            object,
            _type: PhantomData,
        })
    }

    /// Takes the only use of the object `bits` names: refused with
    /// [`Refusal::InUse`] while another use is held, and every other use is
    /// refused while it lives (it fills the use count), so the caller may
    /// treat the object as its own ([`Exclusive::get_mut`]).
    pub fn take_exclusive<T>(&self, bits: usize, kind: u8) -> Result<Exclusive<'_, T, N>, Refusal> {
        let (index, slot, g) = self.slot(bits)?;
        let idle = (u64::from(g) << GEN_SHIFT) | (u64::from(kind) << KIND_SHIFT);
        // Acquire: as in `take`, and after the last use's Release. Relaxed
        // on failure: only the refusal's reason is read from it.
        match slot.state.compare_exchange(
            idle,
            idle | COUNT_MASK,
            Ordering::Acquire,
            Ordering::Relaxed,
        ) {
            Ok(_) => Ok(Exclusive {
                table: self,
                index,
                // Relaxed: ordered by the Acquire above.
                object: slot.object.load(Ordering::Relaxed).cast::<T>(),
                _type: PhantomData,
            }),
            Err(now) => Err(refuse(bits, now, kind)),
        }
    }

    /// Marks the slot of `state` dead (generation kept, kind and count 0)
    /// and frees it; returns its object.
    ///
    /// # Safety
    /// The caller's CAS just took the slot from `state`, with no use left
    /// but its own, and the object is a `T`.
    unsafe fn reclaim<T>(&self, index: usize, state: u64) -> Box<T> {
        let slot = &self.slots[index];
        // Relaxed: the slot is dead, no use can be taken, and the caller's
        // Acquire CAS ordered the insert's store before this load.
        let object = slot
            .object
            .swap(std::ptr::null_mut(), Ordering::Relaxed)
            .cast::<T>();
        // A slot whose generation would wrap is retired, never reused: its
        // stale handles stay recognisable.
        if generation(state) != u32::MAX {
            self.push_free(index as u32);
        }
        // SAFETY: `insert` made the pointer with `Box::into_raw` of a `T`
        // (the caller's contract), and the dead slot makes this its only
        // owner.
        unsafe { Box::from_raw(object) }
    }

    /// Removes the object `bits` names if nothing uses it, and returns it
    /// for the caller to drop; refused with [`Refusal::InUse`] while a use
    /// is held, and nothing changes then.
    pub fn remove<T>(&self, bits: usize, kind: u8) -> Result<Box<T>, Refusal> {
        let (index, slot, g) = self.slot(bits)?;
        let expected = (u64::from(g) << GEN_SHIFT) | (u64::from(kind) << KIND_SHIFT);
        // Acquire: every use's Release decrement happens before the drop.
        // Relaxed on failure: only the refusal's reason is read from it.
        match slot.state.compare_exchange(
            expected,
            u64::from(g) << GEN_SHIFT,
            Ordering::Acquire,
            Ordering::Relaxed,
        ) {
            // SAFETY: the CAS took the slot with no use left; the kind
            // fixes the type.
            Ok(_) => Ok(unsafe { self.reclaim(index, expected) }),
            Err(now) => Err(refuse(bits, now, kind)),
        }
    }

    /// Gives back a use kept with [`Use::leak`]. Async-signal-safe.
    ///
    /// # Safety
    /// `index` came from `leak` on this table and is given back once.
    pub unsafe fn release(&self, index: usize) {
        // Release: everything done under the use happens before a removal
        // that reads the lower count.
        self.slots[index].state.fetch_sub(1, Ordering::Release);
    }
}

/// A use of a live object: the object stays alive until it drops.
/// Async-signal-safe to take and to drop.
pub struct Use<'t, T, const N: usize> {
    table: &'t Table<N>,
    index: usize,
    object: *const T,
    _type: PhantomData<*const T>,
}

impl<'t, T, const N: usize> Use<'t, T, N> {
    /// The object.
    pub fn get(&self) -> &T {
        // SAFETY: the object lives until removal, which is refused while
        // this use is counted; the kind fixes the type.
        unsafe { &*self.object }
    }

    /// Keeps the use counted past this value, as a child's hold on its
    /// parent (a heap's on its manager); dropping the [`Kept`] gives it
    /// back.
    pub fn keep(self) -> Kept<'t, N> {
        let kept = Kept {
            table: self.table,
            index: self.index,
        };
        std::mem::forget(self);
        kept
    }

    /// Keeps the use counted past this value until [`Table::release`]
    /// gives it back: a pinned guard's hold on its reader, which lives in
    /// C memory.
    pub fn leak(self) -> usize {
        let index = self.index;
        std::mem::forget(self);
        index
    }
}

impl<T, const N: usize> Drop for Use<'_, T, N> {
    fn drop(&mut self) {
        // SAFETY: this use was counted by `take` and is given back once.
        unsafe { self.table.release(self.index) };
    }
}

/// A use held for as long as this value lives.
pub struct Kept<'t, const N: usize> {
    table: &'t Table<N>,
    index: usize,
}

impl<const N: usize> Drop for Kept<'_, N> {
    fn drop(&mut self) {
        // SAFETY: the use was counted by `take` and is given back once.
        unsafe { self.table.release(self.index) };
    }
}

/// The only use of an object ([`Table::take_exclusive`]): the slot's use
/// count is full while it lives.
pub struct Exclusive<'t, T, const N: usize> {
    table: &'t Table<N>,
    index: usize,
    object: *mut T,
    _type: PhantomData<*mut T>,
}

impl<T, const N: usize> Exclusive<'_, T, N> {
    /// The object, to change.
    pub fn get_mut(&mut self) -> &mut T {
        // SAFETY: the only use: every other take is refused until this one
        // is given back, and the object lives until then.
        unsafe { &mut *self.object }
    }

    /// Removes the object in one step with this use, so that no other use
    /// comes between.
    pub fn remove(self) -> Box<T> {
        let (table, index) = (self.table, self.index);
        std::mem::forget(self);
        let slot = &table.slots[index];
        // Relaxed: nothing else changes the state while the count is full
        // (takes and removals fail without writing).
        let state = slot.state.load(Ordering::Relaxed);
        // Relaxed: this thread's own exclusive use needed no ordering with
        // itself; the take's Acquire ordered the earlier uses.
        slot.state
            .store(state & !(KIND_MASK | COUNT_MASK), Ordering::Relaxed);
        // SAFETY: the slot is dead, and was this use's alone; the kind
        // fixes the type.
        unsafe { table.reclaim(index, state) }
    }
}

impl<T, const N: usize> Drop for Exclusive<'_, T, N> {
    fn drop(&mut self) {
        // Release: the changes made under the use happen before the next
        // use's Acquire take.
        self.table.slots[self.index]
            .state
            .fetch_sub(COUNT_MASK, Ordering::Release);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{Refusal, Table};

    const A: u8 = 1;
    const B: u8 = 2;

    #[test]
    fn each_misuse_of_a_handle_is_told_apart() {
        let table = Table::<2>::new();
        let h = table.insert(A, Box::new(7u32)).unwrap();
        assert_eq!(*table.take::<u32>(h, A).unwrap().get(), 7);
        assert_eq!(table.take::<u32>(0, A).err(), Some(Refusal::Null));
        // A generation never handed out, and a slot past the table.
        assert_eq!(
            table.take::<u32>(h + (1 << 32), A).err(),
            Some(Refusal::BadHandle)
        );
        assert_eq!(table.take::<u32>(5, A).err(), Some(Refusal::BadHandle));
        assert_eq!(table.take::<u32>(h, B).err(), Some(Refusal::WrongKind));
        {
            let _use = table.take::<u32>(h, A).unwrap();
            assert_eq!(table.remove::<u32>(h, A).err(), Some(Refusal::InUse));
            assert_eq!(
                table.take_exclusive::<u32>(h, A).err(),
                Some(Refusal::InUse)
            );
        }
        let kept = table.take::<u32>(h, A).unwrap().keep();
        assert_eq!(table.remove::<u32>(h, A).err(), Some(Refusal::InUse));
        drop(kept);
        let leaked = table.take::<u32>(h, A).unwrap().leak();
        assert_eq!(table.remove::<u32>(h, A).err(), Some(Refusal::InUse));
        // SAFETY: the use leaked just above, given back once.
        unsafe { table.release(leaked) };
        assert_eq!(*table.remove::<u32>(h, A).unwrap(), 7);
        assert_eq!(table.remove::<u32>(h, A).err(), Some(Refusal::Destroyed));
        assert_eq!(table.take::<u32>(h, A).err(), Some(Refusal::Destroyed));
        // The slot comes back with a new generation: the old handle stays
        // destroyed, the new one works.
        let again = table.insert(A, Box::new(8u32)).unwrap();
        assert_eq!(again & 0xFFFF_FFFF, h & 0xFFFF_FFFF);
        assert_ne!(again, h);
        assert_eq!(table.take::<u32>(h, A).err(), Some(Refusal::Destroyed));
        assert_eq!(*table.take::<u32>(again, A).unwrap().get(), 8);
        drop(table.remove::<u32>(again, A).unwrap());
    }

    #[test]
    fn an_exclusive_use_shuts_out_the_others_until_it_ends_or_removes() {
        let table = Table::<2>::new();
        let h = table.insert(A, Box::new(1u32)).unwrap();
        {
            let mut only = table.take_exclusive::<u32>(h, A).unwrap();
            *only.get_mut() += 1;
            assert_eq!(table.take::<u32>(h, A).err(), Some(Refusal::InUse));
            assert_eq!(
                table.take_exclusive::<u32>(h, A).err(),
                Some(Refusal::InUse)
            );
            assert_eq!(table.remove::<u32>(h, A).err(), Some(Refusal::InUse));
        }
        assert_eq!(*table.take::<u32>(h, A).unwrap().get(), 2);
        let only = table.take_exclusive::<u32>(h, A).unwrap();
        assert_eq!(*only.remove(), 2);
        assert_eq!(table.take::<u32>(h, A).err(), Some(Refusal::Destroyed));
    }

    #[test]
    fn a_full_table_refuses_and_a_freed_slot_is_reused() {
        let table = Table::<2>::new();
        let a = table.insert(A, Box::new(1u8)).unwrap();
        let b = table.insert(A, Box::new(2u8)).unwrap();
        assert_eq!(table.insert(A, Box::new(3u8)).err(), Some(Refusal::Full));
        drop(table.remove::<u8>(a, A).unwrap());
        let c = table.insert(B, Box::new(4u8)).unwrap();
        assert_eq!(c & 0xFFFF_FFFF, a & 0xFFFF_FFFF);
        assert_eq!(table.take::<u8>(a, A).err(), Some(Refusal::Destroyed));
        drop(table.remove::<u8>(b, A).unwrap());
        drop(table.remove::<u8>(c, B).unwrap());
    }
}
