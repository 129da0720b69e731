//! Start-map words of another process, for the lookups written once over
//! [`WordRead`].

use std::cell::Cell;

use super::RemoteError;
use super::checks::read_u32_at;
use super::memory::Memory;
use crate::map_words::WordRead;

/// Start-map words at `addr` in another process: a failed read answers 0 and
/// is kept, and the caller checks it once the lookup returns, so a lookup over
/// them never acts on a failed read.
pub(crate) struct RemoteWords<'r, M> {
    memory: &'r M,
    addr: u64,
    count: usize,
    failed: Cell<Option<RemoteError>>,
}

impl<'r, M: Memory> RemoteWords<'r, M> {
    /// `count` words at `addr` of `memory`.
    pub(crate) fn new(memory: &'r M, addr: u64, count: usize) -> Self {
        Self {
            memory,
            addr,
            count,
            failed: Cell::new(None),
        }
    }

    /// The first read error seen, if any.
    pub(crate) fn check(&self) -> Result<(), RemoteError> {
        self.failed.take().map_or(Ok(()), Err)
    }

    fn load(&self, index: usize) -> u32 {
        let mut bytes = [0u8; 4];
        if index >= self.count {
            return 0;
        }
        let failed = self.failed.take();
        if failed.is_some() {
            // After a failure every word reads 0: the answer is thrown away.
            self.failed.set(failed);
            return 0;
        }
        if let Err(e) = self.memory.read(self.addr + 4 * index as u64, &mut bytes) {
            self.failed.set(Some(e));
            return 0;
        }
        u32::from_ne_bytes(bytes)
    }
}

impl<M: Memory> WordRead for RemoteWords<'_, M> {
    fn word_count(&self) -> usize {
        self.count
    }

    fn load(&self, index: usize) -> u32 {
        RemoteWords::load(self, index)
    }
}

/// Start-map words copied out of another process in one read, for
/// [`crate::nibble::Starts`].
pub(crate) struct ChunkWords(pub(crate) Vec<u32>);

impl ChunkWords {
    /// Words from their bytes in memory order.
    pub(crate) fn from_bytes(bytes: &[u8]) -> Self {
        Self(bytes.chunks_exact(4).map(|w| read_u32_at(w, 0)).collect())
    }
}

impl WordRead for ChunkWords {
    fn word_count(&self) -> usize {
        self.0.len()
    }

    fn load(&self, index: usize) -> u32 {
        self.0.get(index).copied().unwrap_or(0)
    }
}
