//! An append-only output written in whole records (jitdump records, perf map
//! lines): a record is written whole or not at all, and the first write that
//! fails (a full disk, a file-size limit) stops the output, which then ends
//! at its last whole record. What could not be written from then on is
//! counted, with the error, for the host to read and report.
//!
//! A write past `RLIMIT_FSIZE` also raises SIGXFSZ at the writing thread,
//! and that signal's default action ends the process. Every write here
//! runs with SIGXFSZ blocked on its thread, and a write that fails with
//! EFBIG takes the signal it raised, so a host that never touched SIGXFSZ
//! sees a stopped output, not a killed process.

use std::fs::File;
use std::io::{self, IoSlice, Seek, SeekFrom, Write};

/// Why an output stopped: the error of its first failed write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteFailure {
    /// The OS error number, when the failure was one.
    pub errno: Option<i32>,
    /// The error's kind.
    pub kind: io::ErrorKind,
    /// The error's message.
    pub message: String,
}

impl WriteFailure {
    fn of(e: &io::Error) -> Self {
        Self {
            errno: e.raw_os_error(),
            kind: e.kind(),
            message: e.to_string(),
        }
    }
}

impl std::fmt::Display for WriteFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// The file, its length in whole records, and what it lost.
pub(crate) struct RecordFile {
    file: File,
    /// Bytes of whole records: where the file ends.
    len: u64,
    /// Records (events) that were not written.
    lost: u64,
    failure: Option<WriteFailure>,
}

impl RecordFile {
    /// `file`, positioned at its end, `len` bytes long.
    pub(crate) fn new(file: File, len: u64) -> Self {
        Self {
            file,
            len,
            lost: 0,
            failure: None,
        }
    }

    /// Appends one record made of `bufs`, whole, or nothing: after a failed
    /// write the file is cut back to its last whole record and nothing more
    /// is written. Returns whether the record was written.
    pub(crate) fn append(&mut self, bufs: &mut [IoSlice<'_>]) -> bool {
        if self.failure.is_some() {
            self.lost += 1;
            return false;
        }
        let size: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        match without_sigxfsz(|| write_all_vectored(&mut self.file, bufs)) {
            Ok(()) => {
                self.len += size;
                true
            }
            Err(e) => {
                self.failure = Some(WriteFailure::of(&e));
                self.lost += 1;
                // A part of the record may be in the file: cut it off. If even
                // that fails, the reader's own checks still find a torn end.
                let _ = self
                    .file
                    .set_len(self.len)
                    .and_then(|()| self.file.seek(SeekFrom::Start(self.len)));
                false
            }
        }
    }

    /// Records not written: the one whose write failed and every one after.
    pub(crate) fn lost(&self) -> u64 {
        self.lost
    }

    /// The first failed write's error, if one failed.
    pub(crate) fn failure(&self) -> Option<&WriteFailure> {
        self.failure.as_ref()
    }
}

/// Runs `write` with SIGXFSZ blocked on this thread, and takes the SIGXFSZ
/// that a write past the file-size limit raised (it fails with EFBIG), so
/// that the limit stops an output instead of ending the process. A host that
/// blocks SIGXFSZ itself keeps its own pending signal: nothing is taken then.
pub(crate) fn without_sigxfsz<T>(write: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    // SAFETY: sigset_t is plain data; sigemptyset and sigaddset initialise it.
    let mut xfsz: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid set pointers; these calls only change this thread's mask.
    let blocked = unsafe {
        libc::sigemptyset(&mut xfsz);
        libc::sigaddset(&mut xfsz, libc::SIGXFSZ);
        libc::pthread_sigmask(libc::SIG_BLOCK, &xfsz, &mut old) == 0
    };
    let result = write();
    if blocked {
        // SAFETY: `old` was filled by pthread_sigmask above.
        let host_blocks = unsafe { libc::sigismember(&old, libc::SIGXFSZ) } == 1;
        if !host_blocks && matches!(&result, Err(e) if e.raw_os_error() == Some(libc::EFBIG)) {
            let now = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: valid set and timeout; polls for the pending signal
            // the failed write raised at this thread, and takes it.
            unsafe { libc::sigtimedwait(&xfsz, std::ptr::null_mut(), &now) };
        }
        // SAFETY: restores the mask read above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    }
    result
}

/// Writes all of `bufs` with as few `writev` calls as the kernel allows (one
/// for any regular file write that fits).
fn write_all_vectored(file: &mut File, bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
    let mut bufs = bufs;
    while !bufs.is_empty() {
        match file.write_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
