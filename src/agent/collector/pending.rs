//! Drained samples not named yet: how long they may wait for events, the retry pass, stale rows.

use crate::agent::loader;
use crate::agent::record::{RawFrame, ThreadRecord};
use crate::unwind::StackEnd;

use super::Collector;

/// Passes a drained sample is retried for while a frame in it names what
/// the collector does not know (a JIT version, an image method, code whose
/// free it has not seen): a load event can follow the first samples in its
/// code by a pass, and a move's event follows its new copy's first
/// samples. Past these passes and [`WAIT_NS`] after it ended, a sample
/// takes each such frame as it is (unattributed; an image method unnamed):
/// one that waited for an event that never comes would wait for good, and
/// hold with it the placements and the unloaded images its frames may name.
pub(super) const RETRIES: u32 = 2;

/// How long after it ended a sample may wait for its events, whatever the
/// passes (two can run back to back: `profile_window(Duration::ZERO)`).
/// A heap sends an event within its publish, under its lock; a second
/// covers a heap thread that was preempted there on a loaded machine.
pub(super) const WAIT_NS: u64 = 1_000_000_000;

/// Frame buffers kept for reuse: a pass of 4,096 samples allocates none.
pub(super) const SPARE_FRAME_BUFFERS: usize = 4096;

/// A drained sample whose frames are not all named yet (an event that
/// names one may still be on its way; see [`RETRIES`]).
pub(super) struct Pending {
    /// Collection passes that could not name it yet.
    pub(super) attempts: u32,
    /// Set when drained from a walk that stepped frames by native rows:
    /// what the stale-rows check needs ([`Collector::check_native_rows`]).
    pub(super) native: Option<NativeRows>,
    pub(super) tid: u32,
    pub(super) begin_ns: u64,
    pub(super) end_ns: u64,
    /// The timer expirations it stands for (1 + the signal's overrun).
    pub(super) weight: u32,
    pub(super) frames: Vec<RawFrame>,
}

/// A drained sample's native rows: the first frame they stepped, the
/// loader's counts they were made at, how its walk ended, and its thread.
#[derive(Clone, Copy)]
pub(super) struct NativeRows {
    pub(super) from: u32,
    pub(super) loader: (u64, u64),
    pub(super) end: u8,
    pub(super) record: usize,
}

impl Collector {
    /// The rest of a pass, once the events sent so far are applied: names
    /// the samples `drained` and those still waiting (a sample that cannot
    /// be named yet waits for the next pass), forgets what no sample can
    /// name any more once `safe` ([`Collector::forget`]), and merges retired
    /// versions past the cap.
    pub(super) fn settle(&mut self, drained: &mut Vec<Pending>, safe: u64) {
        let waiting = std::mem::take(&mut self.pending);
        // Read once a pass: how long each waiting sample has waited.
        let now_ns = crate::events::monotonic_ns();
        for mut sample in waiting.into_iter().chain(drained.drain(..)) {
            if self.add(&sample, now_ns) {
                self.recycle(sample.frames);
            } else {
                sample.attempts += 1;
                self.pending.push(sample);
            }
        }
        self.forget(safe);
        if self.methods.len() > self.merge_at {
            self.merge_retired();
            self.merge_at = self
                .max_versions
                .max(self.methods.len() + self.max_versions / 2);
        }
    }

    /// Keeps a counted sample's frame buffer for the next drain.
    fn recycle(&mut self, mut frames: Vec<RawFrame>) {
        if self.spare_frames.len() < SPARE_FRAME_BUFFERS {
            frames.clear();
            self.spare_frames.push(frames);
        }
    }

    /// Cuts each drained sample whose native rows may be another object's
    /// at the first frame they stepped, and counts its walk as ended by
    /// [`StackEnd::NoUnwindInfo`]. The handler steps native frames by the
    /// table the collector made last, which may predate a `dlclose` and a
    /// `dlopen` that put another object at the same addresses. The loader's
    /// counts of loads and unloads only grow, so rows made at counts `c` are
    /// the loaded objects' at every moment the counts read `c`: at any
    /// sample before a moment they were read as `c`. They are read after
    /// every drain; a sample is kept whole if its rows' counts are those
    /// read now, or those read after the previous drain when its walk had
    /// ended before that (it read the table somewhere between the handler's
    /// entry and its end). Only samples from the pass in which the loader changed
    /// can be cut.
    pub(super) fn check_native_rows(&mut self, records: &[&ThreadRecord], drained: &mut [Pending]) {
        let now = (loader::counts(), crate::events::monotonic_ns());
        let before = self.loader_seen.replace(now);
        for sample in drained.iter_mut() {
            let Some(rows) = sample.native.take() else {
                continue;
            };
            let current = rows.loader == now.0
                || before
                    .is_some_and(|(counts, at_ns)| rows.loader == counts && sample.end_ns <= at_ns);
            if !current {
                sample.frames.truncate(rows.from as usize + 1);
                if let Some(record) = records.get(rows.record) {
                    record.recount_end(rows.end, StackEnd::NoUnwindInfo, sample.weight);
                }
            }
        }
    }
}
