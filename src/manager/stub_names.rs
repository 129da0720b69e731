//! Names of stub kinds: what a kind's stubs are and which part of the host
//! makes them, so that a listing or a profile says `trampoline
//! (jitmap-cranelift)` where it would say `stub kind 1`.
//!
//! A stub has no code header (its prefix slot holds only its kind), so the
//! name belongs to the kind, per manager. The manager keeps the names for its
//! own threads ([`crate::ExecutionManager::stub_kind_name`]) and copies each
//! into its descriptor entry's labels ([`StubLabel`]), where readers in other
//! processes find them.

use std::fmt;
use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};

use crate::heap::{MAX_STUB_KIND, StubKind};

/// Bytes a label holds: the owner's and the name's together.
pub const LABEL_BYTES: usize = 44;

/// Set in [`StubLabel::lens`] once the label's bytes are written.
pub const LABEL_SET: u32 = 1 << 16;

/// What stubs of one kind are (`name`) and who makes them (`owner`).
///
/// ```
/// use jitmap::StubKindName;
///
/// let name = StubKindName::new("jitmap-cranelift", "trampoline")?;
/// assert_eq!(name.to_string(), "trampoline (jitmap-cranelift)");
/// assert!(StubKindName::new("", "trampoline").is_err());
/// # Ok::<(), jitmap::ManagerError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StubKindName {
    owner: String,
    name: String,
}

/// Why a stub kind's name was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadStubName {
    /// The owner or the name is empty.
    Empty,
    /// The owner or the name holds a NUL byte (a reader in another process
    /// takes a NUL for bytes not yet written).
    Nul,
    /// Owner and name together are longer than [`LABEL_BYTES`].
    TooLong {
        /// Their length together, in bytes.
        len: usize,
    },
}

impl fmt::Display for BadStubName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => write!(f, "its owner and its name must not be empty"),
            Self::Nul => write!(f, "its owner and its name must not hold a NUL byte"),
            Self::TooLong { len } => write!(
                f,
                "its owner and its name are {len} bytes together, over {LABEL_BYTES}"
            ),
        }
    }
}

impl StubKindName {
    /// A name, checked: `owner` and `name` not empty, with no NUL byte, and
    /// at most [`LABEL_BYTES`] bytes together.
    pub fn new(owner: &str, name: &str) -> Result<Self, super::ManagerError> {
        Self::checked(owner, name).map_err(|why| super::ManagerError::BadStubName { why })
    }

    fn checked(owner: &str, name: &str) -> Result<Self, BadStubName> {
        if owner.is_empty() || name.is_empty() {
            return Err(BadStubName::Empty);
        }
        if owner.contains('\0') || name.contains('\0') {
            return Err(BadStubName::Nul);
        }
        let len = owner.len() + name.len();
        if len > LABEL_BYTES {
            return Err(BadStubName::TooLong { len });
        }
        Ok(Self {
            owner: owner.to_owned(),
            name: name.to_owned(),
        })
    }

    /// Who makes the stubs: a crate, a component of the runtime.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// What the stubs are.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The name a label holds, or `None` for a label not set, half written
    /// (a NUL byte in its range) or not a name. For readers in other
    /// processes: `lens` and `bytes` as they read them.
    pub fn from_label(lens: u32, bytes: &[u8]) -> Option<Self> {
        if lens & LABEL_SET == 0 {
            return None;
        }
        let owner_len = (lens & 0xFF) as usize;
        let name_len = ((lens >> 8) & 0xFF) as usize;
        let all = bytes.get(..owner_len.checked_add(name_len)?)?;
        let (owner, name) = all.split_at(owner_len);
        let owner = std::str::from_utf8(owner).ok()?;
        let name = std::str::from_utf8(name).ok()?;
        Self::checked(owner, name).ok()
    }
}

impl fmt::Display for StubKindName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name, self.owner)
    }
}

/// How profiles show a frame in a stub of `kind`: with its kind's name,
/// `[stub 1: trampoline (jitmap-cranelift)]`; without, `[stub 1]`; with the
/// names two managers gave it (a reader that cannot tell whose stub it
/// was), all of them, joined by "or".
///
/// ```
/// use jitmap::StubKindName;
/// use jitmap::manager::stub_frame_label;
///
/// let name = StubKindName::new("jitmap-cranelift", "trampoline")?;
/// let other = StubKindName::new("host", "veneer")?;
/// assert_eq!(stub_frame_label(1, &[name.clone()]), "[stub 1: trampoline (jitmap-cranelift)]");
/// assert_eq!(stub_frame_label(1, &[]), "[stub 1]");
/// assert_eq!(
///     stub_frame_label(1, &[name, other]),
///     "[stub 1: trampoline (jitmap-cranelift) or veneer (host)]"
/// );
/// # Ok::<(), jitmap::ManagerError>(())
/// ```
pub fn stub_frame_label(kind: u8, names: &[StubKindName]) -> String {
    if names.is_empty() {
        return format!("[stub {kind}]");
    }
    let names: Vec<String> = names.iter().map(ToString::to_string).collect();
    format!("[stub {kind}: {}]", names.join(" or "))
}

/// One stub kind's name in the descriptor: `lens` is 0 while unset, else
/// the owner's length, the name's length shifted by 8, and [`LABEL_SET`];
/// `bytes` holds the owner then the name, zeros after.
#[repr(C)]
#[derive(Debug)]
pub struct StubLabel {
    /// Lengths and the set bit.
    pub lens: AtomicU32,
    /// The owner's bytes, then the name's.
    pub bytes: [AtomicU8; LABEL_BYTES],
}

impl StubLabel {
    /// An unset label (for the descriptor's initializer).
    pub(crate) const fn unset() -> Self {
        Self {
            lens: AtomicU32::new(0),
            bytes: [const { AtomicU8::new(0) }; LABEL_BYTES],
        }
    }

    /// Writes `name`: its bytes first, then its lengths with the set bit.
    /// The manager's lock on its names makes the writer of a label one
    /// thread at a time.
    pub(crate) fn set(&self, name: &StubKindName) {
        let bytes = name.owner.bytes().chain(name.name.bytes());
        for (slot, byte) in self.bytes.iter().zip(bytes) {
            // Relaxed: published by the Release store of `lens` below.
            slot.store(byte, Ordering::Relaxed);
        }
        let lens = name.owner.len() as u32 | (name.name.len() as u32) << 8 | LABEL_SET;
        // Release: the bytes are written before a reader that sees the set
        // bit reads them (one in another process also rejects a label with
        // a NUL in its range, which is what an unwritten byte reads as).
        self.lens.store(lens, Ordering::Release);
    }

    /// Clears the label: its lengths first, then its bytes back to zero, so
    /// the next manager of the entry starts from zeros and a reader never
    /// mixes two managers' bytes.
    pub(crate) fn clear(&self) {
        // Relaxed: ordered before the entry's Release in
        // `Registration::drop`, which the next holder acquires.
        self.lens.store(0, Ordering::Relaxed);
        for slot in &self.bytes {
            // Relaxed: as `lens` above.
            slot.store(0, Ordering::Relaxed);
        }
    }
}

/// The names a manager gave its stub kinds, slot k - 1 for kind k.
pub(crate) type Names = [Option<StubKindName>; MAX_STUB_KIND as usize];

/// Index of `kind` in [`Names`] and in a descriptor entry's labels.
pub(crate) fn slot(kind: StubKind) -> usize {
    usize::from(kind.get()) - 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_label_reads_back_the_name_it_was_given() {
        let label = StubLabel::unset();
        // Relaxed, every load here: this thread wrote what it reads.
        let bytes = |label: &StubLabel| label.bytes.each_ref().map(|b| b.load(Ordering::Relaxed));
        assert_eq!(
            StubKindName::from_label(label.lens.load(Ordering::Relaxed), &bytes(&label)),
            None
        );
        let name = StubKindName::new("jitmap-cranelift", "trampoline").unwrap();
        label.set(&name);
        let lens = label.lens.load(Ordering::Relaxed);
        assert_eq!(lens, 16 | 10 << 8 | LABEL_SET);
        assert_eq!(StubKindName::from_label(lens, &bytes(&label)), Some(name));
        label.clear();
        assert_eq!(label.lens.load(Ordering::Relaxed), 0);
        assert_eq!(bytes(&label), [0; LABEL_BYTES]);
    }

    #[test]
    fn a_half_written_or_wrong_label_is_no_name() {
        let mut bytes = [0u8; LABEL_BYTES];
        bytes[..5].copy_from_slice(b"hostx");
        // The set bit with the name's bytes still zero: not a name.
        assert_eq!(
            StubKindName::from_label(4 | 3 << 8 | LABEL_SET, &bytes),
            None
        );
        // Lengths past the bytes.
        assert_eq!(
            StubKindName::from_label(40 | 40 << 8 | LABEL_SET, &bytes),
            None
        );
        // Not UTF-8.
        bytes[0] = 0xFF;
        assert_eq!(
            StubKindName::from_label(4 | 1 << 8 | LABEL_SET, &bytes),
            None
        );
        bytes[0] = b'h';
        assert_eq!(
            StubKindName::from_label(4 | 1 << 8 | LABEL_SET, &bytes),
            Some(StubKindName::new("host", "x").unwrap())
        );
    }

    #[test]
    fn names_are_checked() {
        let why = |owner: &str, name: &str| StubKindName::checked(owner, name).unwrap_err();
        assert_eq!(why("", "x"), BadStubName::Empty);
        assert_eq!(why("x", ""), BadStubName::Empty);
        assert_eq!(why("a\0b", "x"), BadStubName::Nul);
        assert_eq!(
            why(&"o".repeat(40), "names"),
            BadStubName::TooLong { len: 45 }
        );
        assert!(StubKindName::checked(&"o".repeat(40), "name").is_ok());
    }
}
