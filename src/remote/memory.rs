//! Read-only memory: another process's (through `process_vm_readv`), or an image
//! assembled from byte ranges (tests and fuzzing).

use std::cell::Cell;
use std::collections::BTreeMap;

use super::RemoteError;

/// Memory a reader can copy bytes out of. Reads never fault: an address that is
/// not readable is an error.
pub trait Memory {
    /// Fills `buf` with the bytes at `addr`, or fails without a partial answer.
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), RemoteError>;
}

/// Another process's memory, read with `process_vm_readv` (which needs the same
/// permission as `ptrace`: the same user and a permissive `ptrace_scope`, or
/// `CAP_SYS_PTRACE`). Where the kernel has no `process_vm_readv` (built
/// without `CONFIG_CROSS_MEMORY_ATTACH`, or a system-call emulator such as
/// qemu-user), reads go through `/proc/PID/mem`, which needs the same
/// permission. The process is not stopped: readers revalidate.
#[derive(Debug)]
pub struct ProcessMemory {
    pid: i32,
    /// `/proc/PID/mem`, opened at the first read that `process_vm_readv`
    /// refuses with ENOSYS (or the errno of that open).
    fallback: std::sync::OnceLock<Result<std::fs::File, i32>>,
}

impl ProcessMemory {
    /// The memory of process `pid`. Nothing is read, or checked, until the first
    /// read.
    ///
    /// ```
    /// use jitmap::remote::{Memory, ProcessMemory};
    /// let me = ProcessMemory::new(std::process::id() as i32);
    /// let value = 0x1234_5678u32;
    /// let mut buf = [0u8; 4];
    /// me.read(&raw const value as u64, &mut buf)?;
    /// assert_eq!(u32::from_ne_bytes(buf), value);
    /// # Ok::<(), jitmap::remote::RemoteError>(())
    /// ```
    pub fn new(pid: i32) -> Self {
        Self {
            pid,
            fallback: std::sync::OnceLock::new(),
        }
    }

    /// Reads through `/proc/PID/mem`: the path without `process_vm_readv`.
    fn read_proc_mem(&self, addr: u64, buf: &mut [u8]) -> Result<(), i32> {
        use std::os::unix::fs::FileExt;
        let file = self.fallback.get_or_init(|| {
            std::fs::File::open(format!("/proc/{}/mem", self.pid))
                .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
        });
        let file = file.as_ref().map_err(|&errno| errno)?;
        file.read_exact_at(buf, addr)
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EFAULT))
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        self.pid
    }
}

impl Memory for ProcessMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), RemoteError> {
        if buf.is_empty() {
            return Ok(());
        }
        let len = buf.len();
        let unreadable = |errno| RemoteError::Unreadable { addr, len, errno };
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let remote = libc::iovec {
            iov_base: addr as usize as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // SAFETY: `local` describes `buf`, which we borrow mutably for the call;
        // the kernel checks `remote` against the other process's mappings and
        // never writes outside `local`.
        let n = unsafe { libc::process_vm_readv(self.pid, &local, 1, &remote, 1, 0) };
        if n < 0 {
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            if errno == libc::ENOSYS {
                return self.read_proc_mem(addr, buf).map_err(unreadable);
            }
            return Err(unreadable(errno));
        }
        if n as usize != buf.len() {
            return Err(unreadable(libc::EFAULT));
        }
        Ok(())
    }
}

/// An address space made of byte ranges: a snapshot to read offline, or a fake
/// one built by a test or a fuzzer. Ranges do not overlap; a read must fall
/// inside one range.
///
/// ```
/// use jitmap::remote::{Memory, MemoryImage, RemoteError};
/// let mut image = MemoryImage::new();
/// image.insert(0x1000, vec![1, 2, 3, 4])?;
/// let mut buf = [0u8; 2];
/// image.read(0x1002, &mut buf)?;
/// assert_eq!(buf, [3, 4]);
/// assert!(matches!(image.read(0x1003, &mut buf), Err(RemoteError::Unreadable { .. })));
/// assert!(image.insert(0x1003, vec![0]).is_err()); // overlaps
/// # Ok::<(), RemoteError>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct MemoryImage {
    ranges: BTreeMap<u64, Vec<u8>>,
}

impl MemoryImage {
    /// An empty address space.
    pub fn new() -> Self {
        Self::default()
    }

    /// Places `bytes` at `addr`. A range that overlaps one already placed, or
    /// wraps around the address space, is refused and nothing changes.
    pub fn insert(&mut self, addr: u64, bytes: Vec<u8>) -> Result<(), RemoteError> {
        let end = addr
            .checked_add(bytes.len() as u64)
            .ok_or(RemoteError::Corrupt {
                what: "memory range wraps",
                addr,
            })?;
        let overlaps_before = self
            .ranges
            .range(..=addr)
            .next_back()
            .is_some_and(|(&a, b)| a + b.len() as u64 > addr);
        let overlaps_after = self.ranges.range(addr..end).next().is_some();
        if overlaps_before || overlaps_after {
            return Err(RemoteError::Corrupt {
                what: "memory ranges overlap",
                addr,
            });
        }
        self.ranges.insert(addr, bytes);
        Ok(())
    }

    /// Writes `bytes` at `addr` inside a placed range (a test's writer).
    pub fn write(&mut self, addr: u64, bytes: &[u8]) -> Result<(), RemoteError> {
        let (&base, range) =
            self.ranges
                .range_mut(..=addr)
                .next_back()
                .ok_or(RemoteError::Unreadable {
                    addr,
                    len: bytes.len(),
                    errno: libc::EFAULT,
                })?;
        let from = (addr - base) as usize;
        let to = from
            .checked_add(bytes.len())
            .filter(|&to| to <= range.len());
        match to {
            Some(to) => {
                range[from..to].copy_from_slice(bytes);
                Ok(())
            }
            None => Err(RemoteError::Unreadable {
                addr,
                len: bytes.len(),
                errno: libc::EFAULT,
            }),
        }
    }
}

impl Memory for MemoryImage {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), RemoteError> {
        let fault = RemoteError::Unreadable {
            addr,
            len: buf.len(),
            errno: libc::EFAULT,
        };
        let Some((&base, range)) = self.ranges.range(..=addr).next_back() else {
            return Err(fault);
        };
        let from = (addr - base) as usize;
        match from.checked_add(buf.len()) {
            Some(to) if to <= range.len() => {
                buf.copy_from_slice(&range[from..to]);
                Ok(())
            }
            _ => Err(fault),
        }
    }
}

/// Counts the reads made through it: what a lookup would cost a reader that pays
/// per read (a system call, or a `bpf_probe_read_user`).
#[derive(Debug)]
pub struct Counted<M> {
    memory: M,
    reads: Cell<u64>,
}

impl<M: Memory> Counted<M> {
    /// Wraps `memory`.
    pub fn new(memory: M) -> Self {
        Self {
            memory,
            reads: Cell::new(0),
        }
    }

    /// Reads made so far.
    pub fn reads(&self) -> u64 {
        self.reads.get()
    }

    /// The wrapped memory.
    pub fn inner(&self) -> &M {
        &self.memory
    }
}

impl<M: Memory> Memory for Counted<M> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), RemoteError> {
        self.reads.set(self.reads.get() + 1);
        self.memory.read(addr, buf)
    }
}

impl<M: Memory + ?Sized> Memory for &M {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), RemoteError> {
        (**self).read(addr, buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The path for kernels without `process_vm_readv` reads the same bytes,
    /// and refuses an unmapped address.
    #[test]
    fn proc_mem_reads_what_process_vm_readv_reads() {
        let me = ProcessMemory::new(std::process::id() as i32);
        let value = 0x1122_3344_5566_7788u64;
        let (mut a, mut b) = ([0u8; 8], [0u8; 8]);
        me.read_proc_mem(&raw const value as u64, &mut a).unwrap();
        assert_eq!(u64::from_ne_bytes(a), value);
        // `process_vm_readv` is missing under some emulators: then `read`
        // took the same path.
        me.read(&raw const value as u64, &mut b).unwrap();
        assert_eq!(a, b);
        assert!(me.read_proc_mem(8, &mut a).is_err());
    }
}
