//! A data object's memory: ordinary memory (never the code heap), allocated
//! with the object's alignment, at an address that does not move while the
//! module lives.

use std::alloc::Layout;
use std::ptr::NonNull;

/// One data object's bytes.
pub(crate) struct DataMemory {
    ptr: NonNull<u8>,
    layout: Layout,
    len: usize,
}

// SAFETY: the memory is an allocation this value owns; nothing else holds it
// but the module's code, which reads and writes it as its program says.
unsafe impl Send for DataMemory {}

impl DataMemory {
    /// `len` zero bytes (at least one byte is allocated), or `None` when the
    /// size and alignment do not make a layout.
    pub(crate) fn zeroed(len: u64, align: u64) -> Option<Self> {
        let len = usize::try_from(len).ok()?;
        let layout =
            Layout::from_size_align(len.max(1), usize::try_from(align.max(1)).ok()?).ok()?;
        // SAFETY: the layout's size is at least 1.
        let ptr = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })?;
        Some(Self { ptr, layout, len })
    }

    /// A copy of `contents`.
    pub(crate) fn from_bytes(contents: &[u8], align: u64) -> Option<Self> {
        let memory = Self::zeroed(contents.len() as u64, align)?;
        memory.write(contents);
        Some(memory)
    }

    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// A copy of the bytes.
    ///
    /// Reads the object while no published code can reach it: before the
    /// `finalize_definitions` that defines it returns (see
    /// `JitmapModule::get_finalized_data`).
    pub(crate) fn bytes(&self) -> Vec<u8> {
        // SAFETY: `len` bytes are allocated at `ptr`; nothing writes them
        // concurrently before the object's first finalize (above).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }.to_vec()
    }

    /// Overwrites the bytes with `bytes` (at most `len` of them), under the
    /// same rule as [`DataMemory::bytes`].
    pub(crate) fn write(&self, bytes: &[u8]) {
        let n = bytes.len().min(self.len);
        // SAFETY: `n` bytes fit the allocation; the source is a separate slice.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.as_ptr(), n) };
    }
}

impl Drop for DataMemory {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}
