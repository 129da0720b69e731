//! The heap's memory: one span reserved up front, committed as the heap grows.
//!
//! In the default mode the span is a single read-write-execute mapping. In W^X
//! mode a `memfd` is mapped twice: writers use a read-write view, placed at a
//! random address unrelated to the read-execute view that execution and lookups
//! use. In flip mode there is one mapping, and each block's own pages are
//! read-write while it is written and read-execute once published.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

use crate::mapping::AnonMap;

/// How code memory is mapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryMode {
    /// One read-write-execute mapping.
    Rwx,
    /// A read-write view for writers, at a random address, and a read-execute
    /// view for execution: no page is ever writable and executable at one address,
    /// and published code can still be patched through the writable view.
    WriteXorExecute,
    /// One mapping; a block's pages are read-write from reserve to publish and
    /// read-execute from then on (what wasmtime's publish and cranelift-jit's
    /// finalize do). Each block takes whole pages, and two `mprotect` calls. No
    /// writable alias of code exists at all, so published code cannot be patched.
    FlipOnPublish,
}

/// A reserved span of code memory with an executable view and a writable view.
pub(crate) struct CodeMemory {
    exec: NonNull<u8>,
    write: NonNull<u8>,
    span: usize,
    mode: MemoryMode,
    // Keeps the RWX reservation alive; unmapped on drop.
    _anon: Option<AnonMap>,
    // The backing file of the two W^X views; closed after they are unmapped.
    _memfd: Option<OwnedFd>,
}

// SAFETY: the views are plain memory; all shared access to them goes through atomics
// (prefix words) or through exclusive `&mut` slices handed out by the allocator.
unsafe impl Send for CodeMemory {}
// SAFETY: as above.
unsafe impl Sync for CodeMemory {}

impl CodeMemory {
    /// Reserves `span` bytes (a multiple of the page size) with no access yet. With
    /// `huge`, an RWX reservation is 2 MiB-aligned and advised for huge pages
    /// (a memfd's pages follow the system's shmem policy instead).
    pub(crate) fn reserve(span: usize, mode: MemoryMode, huge: bool) -> io::Result<Self> {
        match mode {
            MemoryMode::Rwx | MemoryMode::FlipOnPublish => {
                let huge = huge && mode == MemoryMode::Rwx;
                let anon = AnonMap::new(span, region::Protection::NONE, huge)?;
                let base = anon.base();
                Ok(Self {
                    exec: base,
                    write: base,
                    span,
                    mode,
                    _anon: Some(anon),
                    _memfd: None,
                })
            }
            MemoryMode::WriteXorExecute => {
                // SAFETY: the name is a valid NUL-terminated string; the flags are valid.
                let fd = unsafe { libc::memfd_create(c"jitmap-code".as_ptr(), libc::MFD_CLOEXEC) };
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                // SAFETY: `fd` was just returned by memfd_create and is owned by no one else.
                let memfd = unsafe { OwnedFd::from_raw_fd(fd) };
                let len = libc::off_t::try_from(span).map_err(io::Error::other)?;
                // SAFETY: `memfd` is a valid descriptor; growing a memfd is sparse.
                if unsafe { libc::ftruncate(memfd.as_raw_fd(), len) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                let exec = map_shared(&memfd, span, std::ptr::null_mut())?;
                let write = match map_shared(&memfd, span, random_hint(span)) {
                    Ok(exec) => exec,
                    Err(e) => {
                        // SAFETY: `exec` is a mapping of `span` bytes made just above.
                        unsafe { libc::munmap(exec.as_ptr().cast(), span) };
                        return Err(e);
                    }
                };
                Ok(Self {
                    exec,
                    write,
                    span,
                    mode,
                    _anon: None,
                    _memfd: Some(memfd),
                })
            }
        }
    }

    /// Base address of the executable view (the addresses users see).
    pub(crate) fn exec_base(&self) -> usize {
        self.exec.as_ptr() as usize
    }

    /// Base of the writable view (equal to the executable view in RWX mode).
    pub(crate) fn write_base(&self) -> *mut u8 {
        self.write.as_ptr()
    }

    /// The mapping mode.
    pub(crate) fn mode(&self) -> MemoryMode {
        self.mode
    }

    /// Makes `len` freshly written bytes at `offset` visible to instruction fetch,
    /// by their executable address: the cache maintenance of aarch64
    /// (`__clear_cache`) works on virtual addresses, and in W^X mode the lines
    /// that instruction fetch uses belong to the read-execute view, not the
    /// writable alias. Code written over bytes that held code also makes other
    /// cores serialize (the heap's publish and patch, `arch::REUSE_NEEDS_CORE_SYNC`).
    pub(crate) fn flush_icache(&self, offset: usize, len: usize) {
        let (start, len) = self.icache_range(offset, len);
        crate::arch::flush_icache(start, len);
    }

    /// The range [`CodeMemory::flush_icache`] maintains: the executable view's.
    pub(crate) fn icache_range(&self, offset: usize, len: usize) -> (*const u8, usize) {
        (self.exec.as_ptr().wrapping_add(offset).cast_const(), len)
    }

    /// Makes `[from, to)` accessible. Offsets are page-aligned and within the span.
    pub(crate) fn commit(&self, from: usize, to: usize) -> io::Result<()> {
        let len = to - from;
        let protect = |base: NonNull<u8>, prot| {
            // SAFETY: `[from, to)` lies inside this mapping, which we own; changing its
            // protection cannot invalidate references, because none exist to
            // uncommitted pages.
            unsafe { region::protect(base.as_ptr().add(from), len, prot) }.map_err(io::Error::other)
        };
        match self.mode {
            MemoryMode::Rwx => protect(self.exec, region::Protection::READ_WRITE_EXECUTE),
            MemoryMode::FlipOnPublish => protect(self.exec, region::Protection::READ_WRITE),
            MemoryMode::WriteXorExecute => {
                protect(self.write, region::Protection::READ_WRITE)?;
                protect(self.exec, region::Protection::READ_EXECUTE)
            }
        }
    }
}

impl Drop for CodeMemory {
    fn drop(&mut self) {
        if self.mode == MemoryMode::WriteXorExecute {
            for view in [self.write, self.exec] {
                // SAFETY: both views were mapped with `span` bytes by `reserve` and
                // nothing borrows them once the heap is dropped.
                unsafe { libc::munmap(view.as_ptr().cast(), self.span) };
            }
        }
    }
}

impl CodeMemory {
    /// In flip mode, makes the pages of `[from, to)` (page-aligned offsets of one
    /// block's extent) read-execute (`executable`) or read-write; elsewhere
    /// nothing.
    pub(crate) fn flip(&self, from: usize, to: usize, executable: bool) -> io::Result<()> {
        if self.mode != MemoryMode::FlipOnPublish {
            return Ok(());
        }
        let prot = if executable {
            region::Protection::READ_EXECUTE
        } else {
            region::Protection::READ_WRITE
        };
        // SAFETY: the extent lies in committed memory of this mapping. Its pages
        // belong to one block (extents are page-granular in this mode): the writer
        // that owns the block changes them, and no reference to its bytes is alive
        // across the change (readers only read published blocks' prefixes, which
        // stay readable either way).
        unsafe { region::protect(self.exec.as_ptr().add(from), to - from, prot) }
            .map_err(io::Error::other)
    }
}

/// A random, page-aligned address for the writable view of a W^X heap, in the
/// lower 64 TiB of user space: nothing about it can be derived from the
/// executable view's address. The kernel treats it as a hint and maps elsewhere
/// if it is taken.
fn random_hint(span: usize) -> *mut libc::c_void {
    let mut bytes = [0u8; 8];
    // SAFETY: `bytes` is writable for its length; flags 0 reads the urandom pool.
    let got = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if got != bytes.len() as isize {
        return std::ptr::null_mut();
    }
    let top = (1usize << 46) - span;
    let addr = (usize::from_ne_bytes(bytes) % top) & !0xFFFF;
    addr.max(1 << 32) as *mut libc::c_void
}

fn map_shared(fd: &OwnedFd, span: usize, hint: *mut libc::c_void) -> io::Result<NonNull<u8>> {
    // SAFETY: a fresh shared mapping of our own memfd; without MAP_FIXED the hint
    // never replaces an existing mapping.
    let ptr = unsafe {
        libc::mmap(
            hint,
            span,
            libc::PROT_NONE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(ptr.cast()).ok_or_else(|| io::Error::other("null mapping"))
}

/// `membarrier` commands (linux/membarrier.h).
const MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE: libc::c_long = 1 << 5;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE: libc::c_long = 1 << 6;

/// One `membarrier(cmd, 0, 0)` call.
fn membarrier(cmd: libc::c_long) -> io::Result<()> {
    // SAFETY: a plain system call with integer arguments.
    let rc = unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Registers the process for core-serializing membarriers, once; the errno of a
/// kernel that cannot.
pub(crate) fn sync_cores_ready() -> io::Result<()> {
    static REGISTERED: std::sync::OnceLock<Result<(), i32>> = std::sync::OnceLock::new();
    let result = *REGISTERED.get_or_init(|| {
        membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE)
            .map_err(|e| e.raw_os_error().unwrap_or(libc::ENOSYS))
    });
    result.map_err(io::Error::from_raw_os_error)
}

/// Makes every other thread of the process execute a core-serializing
/// instruction before it next runs user code, so none keeps executing stale
/// instructions of code that was just modified (cross-modifying code, on x86-64
/// and aarch64 alike). Needs [`sync_cores_ready`] first.
pub(crate) fn sync_cores() -> io::Result<()> {
    membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE)
}

#[cfg(test)]
mod tests {
    use super::*;

    // 14. The aarch64 icache flush ran on the RW alias; instruction fetch uses the
    // RX view's addresses, so that is the range maintained.
    #[test]
    fn the_icache_range_is_the_executable_view() {
        let memory = CodeMemory::reserve(1 << 16, MemoryMode::WriteXorExecute, false).unwrap();
        assert_ne!(memory.exec_base(), memory.write_base() as usize);
        let (start, len) = memory.icache_range(0x40, 24);
        assert_eq!((start as usize, len), (memory.exec_base() + 0x40, 24));
        let rwx = CodeMemory::reserve(1 << 16, MemoryMode::Rwx, false).unwrap();
        let (start, _) = rwx.icache_range(0x40, 24);
        assert_eq!(start as usize, rwx.exec_base() + 0x40);
    }
}
