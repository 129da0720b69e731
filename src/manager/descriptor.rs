//! The descriptor: one `#[repr(C)]` static, exported as `jitmap_descriptor`, that
//! tells a reader in another process where everything is and how it is laid out.
//!
//! Its layout is in `docs/descriptor.md`. Every offset a reader needs is a field
//! here, computed by the compiler that built the host, so a reader never assumes
//! a Rust layout.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use std::mem::offset_of;

use super::stub_names::{LABEL_BYTES, StubKindName, StubLabel};
use super::{HEAP_SECTION_LAYOUT, IMAGE_SECTION_LAYOUT, SectionKind};
use crate::heap::header::HEADER_LAYOUT;
use crate::heap::lookup::{BlockPrefix, LOOKUP_LAYOUT};
use crate::heap::{MAX_STUB_KIND, PREFIX};
use crate::image::RemoteFunction;
use crate::range::{ADDRESS_BITS, CHUNK_BITS, FANOUT, LEVELS, ROOT_SEQ, fragment_layout};

/// The descriptor's magic value: `b"JITMAPD\0"` read as a little-endian u64.
pub const MAGIC: u64 = u64::from_le_bytes(*b"JITMAPD\0");
/// The layout version this crate writes and reads.
pub const LAYOUT_VERSION: u32 = 5;
/// How many managers the descriptor can list at once.
pub const MAX_MANAGERS: usize = 8;

/// The descriptor. All offsets are in bytes; "fragment" offsets count from the
/// start of a range-map fragment, so a reader reads one fragment and finds the
/// heap's read side inside it.
#[repr(C)]
#[derive(Debug)]
pub struct Descriptor {
    /// [`MAGIC`].
    pub magic: u64,
    /// [`LAYOUT_VERSION`].
    pub layout_version: u32,
    /// Size of this struct.
    pub descriptor_size: u32,
    /// 8 on the supported targets.
    pub pointer_size: u32,
    /// Levels of the range map (5).
    pub levels: u32,
    /// Entries per level (256).
    pub fanout: u32,
    /// Address bits below the leaf index (17: 128 KiB chunks).
    pub chunk_bits: u32,
    /// Addresses at or above `1 << address_bits` are in no section.
    pub address_bits: u32,
    /// Offset of the range map's write sequence in its root (the top level is
    /// at offset 0).
    pub root_seq: u32,
    /// Size of a fragment.
    pub fragment_size: u32,
    /// First address of the section.
    pub fragment_begin: u32,
    /// One past the section's last address.
    pub fragment_end: u32,
    /// The next fragment in the chunk's list (0 ends it).
    pub fragment_next: u32,
    /// The section kind's tag word: [`Descriptor::tag_heap`] or [`Descriptor::tag_image`].
    pub fragment_tag: u32,
    /// Tag of a code heap.
    pub tag_heap: u32,
    /// Tag of a precompiled image.
    pub tag_image: u32,
    /// A heap's executable base (pointer): the fragment's begin.
    pub heap_base: u32,
    /// A heap's start-map words (pointer to u32 words).
    pub heap_words: u32,
    /// A heap's end map (pointer to u64 words).
    pub heap_ends: u32,
    /// Number of start-map words (u32).
    pub heap_word_count: u32,
    /// Map version (u8: 1 or 2).
    pub heap_version: u32,
    /// The heap's change sequence (u64), as an offset from the end of its end
    /// map (`heap_ends + 8 * heap_word_count`).
    pub heap_seq: u32,
    /// The heap's id (u64), as an offset from the end of its end map.
    pub heap_id: u32,
    /// Bytes before every code start: the block prefix.
    pub prefix_bytes: u32,
    /// Offset of the code size in the prefix (u64).
    pub prefix_size: u32,
    /// Offset of the header slot in the prefix (u64): a stub kind up to
    /// [`Descriptor::max_stub_kind`], else a header pointer.
    pub prefix_slot: u32,
    /// The largest stub kind.
    pub max_stub_kind: u32,
    /// Method id in a code header (u64).
    pub header_method_id: u32,
    /// Code size in a code header (u64).
    pub header_code_size: u32,
    /// Name pointer in a code header.
    pub header_name_ptr: u32,
    /// Name length in bytes in a code header (u64).
    pub header_name_len: u32,
    /// Pointer to the method's [`UnwindRow`](crate::unwind::UnwindRow)s in a code header.
    pub header_rows_ptr: u32,
    /// Number of rows in a code header (u64); 0 when the method has no
    /// `.eh_frame`.
    pub header_rows_len: u32,
    /// Size of an [`UnwindRow`](crate::unwind::UnwindRow) (16).
    pub unwind_row_size: u32,
    /// An image's function table (pointer in an image fragment).
    pub image_table: u32,
    /// Entries in the table (u64 in an image fragment).
    pub image_count: u32,
    /// Size of a table entry (32).
    pub image_entry_size: u32,
    /// First byte of the function, from the image base (u32 in an entry).
    pub entry_begin: u32,
    /// One past its last byte (u32 in an entry).
    pub entry_end: u32,
    /// Its method's offset at its first byte (u32 in an entry).
    pub entry_delta: u32,
    /// Bytes of its method's name (u32 in an entry).
    pub entry_name_len: u32,
    /// Its method's id (u64 in an entry).
    pub entry_method_id: u32,
    /// Its method's name (pointer in an entry).
    pub entry_name_ptr: u32,
    /// Size of a stub kind's label ([`StubLabel`], 48).
    pub stub_label_size: u32,
    /// Bytes a label holds for its owner and name together (44).
    pub stub_label_bytes: u32,
    /// Number of entries in [`Descriptor::managers`].
    pub max_managers: u32,
    /// Root addresses of the registered managers' range maps; 0 is a free entry.
    pub managers: [AtomicUsize; MAX_MANAGERS],
    /// Each registered manager's frameless stub kinds, bit k for kind k
    /// ([`crate::ExecutionManager::declare_frameless_stub`]), beside its
    /// entry in `managers`: a walker in another process steps a stub of such
    /// a kind, caught as the innermost frame, by the entry rule.
    pub frameless: [AtomicU32; MAX_MANAGERS],
    /// Each registered manager's names of its stub kinds
    /// ([`crate::ExecutionManager::name_stub_kind`]), beside its entry in
    /// `managers`: label k - 1 names kind k.
    pub stub_labels: [[StubLabel; MAX_STUB_KIND as usize]; MAX_MANAGERS],
}

const fn u32_of(n: usize) -> u32 {
    assert!(n <= u32::MAX as usize);
    n as u32
}

const FRAGMENT: crate::range::FragmentLayout = fragment_layout::<SectionKind>();
const HEAP_LOOKUP: usize = FRAGMENT.value + HEAP_SECTION_LAYOUT.lookup;

/// The process's descriptor. Readers find it through the ELF dynamic symbol
/// table, the full symbol table of an executable that does not export it,
/// or, in a stripped executable, its own section: the linker gives it an
/// output section named `jitmap.descriptor` (not a `.data.*` name, which
/// it would fold into `.data`), and `strip` keeps section headers.
// SAFETY: `jitmap_descriptor` is a name no other library defines (the
// readers look for it, and only jitmap links it). The section holds this
// static alone and is writable, as the descriptor's atomics need: the
// compiler marks a section of a static with interior mutability writable,
// and no other item is placed in it to disagree.
#[unsafe(no_mangle)]
#[unsafe(link_section = "jitmap.descriptor")]
#[allow(non_upper_case_globals)]
pub static jitmap_descriptor: Descriptor = Descriptor {
    magic: MAGIC,
    layout_version: LAYOUT_VERSION,
    descriptor_size: u32_of(size_of::<Descriptor>()),
    pointer_size: u32_of(size_of::<usize>()),
    levels: u32_of(LEVELS),
    fanout: u32_of(FANOUT),
    chunk_bits: CHUNK_BITS,
    address_bits: ADDRESS_BITS,
    root_seq: u32_of(ROOT_SEQ),
    fragment_size: u32_of(FRAGMENT.size),
    fragment_begin: u32_of(FRAGMENT.begin),
    fragment_end: u32_of(FRAGMENT.end),
    fragment_next: u32_of(FRAGMENT.next),
    fragment_tag: u32_of(FRAGMENT.value),
    tag_heap: 0,
    tag_image: 1,
    heap_base: u32_of(FRAGMENT.begin),
    heap_words: u32_of(HEAP_LOOKUP + LOOKUP_LAYOUT.words),
    heap_ends: u32_of(HEAP_LOOKUP + LOOKUP_LAYOUT.ends),
    heap_word_count: u32_of(HEAP_LOOKUP + LOOKUP_LAYOUT.word_count),
    heap_version: u32_of(HEAP_LOOKUP + LOOKUP_LAYOUT.version),
    heap_seq: 0,
    heap_id: 8,
    prefix_bytes: PREFIX as u32,
    prefix_size: u32_of(std::mem::offset_of!(BlockPrefix, size)),
    prefix_slot: u32_of(std::mem::offset_of!(BlockPrefix, slot)),
    max_stub_kind: crate::heap::MAX_STUB_KIND as u32,
    header_method_id: u32_of(HEADER_LAYOUT.method_id),
    header_code_size: u32_of(HEADER_LAYOUT.code_size),
    header_name_ptr: u32_of(HEADER_LAYOUT.name_ptr),
    header_name_len: u32_of(HEADER_LAYOUT.name_len),
    header_rows_ptr: u32_of(HEADER_LAYOUT.rows_ptr),
    header_rows_len: u32_of(HEADER_LAYOUT.rows_len),
    unwind_row_size: u32_of(size_of::<crate::unwind::UnwindRow>()),
    image_table: u32_of(FRAGMENT.value + IMAGE_SECTION_LAYOUT.table),
    image_count: u32_of(FRAGMENT.value + IMAGE_SECTION_LAYOUT.count),
    image_entry_size: u32_of(size_of::<RemoteFunction>()),
    entry_begin: u32_of(offset_of!(RemoteFunction, begin)),
    entry_end: u32_of(offset_of!(RemoteFunction, end)),
    entry_delta: u32_of(offset_of!(RemoteFunction, delta)),
    entry_name_len: u32_of(offset_of!(RemoteFunction, name_len)),
    entry_method_id: u32_of(offset_of!(RemoteFunction, method_id)),
    entry_name_ptr: u32_of(offset_of!(RemoteFunction, name_ptr)),
    stub_label_size: u32_of(size_of::<StubLabel>()),
    stub_label_bytes: u32_of(LABEL_BYTES),
    max_managers: MAX_MANAGERS as u32,
    managers: [const { AtomicUsize::new(0) }; MAX_MANAGERS],
    frameless: [const { AtomicU32::new(0) }; MAX_MANAGERS],
    stub_labels: [const { [const { StubLabel::unset() }; MAX_STUB_KIND as usize] }; MAX_MANAGERS],
};

/// A manager's entry in the descriptor; dropping it frees the entry.
#[derive(Debug)]
pub(crate) struct Registration {
    index: usize,
}

impl Registration {
    /// Takes the first free entry for the range-map root at `root`, or `None`
    /// when all [`MAX_MANAGERS`] are taken.
    pub(crate) fn new(root: usize) -> Option<Self> {
        jitmap_descriptor
            .managers
            .iter()
            .position(|entry| {
                // Release on success: the root (a fully built, boxed level) is
                // initialized before a reader can find it; Acquire: the last
                // holder's clearing of the entry's frameless kinds happens
                // before this manager adds its own. Relaxed on failure: the
                // entry is simply taken.
                entry
                    .compare_exchange(0, root, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            })
            .map(|index| Self { index })
    }

    /// The entry's index.
    pub(crate) fn index(&self) -> usize {
        self.index
    }

    /// Adds `kinds` (bit k for stub kind k) to the entry's frameless kinds.
    pub(crate) fn add_frameless(&self, kinds: u32) {
        // Relaxed: as the manager's own bits; a reader that has not seen
        // them yet steps the stub by its frame pointer, as before.
        jitmap_descriptor.frameless[self.index].fetch_or(kinds, Ordering::Relaxed);
    }

    /// Writes `name` into the entry's label `slot` (kind `slot + 1`).
    pub(crate) fn set_label(&self, slot: usize, name: &StubKindName) {
        jitmap_descriptor.stub_labels[self.index][slot].set(name);
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // Relaxed: ordered before the entry's release below, which the next
        // manager to take the entry acquires through its exchange; so a
        // manager never starts with its predecessor's kinds.
        jitmap_descriptor.frameless[self.index].store(0, Ordering::Relaxed);
        for label in &jitmap_descriptor.stub_labels[self.index] {
            label.clear();
        }
        // Release: orders the clear before the range map's teardown that follows
        // (readers in other processes revalidate with the map's sequence anyway).
        jitmap_descriptor.managers[self.index].store(0, Ordering::Release);
    }
}
