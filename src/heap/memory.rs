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
    /// `huge`, an RWX reservation is aligned to a huge page and advised for them
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
/// lower half of user space (at most its lower 64 TiB): nothing about it can
/// be derived from the executable view's address. The kernel treats it as a
/// hint and maps elsewhere if it is taken.
fn random_hint(span: usize) -> *mut libc::c_void {
    let mut bytes = [0u8; 8];
    // SAFETY: `bytes` is writable for its length; flags 0 reads the urandom pool.
    let got = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if got != bytes.len() as isize {
        return std::ptr::null_mut();
    }
    hint_below(u64::from_ne_bytes(bytes), span, user_address_bits()) as *mut libc::c_void
}

/// The bits of this process's user addresses: those of its first stack,
/// which the kernel puts at the top of user space (the auxiliary vector's
/// `AT_RANDOM` bytes are on it, whatever stack the calling thread runs on).
/// 47 on x86-64 with 4-level page tables, 48 on aarch64 with 48-bit
/// addresses, 39 or 42 on the aarch64 kernels of small boards.
fn user_address_bits() -> u32 {
    // SAFETY: getauxval has no preconditions; 0 where the entry is absent.
    let on_stack = unsafe { libc::getauxval(libc::AT_RANDOM) } as usize;
    usize::BITS - on_stack.leading_zeros()
}

/// A 64 KiB-aligned address from `random` where `span` bytes fit between
/// 4 GiB and the lower half of a `bits`-bit user space (at most 2⁴⁶), or 0
/// (no hint) where they do not. A hint past the top is refused by the
/// kernel, and the view lands next to the executable one.
fn hint_below(random: u64, span: usize, bits: u32) -> usize {
    const FLOOR: usize = 1 << 32;
    let top = 1usize << bits.saturating_sub(1).min(46);
    match top.checked_sub(span) {
        Some(room) if room > FLOOR => ((random as usize % (room - FLOOR)) + FLOOR) & !0xFFFF,
        _ => 0,
    }
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
const MEMBARRIER_CMD_QUERY: libc::c_long = 0;
const MEMBARRIER_CMD_GLOBAL: libc::c_long = 1;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE: libc::c_long = 1 << 5;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE: libc::c_long = 1 << 6;

/// One `membarrier(cmd, 0, 0)` call: its non-negative result, or the errno.
fn membarrier(cmd: libc::c_long) -> io::Result<libc::c_long> {
    // SAFETY: a plain system call with integer arguments.
    let rc = unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0, 0) };
    if rc >= 0 {
        Ok(rc)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// How this process makes every other core serialize its instruction stream
/// after code that ran was rewritten ([`core_sync`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CoreSync {
    /// `MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE` (Linux 4.16): an
    /// interrupt to each CPU that runs one of this process's threads, and a
    /// core-serializing return to user space for every thread. Microseconds.
    Expedited,
    /// aarch64 only, where the kernel (before 4.16) or a seccomp policy
    /// refuses the first: `MEMBARRIER_CMD_PRIVATE_EXPEDITED` (Linux 4.14),
    /// the same interrupts. On aarch64 every return to user space, from an
    /// interrupt or a system call, is an exception return, which is context
    /// synchronizing: what the sync needs. Microseconds.
    PrivateExpedited,
    /// aarch64 only, where both are refused: `MEMBARRIER_CMD_GLOBAL`
    /// (Linux 4.3), which returns once every CPU has passed through a
    /// quiescent state (a context switch, an interrupt from user space, or
    /// idle), each left through an exception return. Milliseconds: every
    /// publish outside flip mode pays it, under the heap's lock.
    Global,
}

/// The way this process syncs cores, chosen on the first call that succeeds
/// (`choose`). A failure is not remembered: the next call tries again (a
/// refusal used to be kept for the life of the process, and every later
/// patch, and on aarch64 every publish into reused space, failed with it).
/// On x86-64 only the core-serializing command will do: a thread that
/// returns from a system call by `sysret` is not serialized by the others
/// (the reason Linux 4.16 added it), so without it patches are refused.
///
/// ```
/// use jitmap::heap::{CoreSync, core_sync};
///
/// match core_sync() {
///     Ok(CoreSync::Expedited) => println!("microseconds a sync"),
///     Ok(other) => println!("{other:?}: an older aarch64 kernel, or a seccomp policy"),
///     Err(e) => println!("patches are refused here: {e}"),
/// }
/// ```
pub fn core_sync() -> Result<CoreSync, super::HeapError> {
    sync_cores_ready().map_err(Into::into)
}

/// [`core_sync`], with the OS error of a process that has no way.
pub(crate) fn sync_cores_ready() -> io::Result<CoreSync> {
    static CHOSEN: std::sync::OnceLock<CoreSync> = std::sync::OnceLock::new();
    if let Some(how) = CHOSEN.get() {
        return Ok(*how);
    }
    let how = choose(crate::arch::EXCEPTION_RETURN_SYNCHRONIZES, membarrier)?;
    Ok(*CHOSEN.get_or_init(|| how))
}

/// The first way `call` (the `membarrier` system call) grants: the
/// core-serializing command, registered; then, where every return to user
/// space synchronizes (`fallbacks`: aarch64), the plain expedited one,
/// registered, and the global one if the kernel's query lists it. The
/// registration's errno if none is granted.
fn choose(
    fallbacks: bool,
    call: impl Fn(libc::c_long) -> io::Result<libc::c_long>,
) -> io::Result<CoreSync> {
    let refused = match call(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE) {
        Ok(_) => return Ok(CoreSync::Expedited),
        Err(refused) if !fallbacks => return Err(refused),
        Err(refused) => refused,
    };
    if call(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED).is_ok() {
        return Ok(CoreSync::PrivateExpedited);
    }
    match call(MEMBARRIER_CMD_QUERY) {
        Ok(commands) if commands & MEMBARRIER_CMD_GLOBAL != 0 => Ok(CoreSync::Global),
        // The first registration's errno says most.
        _ => Err(refused),
    }
}

/// Makes every other thread of the process execute a core-serializing
/// instruction before it next runs user code, so none keeps executing stale
/// instructions of code that was just modified (cross-modifying code, on x86-64
/// and aarch64 alike), the way [`sync_cores_ready`] chose.
pub(crate) fn sync_cores(how: CoreSync) -> io::Result<()> {
    membarrier(match how {
        CoreSync::Expedited => MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE,
        CoreSync::PrivateExpedited => MEMBARRIER_CMD_PRIVATE_EXPEDITED,
        CoreSync::Global => MEMBARRIER_CMD_GLOBAL,
    })
    .map(drop)
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

    // Issue 67, item 8: the hint was drawn below 2⁴⁶ whatever the address space; a
    // 39-bit kernel refuses it, and the writable view lands next to the
    // executable one.
    #[test]
    fn the_write_views_hint_fits_the_address_space() {
        let span = 1 << 30;
        for bits in [39, 42, 47, 48, 57] {
            let top = 1usize << (bits - 1).min(46);
            let mut seen = 0;
            for i in 0..4096u64 {
                let random = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (i << 40);
                let hint = hint_below(random, span, bits);
                assert!(hint >= 1 << 32, "{bits} bits: {hint:#x}");
                assert!(hint + span <= top, "{bits} bits: {hint:#x}");
                assert_eq!(hint % 0x1_0000, 0);
                seen = seen.max(hint);
            }
            // The draw reaches the upper part of the room.
            assert!(seen > top / 2, "{bits} bits: {seen:#x}");
        }
        // No room above 4 GiB: no hint.
        assert_eq!(hint_below(u64::MAX, (1 << 38) - (1 << 32), 39), 0);
        // Where the stack is: at the top of a 47-bit user space (x86-64
        // with 4-level tables; qemu-user's guests vary).
        #[cfg(target_arch = "x86_64")]
        assert_eq!(user_address_bits(), 47);
    }

    // Issue 67, item 5: the fallbacks, as a kernel or a seccomp policy
    // grants the commands. Registration of SYNC_CORE is 64, of the plain
    // expedited command 16; the query is 0 and lists GLOBAL as bit 0.
    #[test]
    fn the_core_sync_falls_back_where_returns_synchronize() {
        let kernel = |granted: &'static [libc::c_long], query: libc::c_long| {
            move |cmd: libc::c_long| match cmd {
                0 => Ok(query),
                cmd if granted.contains(&cmd) => Ok(0),
                _ => Err(io::Error::from_raw_os_error(libc::EINVAL)),
            }
        };
        let errno = |r: io::Result<CoreSync>| r.map_err(|e| e.raw_os_error());
        // A kernel since 4.16: the core-serializing command, on both.
        for fallbacks in [false, true] {
            assert_eq!(
                errno(choose(fallbacks, kernel(&[64, 16], 0x7f))),
                Ok(CoreSync::Expedited)
            );
        }
        // 4.14 (Amazon Linux 2 on Graviton): the plain expedited command on
        // aarch64; nothing on x86-64.
        assert_eq!(
            errno(choose(true, kernel(&[16], 0x1f))),
            Ok(CoreSync::PrivateExpedited)
        );
        assert_eq!(
            errno(choose(false, kernel(&[16], 0x1f))),
            Err(Some(libc::EINVAL))
        );
        // Only the global command (4.3 to 4.13).
        assert_eq!(errno(choose(true, kernel(&[], 1))), Ok(CoreSync::Global));
        // None at all: the registration's errno.
        assert_eq!(errno(choose(true, kernel(&[], 0))), Err(Some(libc::EINVAL)));
    }
}
