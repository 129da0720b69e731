//! What a C pointer handed out by this library stands for: a handle in the
//! process's one [`Table`], whose refusals become statuses.
//!
//! A handle is not the address of an object: decoding one reads only the
//! table, never memory the caller names, so NULL, a pointer the library never
//! handed out, a handle of another kind, a handle used after destroy and a
//! double destroy are each a status, not undefined behaviour. A handle's
//! uses are the calls in progress on it, the guards pinned on it and its
//! child handles (a heap holds one on its manager, a reservation on its
//! heap); destroying is refused with `JITMAP_STATUS_IN_USE` while any is
//! held, and whoever destroys drops the object, outside any handler.

use crate::status::jitmap_status;
use crate::table::{self, Refusal, Table};

/// Slots in the table: live handles of every kind at once.
const CAPACITY: usize = 1 << 16;

static TABLE: Table<CAPACITY> = Table::new();

/// A use of a handle's object.
pub type Use<T> = table::Use<'static, T, CAPACITY>;
/// The only use of a handle's object.
pub type Exclusive<T> = table::Exclusive<'static, T, CAPACITY>;
/// A use kept by a child handle's object.
pub type Kept = table::Kept<'static, CAPACITY>;

/// What a handle is a handle to; each kind's objects have one type.
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

impl From<Refusal> for jitmap_status {
    fn from(r: Refusal) -> Self {
        match r {
            Refusal::Null => jitmap_status::JITMAP_STATUS_NULL_POINTER,
            Refusal::BadHandle => jitmap_status::JITMAP_STATUS_BAD_HANDLE,
            Refusal::WrongKind => jitmap_status::JITMAP_STATUS_WRONG_HANDLE_KIND,
            Refusal::Destroyed => jitmap_status::JITMAP_STATUS_DESTROYED,
            Refusal::InUse => jitmap_status::JITMAP_STATUS_IN_USE,
            Refusal::Full => jitmap_status::JITMAP_STATUS_TOO_MANY_HANDLES,
        }
    }
}

/// Puts `object` in the table as a `kind`; returns its handle's bits.
pub fn insert<T: Send + Sync>(kind: Kind, object: Box<T>) -> Result<usize, jitmap_status> {
    Ok(TABLE.insert(kind as u8, object)?)
}

/// A use of the `kind` object `bits` names. Async-signal-safe.
pub fn take<T>(bits: usize, kind: Kind) -> Result<Use<T>, jitmap_status> {
    Ok(TABLE.take(bits, kind as u8)?)
}

/// The only use of the `kind` object `bits` names.
pub fn take_exclusive<T>(bits: usize, kind: Kind) -> Result<Exclusive<T>, jitmap_status> {
    Ok(TABLE.take_exclusive(bits, kind as u8)?)
}

/// Destroys the handle `bits` if nothing uses it; returns its object.
pub fn remove<T>(bits: usize, kind: Kind) -> Result<Box<T>, jitmap_status> {
    Ok(TABLE.remove(bits, kind as u8)?)
}

/// Gives back a use kept with `Use::leak`. Async-signal-safe.
///
/// # Safety
/// `index` came from `leak` and is given back once.
pub unsafe fn release(index: usize) {
    // SAFETY: the caller's contract.
    unsafe { TABLE.release(index) }
}
