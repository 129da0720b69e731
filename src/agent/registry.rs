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

use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use super::record::ThreadRecord;

/// Threads that can be attached at once, process-wide.
pub const MAX_ATTACHED: usize = 1 << SLOT_BITS;

/// Low bits of a token: its slot.
const SLOT_BITS: u32 = 10;

/// One table entry: a record and the token that names it; both null/zero
/// when free.
struct Slot {
    token: AtomicU64,
    record: AtomicPtr<ThreadRecord>,
}

static SLOTS: [Slot; MAX_ATTACHED] = [const {
    Slot {
        token: AtomicU64::new(0),
        record: AtomicPtr::new(std::ptr::null_mut()),
    }
}; MAX_ATTACHED];

/// Mixed into every token above the slot bits; set once, on first use.
static SALT: AtomicU64 = AtomicU64::new(0);

/// Counts registrations, so that a slot's next token differs from its last.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// A record's place in the table; [`unregister`] ends it.
#[derive(Debug)]
pub(crate) struct Registration {
    slot: usize,
    token: u64,
}

impl Registration {
    /// The value the thread's timer carries.
    pub(crate) fn token(&self) -> u64 {
        self.token
    }
}

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
    let salt = (salt | 1 << 63) & !((1 << SLOT_BITS) - 1);
    // Relaxed: see above; whichever store wins is the salt from then on.
    match SALT.compare_exchange(0, salt, Ordering::Relaxed, Ordering::Relaxed) {
        Ok(_) => salt,
        Err(winner) => winner,
    }
}

/// Enters `record` in a free slot; `None` when [`MAX_ATTACHED`] threads are
/// attached already. Call outside signal handlers.
pub(crate) fn register(record: &ThreadRecord) -> Option<Registration> {
    let salt = salt();
    let pointer = (record as *const ThreadRecord).cast_mut();
    for (slot, entry) in SLOTS.iter().enumerate() {
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
            let generation = GENERATION.fetch_add(1, Ordering::Relaxed);
            let token = (salt ^ (generation << SLOT_BITS)) | slot as u64;
            // Release: a handler that sees this token sees the record stored
            // above, and the record's contents written before registration.
            entry.token.store(token, Ordering::Release);
            return Some(Registration { slot, token });
        }
    }
    None
}

/// Takes the record out of the table, then waits until no handler that might
/// have found it is still running; after this the record may be freed.
pub(crate) fn unregister(registration: Registration) {
    let entry = &SLOTS[registration.slot];
    // Release: handlers that load the zero token afterwards take nothing.
    entry.token.store(0, Ordering::Release);
    super::handler::wait_for_handlers();
    // Release: hands the slot to the next `register`, whose CAS is Acquire.
    entry.record.store(std::ptr::null_mut(), Ordering::Release);
}

/// The record a signal's `value` names, if it names one: the value's slot
/// must hold exactly this token. Reads two atomics; dereferences nothing.
///
/// # Safety
/// The caller is a signal handler counted in `IN_FLIGHT` for as long as it
/// uses the record ([`unregister`] waits for those before the record can be
/// freed).
pub(crate) unsafe fn lookup<'a>(value: u64) -> Option<&'a ThreadRecord> {
    if value == 0 {
        return None;
    }
    let entry = &SLOTS[(value & ((1 << SLOT_BITS) - 1)) as usize];
    // Acquire: pairs with `register`'s Release, so the record below is the
    // one this token was given with.
    if entry.token.load(Ordering::Acquire) != value {
        return None;
    }
    // Acquire: the record pointer stored before the token.
    let record = entry.record.load(Ordering::Acquire);
    // SAFETY: a slot with a live token holds a registered record, which stays
    // allocated until `unregister` has seen this handler finish (the caller's
    // contract).
    unsafe { record.as_ref() }
}
