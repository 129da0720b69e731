//! The attached threads' records, by token: what the agent's timers carry in
//! their `sigev_value`, and what the signal handler checks a signal against
//! before it reads anything through it.
//!
//! A host may arm timers of its own on the agent's signal, with any
//! `sival_ptr` (a pointer to its own data, a small integer, a dangling
//! pointer). The handler never dereferences a signal's value: it reads the
//! value's slot in a fixed table and takes the record only when the slot's
//! token equals the value exactly. Tokens carry a per-process random salt and
//! a generation, so a foreign value matches one by accident with odds of about
//! 2^-54, and a stale token of a detached thread never matches again.
//!
//! Detaching is a handshake with the handlers: a handler counts itself in
//! flight on the slot its value names, then reads the token;
//! [`Registry::unregister`] clears the token, then waits until no handler is
//! in flight on that slot. A SeqCst fence on each side, between its store and
//! its load, makes at least one of them see the other's store: the handler
//! sees the cleared token and takes nothing, or the detaching thread sees the
//! handler and waits for it. Only then is the slot free for another record.
//! The loom model `a_late_signal_never_writes_into_another_threads_record`
//! checks it.
//!
//! The counts are per slot, not per process: a detaching thread waits only
//! for handlers that can still hold its record, never for other threads'
//! handlers. Under a rate that keeps several threads in their handlers most
//! of the time, a process-wide count is rarely zero, and a detach that
//! waited for it could wait for seconds.

use crate::sync::{AtomicPtr, AtomicU64, AtomicUsize, Ordering, defect, fence};

/// Low bits of a token: its slot.
const SLOT_BITS: u32 = 10;

/// One table entry: a record and the token that names it (both null/zero
/// when free), and the handlers in flight on it.
struct Slot<R> {
    token: AtomicU64,
    record: AtomicPtr<R>,
    /// Handlers between [`Registry::enter`] and [`Registry::leave`] whose
    /// signal's value names this slot.
    in_flight: AtomicUsize,
}

/// A table of `N` (at most 2^10) records by token, with the counts of
/// handlers in flight that detaching waits for.
pub struct Registry<R, const N: usize> {
    slots: [Slot<R>; N],
    /// Counts registrations, so that a slot's next token differs from its
    /// last.
    generation: AtomicU64,
}

/// A handler's place in flight, from [`Registry::enter`]; hand it back to
/// [`Registry::leave`].
#[derive(Debug)]
#[must_use = "a handler in flight must leave"]
pub struct InFlight {
    slot: usize,
}

/// A record's place in a table; [`Registry::unregister`] ends it.
#[derive(Debug)]
pub struct Registration {
    slot: usize,
    token: u64,
}

impl Registration {
    /// The value the thread's timer carries.
    pub fn token(&self) -> u64 {
        self.token
    }
}

impl<R, const N: usize> Registry<R, N> {
    /// An empty table (a `static` in normal builds).
    #[cfg(not(loom))]
    pub(crate) const fn new() -> Self {
        const { assert!(N <= 1 << SLOT_BITS) };
        Self {
            slots: [const {
                Slot {
                    token: AtomicU64::new(0),
                    record: AtomicPtr::new(std::ptr::null_mut()),
                    in_flight: AtomicUsize::new(0),
                }
            }; N],
            generation: AtomicU64::new(0),
        }
    }

    /// An empty table (loom's atomics have no `const` constructor).
    #[cfg(loom)]
    pub fn new() -> Self {
        const { assert!(N <= 1 << SLOT_BITS) };
        Self {
            slots: std::array::from_fn(|_| Slot {
                token: AtomicU64::new(0),
                record: AtomicPtr::new(std::ptr::null_mut()),
                in_flight: AtomicUsize::new(0),
            }),
            generation: AtomicU64::new(0),
        }
    }

    /// Enters `record` in a free slot with a token salted with `salt` (whose
    /// low [`SLOT_BITS`] are ignored); `None` when every slot is taken. Call
    /// outside signal handlers.
    pub fn register(&self, record: &R, salt: u64) -> Option<Registration> {
        let salt = salt & !((1 << SLOT_BITS) - 1);
        let pointer = (record as *const R).cast_mut();
        for (slot, entry) in self.slots.iter().enumerate() {
            // Acquire: the slot's previous owner finished with it (its Release
            // clear) before this one takes it.
            if entry
                .record
                .compare_exchange(
                    std::ptr::null_mut(),
                    pointer,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                // Relaxed: a counter whose values only need to differ.
                let generation = self.generation.fetch_add(1, Ordering::Relaxed);
                let token = (salt ^ (generation << SLOT_BITS)) | slot as u64;
                // Release: a handler that sees this token sees the record stored
                // above, and the record's contents written before registration.
                entry.token.store(token, Ordering::Release);
                return Some(Registration { slot, token });
            }
        }
        None
    }

    /// Takes the record out of the table, then waits until no handler that
    /// might have found it is still running (those in flight on its slot
    /// alone); after this the record may be freed and the slot reused.
    pub fn unregister(&self, registration: Registration) {
        let entry = &self.slots[registration.slot];
        // Relaxed: the fence below orders it before the count is read.
        entry.token.store(0, Ordering::Relaxed);
        if !defect!(UnfencedDetach) {
            // SeqCst: pairs with the fence in `enter`: this thread sees the
            // handler in flight, or the handler sees the cleared token.
            fence(Ordering::SeqCst);
        }
        Self::wait_for_slot(entry);
        // Release: hands the slot to the next `register`, whose CAS is Acquire.
        entry.record.store(std::ptr::null_mut(), Ordering::Release);
    }

    /// The slot a signal's `value` counts on: the one [`Registry::lookup`]
    /// reads for it (any value maps to some slot; a count on a slot that the
    /// value does not name only makes a waiter wait a little longer).
    #[inline]
    fn slot_of(value: u64) -> usize {
        (value & ((1 << SLOT_BITS) - 1)) as usize % N
    }

    /// Counts a handler in flight on the slot `value` names; call in the
    /// handler before [`Registry::lookup`], and [`Registry::leave`] after its
    /// last use of a record.
    #[inline]
    pub fn enter(&self, value: u64) -> InFlight {
        let slot = Self::slot_of(value);
        // Relaxed: the fence below orders it before the handler's reads.
        self.slots[slot].in_flight.fetch_add(1, Ordering::Relaxed);
        // SeqCst: pairs with the fence in `unregister` (see the module docs).
        fence(Ordering::SeqCst);
        InFlight { slot }
    }

    /// Ends what [`Registry::enter`] began.
    #[inline]
    pub fn leave(&self, in_flight: InFlight) {
        // Release: the handler's writes happen before a waiter sees zero.
        self.slots[in_flight.slot]
            .in_flight
            .fetch_sub(1, Ordering::Release);
    }

    /// Spins until no handler is in flight on `entry`.
    fn wait_for_slot(entry: &Slot<R>) {
        // Acquire: pairs with `leave`'s Release, so the handlers' writes are
        // visible to whoever waited.
        while entry.in_flight.load(Ordering::Acquire) != 0 {
            crate::sync::yield_now();
        }
    }

    /// Waits until no handler is in flight on the slot `value` names.
    pub fn wait_for(&self, value: u64) {
        Self::wait_for_slot(&self.slots[Self::slot_of(value)]);
    }

    /// Waits, slot by slot, until each has had no handler in flight: every
    /// handler that was running when this began has finished.
    pub fn wait_for_handlers(&self) {
        for entry in &self.slots {
            Self::wait_for_slot(entry);
        }
    }

    /// The record a signal's `value` names, if it names one: the value's
    /// slot must hold exactly this token. Reads two atomics; dereferences
    /// nothing.
    ///
    /// # Safety
    /// The caller is between [`Registry::enter`] and [`Registry::leave`] for
    /// as long as it uses the record ([`Registry::unregister`] waits for it
    /// before the record can be freed).
    #[inline]
    pub unsafe fn lookup<'a>(&self, value: u64) -> Option<&'a R> {
        if value == 0 {
            return None;
        }
        let entry = self.slots.get((value & ((1 << SLOT_BITS) - 1)) as usize)?;
        // Acquire: pairs with `register`'s Release, so the record below is the
        // one this token was given with.
        if entry.token.load(Ordering::Acquire) != value {
            return None;
        }
        // Acquire: the record pointer stored before the token.
        let record = entry.record.load(Ordering::Acquire);
        // SAFETY: a slot with a live token holds a registered record, which
        // stays allocated until `unregister` has seen this handler leave (the
        // caller's contract).
        unsafe { record.as_ref() }
    }
}

#[cfg(not(loom))]
pub use process::MAX_ATTACHED;
#[cfg(not(loom))]
pub(crate) use process::{enter, leave, lookup, register, unregister, wait_for, wait_for_handlers};

/// The process's one table, which the agent's handler reads.
#[cfg(not(loom))]
mod process {
    use super::{InFlight, Registration, Registry};
    use crate::agent::record::ThreadRecord;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Threads that can be attached at once, process-wide.
    pub const MAX_ATTACHED: usize = 1 << super::SLOT_BITS;

    static TABLE: Registry<ThreadRecord, MAX_ATTACHED> = Registry::new();

    /// Mixed into every token above the slot bits; set once, on first use.
    static SALT: AtomicU64 = AtomicU64::new(0);

    /// A random salt, from the kernel, or from the clock and the pid if the
    /// kernel has none to give; never zero.
    fn salt() -> u64 {
        // Relaxed: any thread's salt is as good; a race only means two threads
        // computed one each and one of them was kept.
        let current = SALT.load(Ordering::Relaxed);
        if current != 0 {
            return current;
        }
        let mut bytes = [0u8; 8];
        // SAFETY: the buffer is valid for 8 bytes of writes.
        let got = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
        let mut salt = u64::from_ne_bytes(bytes);
        if got != 8 {
            salt = crate::events::monotonic_ns().rotate_left(17) ^ u64::from(std::process::id());
        }
        let salt = (salt | 1 << 63) & !((1 << super::SLOT_BITS) - 1);
        // Relaxed: see above; whichever store wins is the salt from then on.
        match SALT.compare_exchange(0, salt, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => salt,
            Err(winner) => winner,
        }
    }

    /// Enters `record` in the process's table; `None` when [`MAX_ATTACHED`]
    /// threads are attached already. Call outside signal handlers.
    pub(crate) fn register(record: &ThreadRecord) -> Option<Registration> {
        TABLE.register(record, salt())
    }

    /// [`Registry::unregister`] on the process's table.
    pub(crate) fn unregister(registration: Registration) {
        TABLE.unregister(registration);
    }

    /// [`Registry::enter`] on the process's table.
    #[inline]
    pub(crate) fn enter(value: u64) -> InFlight {
        TABLE.enter(value)
    }

    /// [`Registry::leave`] on the process's table.
    #[inline]
    pub(crate) fn leave(in_flight: InFlight) {
        TABLE.leave(in_flight);
    }

    /// [`Registry::wait_for`] on the process's table.
    pub(crate) fn wait_for(value: u64) {
        TABLE.wait_for(value);
    }

    /// [`Registry::wait_for_handlers`] on the process's table.
    pub(crate) fn wait_for_handlers() {
        TABLE.wait_for_handlers();
    }

    /// [`Registry::lookup`] on the process's table.
    ///
    /// # Safety
    /// The caller is between [`enter`] and [`leave`] for as long as it uses
    /// the record.
    #[inline]
    pub(crate) unsafe fn lookup<'a>(value: u64) -> Option<&'a ThreadRecord> {
        // SAFETY: the caller's contract is the table's.
        unsafe { TABLE.lookup(value) }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A handler in flight on another record's slot (a thread kept in its
    /// handler) does not hold up this record's detach. (On the old code,
    /// which counted handlers process-wide, the detach waited for it: here,
    /// for good.)
    #[test]
    fn unregistering_waits_only_for_its_own_slot() {
        static TABLE: Registry<u64, 4> = Registry::new();
        static RECORDS: [u64; 2] = [1, 2];
        let mine = TABLE.register(&RECORDS[0], 0x5a17 << 20).unwrap();
        let other = TABLE.register(&RECORDS[1], 0x5a17 << 20).unwrap();
        let busy = TABLE.enter(other.token());
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            TABLE.unregister(mine);
            let _ = done.send(());
        });
        finished
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the detach waited for another record's handler");
        TABLE.leave(busy);
        TABLE.unregister(other);
        // Both slots are free again.
        assert_eq!(
            (
                TABLE.register(&RECORDS[0], 0).unwrap().slot,
                TABLE.register(&RECORDS[1], 0).unwrap().slot
            ),
            (0, 1)
        );
    }
}
