//! The handle table: what a C pointer handed out by this library stands for.
//!
//! A handle is not the address of an object. It is a slot index and the
//! slot's generation packed into a pointer-sized value that C keeps as an
//! opaque pointer. Decoding one reads only this table, never memory the
//! caller names, so NULL, a pointer the library never handed out, a handle of
//! another kind, a handle used after destroy and a double destroy are each a
//! status, not undefined behaviour.
//!
//! Each slot's state word holds the generation, the kind (0 when free) and a
//! count of uses: calls in progress, pinned guards and child handles (a heap
//! holds one on its manager, a reservation on its heap). Taking a use is one
//! compare-and-swap, with no lock, no allocation and no system call, so the
//! async-signal-safe calls can take one. Destroying succeeds only when the
//! count is 0; otherwise it is refused with `JITMAP_STATUS_IN_USE` and
//! nothing changes. Whoever destroys drops the object, outside any handler.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

use crate::status::jitmap_status;

/// Slots in the table: live handles of every kind at once.
pub(crate) const CAPACITY: usize = 1 << 16;

const COUNT_BITS: u32 = 24;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
const KIND_SHIFT: u32 = COUNT_BITS;
const KIND_MASK: u64 = 0xFF << KIND_SHIFT;
const GEN_SHIFT: u32 = 32;

/// What a handle is a handle to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Manager = 1,
    Heap,
    Reservation,
    Reader,
    Executor,
    Agent,
    Thread,
    Profile,
    Counters,
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

static SLOTS: [Slot; CAPACITY] = [const {
    Slot {
        state: AtomicU64::new(0),
        object: AtomicPtr::new(std::ptr::null_mut()),
        next_free: AtomicU32::new(0),
    }
}; CAPACITY];

/// The free list's head: a tag (32 bits, bumped by every change, so that a
/// pop that read a stale head fails its compare-and-swap) and the first
/// free slot's index plus one (0: empty). Lock-free: creating and
/// destroying take no lock.
static FREE_HEAD: AtomicU64 = AtomicU64::new(0);
/// Slots handed out at least once; those above were never used.
static HIGH: AtomicU32 = AtomicU32::new(0);

/// A free slot's index, from the free list or never used before.
fn pop_free() -> Option<u32> {
    // Acquire: pairs with `push_free`'s Release, so the slot's `next_free`
    // and its last destroy are visible.
    let mut head = FREE_HEAD.load(Ordering::Acquire);
    while head as u32 != 0 {
        let index = head as u32 - 1;
        // Relaxed: written before the push that published this head (its
        // Release, our Acquire); a stale value fails the CAS through the tag.
        let next = SLOTS[index as usize].next_free.load(Ordering::Relaxed);
        let new = (((head >> 32) + 1) << 32) | u64::from(next);
        // Acquire on both: as the load above.
        match FREE_HEAD.compare_exchange_weak(head, new, Ordering::Acquire, Ordering::Acquire) {
            Ok(_) => return Some(index),
            Err(now) => head = now,
        }
    }
    // Relaxed: a counter; each index it hands out is handed out once.
    HIGH.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |high| {
        ((high as usize) < CAPACITY).then_some(high + 1)
    })
    .ok()
}

/// Puts a destroyed slot on the free list.
fn push_free(index: u32) {
    // Relaxed: the CAS below publishes.
    let mut head = FREE_HEAD.load(Ordering::Relaxed);
    loop {
        // Relaxed: published by the Release CAS.
        SLOTS[index as usize]
            .next_free
            .store(head as u32, Ordering::Relaxed);
        let new = (((head >> 32) + 1) << 32) | u64::from(index + 1);
        // Release: the slot's destroy and `next_free` happen before a pop
        // that takes it. Relaxed on failure: retried.
        match FREE_HEAD.compare_exchange_weak(head, new, Ordering::Release, Ordering::Relaxed) {
            Ok(_) => return,
            Err(now) => head = now,
        }
    }
}

fn generation(state: u64) -> u32 {
    (state >> GEN_SHIFT) as u32
}

fn kind_bits(state: u64) -> u64 {
    (state & KIND_MASK) >> KIND_SHIFT
}

/// A handle's bits: generation (high 32) and slot index (low 32). Generation
/// 0 is never handed out, so NULL and small integers are never handles.
fn pack(index: u32, generation: u32) -> usize {
    ((u64::from(generation) << 32) | u64::from(index)) as usize
}

fn unpack(bits: usize) -> (usize, u32) {
    let bits = bits as u64;
    ((bits & 0xFFFF_FFFF) as usize, (bits >> 32) as u32)
}

/// Puts `object` in a free slot and returns its handle's bits.
pub fn insert<T: Send + Sync>(kind: Kind, object: Box<T>) -> Result<usize, jitmap_status> {
    let index = pop_free().ok_or(jitmap_status::JITMAP_STATUS_TOO_MANY_HANDLES)?;
    let slot = &SLOTS[index as usize];
    // Relaxed: the slot is free and ours alone (the pop's Acquire ordered it
    // after its last destroy).
    let old = slot.state.load(Ordering::Relaxed);
    let generation = generation(old).wrapping_add(1).max(1);
    // Relaxed: published by the Release store of the state below.
    slot.object
        .store(Box::into_raw(object).cast(), Ordering::Relaxed);
    // Release: a thread that decodes this handle with an Acquire load of the
    // state sees the object pointer and the object.
    slot.state.store(
        (u64::from(generation) << GEN_SHIFT) | ((kind as u64) << KIND_SHIFT),
        Ordering::Release,
    );
    Ok(pack(index, generation))
}

/// Why a handle's bits name no live object of the kind asked for.
fn refuse(bits: usize, state: u64, wanted: Kind) -> jitmap_status {
    let (_, g) = unpack(bits);
    let live = kind_bits(state);
    if bits == 0 {
        jitmap_status::JITMAP_STATUS_NULL_POINTER
    } else if g == 0 || g > generation(state) {
        // Never handed out.
        jitmap_status::JITMAP_STATUS_BAD_HANDLE
    } else if g < generation(state) || live == 0 {
        jitmap_status::JITMAP_STATUS_DESTROYED
    } else if live != wanted as u64 {
        jitmap_status::JITMAP_STATUS_WRONG_HANDLE_KIND
    } else {
        jitmap_status::JITMAP_STATUS_IN_USE
    }
}

/// A use of a live object: the object stays alive until it drops.
/// Async-signal-safe to take and to drop.
pub struct Use<T> {
    index: usize,
    object: *const T,
    _type: PhantomData<*const T>,
}

impl<T> Use<T> {
    /// Takes a use of the object `bits` names, which must be of `kind` (and
    /// of type `T`, which each kind fixes).
    pub fn take(bits: usize, kind: Kind) -> Result<Self, jitmap_status> {
        let (index, g) = unpack(bits);
        if bits == 0 {
            return Err(jitmap_status::JITMAP_STATUS_NULL_POINTER);
        }
        let Some(slot) = SLOTS.get(index) else {
            return Err(jitmap_status::JITMAP_STATUS_BAD_HANDLE);
        };
        // Acquire: pairs with insert's Release, so the object is visible.
        let mut state = slot.state.load(Ordering::Acquire);
        loop {
            if generation(state) != g
                || kind_bits(state) != kind as u64
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
        // while a use is held (destroy needs a count of 0).
        let object = slot.object.load(Ordering::Relaxed).cast::<T>();
        Ok(Self {
            index,
            object,
            _type: PhantomData,
        })
    }

    /// Takes the only use of the object `bits` names: refused with
    /// `JITMAP_STATUS_IN_USE` while another use is held, so the caller may
    /// treat the object as its own for as long as this use lives (see
    /// [`Use::get_mut`]).
    pub fn take_exclusive(bits: usize, kind: Kind) -> Result<Exclusive<T>, jitmap_status> {
        let (index, g) = unpack(bits);
        if bits == 0 {
            return Err(jitmap_status::JITMAP_STATUS_NULL_POINTER);
        }
        let Some(slot) = SLOTS.get(index) else {
            return Err(jitmap_status::JITMAP_STATUS_BAD_HANDLE);
        };
        let idle = (u64::from(g) << GEN_SHIFT) | ((kind as u64) << KIND_SHIFT);
        // Acquire: as in `take`, and after the last use's Release. Relaxed
        // on failure: only the refusal's reason is read from it.
        match slot
            .state
            .compare_exchange(idle, idle + 1, Ordering::Acquire, Ordering::Relaxed)
        {
            Ok(_) => Ok(Exclusive(Self {
                index,
                // Relaxed: ordered by the Acquire above.
                object: slot.object.load(Ordering::Relaxed).cast::<T>(),
                _type: PhantomData,
            })),
            Err(now) => Err(refuse(bits, now, kind)),
        }
    }

    /// The object.
    pub fn get(&self) -> &T {
        // SAFETY: the object lives until destroy, which refuses while this
        // use is counted; `take` checked the kind, which fixes the type.
        unsafe { &*self.object }
    }

    /// Keeps the use counted past this value, as a child's hold on its
    /// parent (a heap's on its manager); dropping the [`Kept`] gives it back.
    pub fn keep(self) -> Kept {
        let index = self.index;
        std::mem::forget(self);
        Kept(index)
    }

    /// Keeps the use counted past this value until [`release`] gives it
    /// back: a pinned guard's hold on its reader, which lives in C memory.
    pub fn leak(self) -> usize {
        self.keep().into_index()
    }
}

/// The only use of an object ([`Use::take_exclusive`]).
pub struct Exclusive<T>(Use<T>);

impl<T> Exclusive<T> {
    /// The object, to change.
    pub fn get_mut(&mut self) -> &mut T {
        // SAFETY: the only use: no other reference to the object exists
        // until this one is given back, and the object lives until then.
        unsafe { &mut *self.0.object.cast_mut() }
    }

    /// Destroys the handle and hands over its object, in one step: no other
    /// use can come between. Refused (`JITMAP_STATUS_IN_USE`) if a shared
    /// use was taken meanwhile, which only a kind whose calls do not all
    /// take exclusive uses allows.
    pub fn remove(self) -> Result<Box<T>, jitmap_status> {
        let index = self.0.index;
        let slot = &SLOTS[index];
        // Relaxed: read to build the CAS's expected value.
        let state = slot.state.load(Ordering::Relaxed);
        let dead = state & !(KIND_MASK | COUNT_MASK);
        // Release: the object's last changes happen before a later insert
        // in this slot (through the free list). Relaxed on failure: the use
        // is given back as this value drops.
        if state & COUNT_MASK != 1
            || slot
                .state
                .compare_exchange(state, dead, Ordering::Release, Ordering::Relaxed)
                .is_err()
        {
            return Err(jitmap_status::JITMAP_STATUS_IN_USE);
        }
        let object = self.0.object.cast_mut();
        // The use ended with the handle.
        std::mem::forget(self);
        // Relaxed: as in `remove`.
        slot.object.store(std::ptr::null_mut(), Ordering::Relaxed);
        if generation(state) != u32::MAX {
            push_free(index as u32);
        }
        // SAFETY: `insert` made the pointer with `Box::into_raw` of a `T`;
        // the handle is dead, so this is its only owner.
        Ok(unsafe { Box::from_raw(object) })
    }
}

/// Gives back a use kept with [`Use::leak`]. Async-signal-safe.
///
/// # Safety
/// `index` came from `leak` and is given back once.
pub unsafe fn release(index: usize) {
    // Release: everything done under the use happens before a destroy that
    // reads the lower count.
    SLOTS[index].state.fetch_sub(1, Ordering::Release);
}

/// A use held for as long as this value lives.
#[derive(Debug)]
pub struct Kept(usize);

impl Kept {
    fn into_index(self) -> usize {
        let index = self.0;
        std::mem::forget(self);
        index
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        // SAFETY: the use was counted by `take` and is given back once.
        unsafe { release(self.0) };
    }
}

impl<T> Drop for Use<T> {
    fn drop(&mut self) {
        // SAFETY: this use was counted by `take` and is given back once.
        unsafe { release(self.index) };
    }
}

/// Removes the object `bits` names if nothing uses it, and returns it for
/// the caller to drop. Refused with `JITMAP_STATUS_IN_USE` while a call,
/// a pinned guard or a child holds a use; nothing changes then.
pub fn remove<T>(bits: usize, kind: Kind) -> Result<Box<T>, jitmap_status> {
    let (index, g) = unpack(bits);
    if bits == 0 {
        return Err(jitmap_status::JITMAP_STATUS_NULL_POINTER);
    }
    let Some(slot) = SLOTS.get(index) else {
        return Err(jitmap_status::JITMAP_STATUS_BAD_HANDLE);
    };
    let expected = (u64::from(g) << GEN_SHIFT) | ((kind as u64) << KIND_SHIFT);
    // Acquire: every use's Release decrement happens before the drop below.
    // Relaxed on failure: only the refusal's reason is read from it.
    if let Err(now) = slot.state.compare_exchange(
        expected,
        u64::from(g) << GEN_SHIFT,
        Ordering::Acquire,
        Ordering::Relaxed,
    ) {
        return Err(refuse(bits, now, kind));
    }
    // Relaxed: the slot is dead, no use can be taken, and the Acquire above
    // ordered the insert's store before this load.
    let object = slot
        .object
        .swap(std::ptr::null_mut(), Ordering::Relaxed)
        .cast::<T>();
    // A slot whose generation would wrap is retired, never reused: its stale
    // handles stay recognisable.
    if g != u32::MAX {
        push_free(index as u32);
    }
    // SAFETY: `insert` made the pointer with `Box::into_raw` of a `T` (the
    // kind fixes the type), and the CAS above made this call its only owner.
    Ok(unsafe { Box::from_raw(object) })
}
