//! The code-event log: the heaps' events, kept until the collector's next pass applies them.

use std::sync::Arc;

use parking_lot::Mutex;

use crate::events::{BlockId, CodeEvent, CodeListener};
use crate::image::ImageSection;
use crate::{CodeInfo, ExecutionManager};

/// The code events the collector has not applied yet.
#[derive(Default)]
pub(crate) struct EventLog {
    pub(super) events: Mutex<Vec<LogEntry>>,
}

pub(super) enum LogEntry {
    Loaded {
        block: BlockId,
        info: Arc<CodeInfo>,
        start: usize,
        size: u64,
        at_ns: u64,
    },
    Moved {
        from: BlockId,
        to: BlockId,
        start: usize,
        at_ns: u64,
        /// The retire tag after the move: the old copy may still run, and be
        /// sampled, until it is safe.
        tag: u64,
        /// CLOCK_MONOTONIC ns, taken after the old copy was unpublished: a
        /// handler that began later cannot have found it through the maps.
        unpublished_ns: u64,
    },
    Freed {
        block: BlockId,
        tag: u64,
        /// CLOCK_MONOTONIC ns, taken after the unpublish: a handler that
        /// began later cannot have found the block through the maps.
        at_ns: u64,
    },
    ImageLoaded(Arc<ImageSection>),
    ImageUnloaded {
        /// The unloaded image's [`ImageSection::id`].
        id: u64,
        tag: u64,
    },
}

/// Listens on the manager's code events for the collector.
pub(crate) struct EventListener {
    pub(crate) log: Arc<EventLog>,
    pub(crate) manager: ExecutionManager,
}

impl CodeListener for EventListener {
    fn on_event(&self, event: &CodeEvent) {
        let entry = match event {
            CodeEvent::Load(load) => LogEntry::Loaded {
                block: load.block,
                info: Arc::clone(&load.info),
                start: load.start,
                size: load.code.len() as u64,
                at_ns: load.timestamp,
            },
            // A move keeps the version, in a new block.
            CodeEvent::Move(moved) => LogEntry::Moved {
                from: moved.old_block,
                to: moved.new_block,
                start: moved.new_start,
                at_ns: moved.timestamp,
                // Taken by the heap after it unpublished the old copy: a
                // handler that pins later cannot find it, and one that
                // found it, or an executor still running it, holds an
                // older slot. (A tag taken here could precede the
                // unpublish, and the old copy be forgotten while a handler
                // still finds it.)
                tag: moved.retire_tag,
                unpublished_ns: moved.unpublished,
            },
            CodeEvent::Free(free) => LogEntry::Freed {
                block: free.block,
                // Every handler that could still find the freed block, and every
                // executor that could still run it, holds a slot older than this
                // tag; once it is safe, their samples are in the rings.
                tag: self.manager.domain().retire_tag(),
                at_ns: free.timestamp,
            },
            CodeEvent::ImageLoad(load) => LogEntry::ImageLoaded(Arc::clone(&load.image)),
            // As for a free: handlers that found the image are older.
            CodeEvent::ImageUnload(unload) => LogEntry::ImageUnloaded {
                id: unload.image_id,
                tag: self.manager.domain().retire_tag(),
            },
        };
        self.log.events.lock().push(entry);
    }
}
