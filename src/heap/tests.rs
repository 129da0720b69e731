//! The heap's writer steps that tests outside the crate cannot reach: a map
//! store refused after the rest of a publish was ready.

use std::sync::{Arc, Mutex};

use super::{CodeHeap, HeapConfig, HeapError};
use crate::events::{CodeEvent, CodeListener, Listeners};
use crate::nibble::MapError;
use crate::{CodeInfo, Domain, JitKind};

/// Every event's kind and start, in order.
#[derive(Default)]
struct Recorder(Mutex<Vec<(char, usize)>>);

impl CodeListener for Recorder {
    fn on_event(&self, event: &CodeEvent) {
        let entry = match event {
            CodeEvent::Load(l) => ('L', l.start),
            CodeEvent::Move(m) => ('M', m.new_start),
            CodeEvent::Free(f) => ('F', f.start),
            _ => ('?', 0),
        };
        self.0.lock().unwrap().push(entry);
    }
}

/// A move whose map store is refused (a start forged into the target's
/// bucket) tells listeners nothing and leaves the old block live and found.
/// On the old code the `Move` event went out before the store, then a `Free`
/// of the new block: listeners took the live method for freed.
#[test]
fn a_move_refused_at_the_map_store_tells_listeners_nothing() {
    let domain = Domain::new(2);
    let listeners = Arc::new(Listeners::default());
    let recorder = Arc::new(Recorder::default());
    listeners.add(recorder.clone()).unwrap();
    let heap = CodeHeap::with_listeners(
        HeapConfig {
            span: 1 << 16,
            ..HeapConfig::default()
        },
        &domain,
        listeners,
    )
    .unwrap();
    let mut r = heap.reserve(64).unwrap();
    r.code_mut().fill(0xC3);
    let code = r
        .publish(CodeInfo::new(1, "moved", JitKind::Optimized))
        .unwrap();
    // Where the move's reservation will go (first fit), then a start forged
    // into that bucket.
    let target = heap.reserve(64).unwrap();
    let offset = (target.address() - heap.base()) as u64;
    target.abort();
    heap.writer.lock().map.set_allocated(offset, 4).unwrap();
    heap.listeners().flush();
    recorder.0.lock().unwrap().clear();

    let refused = heap.move_block(code);
    assert!(
        matches!(
            refused,
            Err(HeapError::Map(
                MapError::BucketOccupied { .. } | MapError::Overlap { .. }
            ))
        ),
        "{refused:?}"
    );
    heap.listeners().flush();
    assert_eq!(*recorder.0.lock().unwrap(), []);
    let reader = domain.register().unwrap();
    let guard = reader.pin().unwrap();
    let found = heap.find(&guard, code.start() + 10).unwrap().unwrap();
    assert_eq!((found.start(), found.size()), (code.start(), 64));
    drop(guard);

    // The forged start gone, the same move goes through and says so once.
    heap.writer.lock().map.delete(offset).unwrap();
    let moved = heap.move_block(code).unwrap();
    heap.listeners().flush();
    assert_eq!(*recorder.0.lock().unwrap(), [('M', moved.start())]);
}

/// The move events a listener heard, whole, and whether, when each came,
/// the heap still found its old copy and found its new one.
#[derive(Default)]
struct Moves {
    heard: Mutex<Vec<(crate::events::CodeMove, bool, bool)>>,
    seen: std::sync::OnceLock<(Arc<Domain>, Arc<CodeHeap>)>,
}

impl CodeListener for Moves {
    fn on_event(&self, event: &CodeEvent) {
        if let (CodeEvent::Move(m), Some((domain, heap))) = (event, self.seen.get()) {
            let reader = domain.register().unwrap();
            let guard = reader.pin().unwrap();
            let old = heap.find(&guard, m.old_start).unwrap().is_some();
            let new = heap.find(&guard, m.new_start).unwrap().is_some();
            self.heard.lock().unwrap().push((m.clone(), old, new));
        }
    }
}

/// A move's event comes once its old copy is unpublished (a listener finds
/// the new copy and not the old), and carries the tag the old copy was
/// retired at, taken by the heap: between the tags taken just before and
/// just after the move, and not safe while a reader pinned before the move
/// holds its guard. On the old code the event was queued before the new
/// copy was visible and had no tag: the agent's listener took one when the
/// event reached it, which could be before the old copy was unpublished
/// (then a handler pinned later could still find the old copy, whose
/// placement the collector had already forgotten).
#[test]
fn a_move_carries_the_tag_its_old_copy_was_retired_at() {
    let domain = Domain::new(3);
    let listeners = Arc::new(Listeners::default());
    let moves = Arc::new(Moves::default());
    listeners.add(moves.clone()).unwrap();
    let heap = Arc::new(
        CodeHeap::with_listeners(
            HeapConfig {
                span: 1 << 16,
                ..HeapConfig::default()
            },
            &domain,
            listeners,
        )
        .unwrap(),
    );
    assert!(moves.seen.set((domain.clone(), heap.clone())).is_ok());
    let mut r = heap.reserve(64).unwrap();
    r.code_mut().fill(0xC3);
    let code = r
        .publish(CodeInfo::new(1, "moved", JitKind::Optimized))
        .unwrap();
    let reader = domain.register().unwrap();
    let guard = reader.pin().unwrap();
    let before = domain.retire_tag();
    let moved = heap.move_block(code).unwrap();
    let after = domain.retire_tag();
    heap.listeners().flush();
    let heard = moves.heard.lock().unwrap().clone();
    assert_eq!(heard.len(), 1);
    let (m, old_found, new_found) = &heard[0];
    assert_eq!(
        (m.old_block, m.new_block, m.old_start, m.new_start, m.size),
        (
            code.block_id(),
            moved.block_id(),
            code.start(),
            moved.start(),
            64
        )
    );
    assert_eq!((*old_found, *new_found), (false, true));
    assert_eq!(m.retire_tag, before + 1);
    assert_eq!(after, before + 2);
    assert!(!domain.is_safe(m.retire_tag));
    drop(guard);
    assert!(domain.is_safe(m.retire_tag));
}
