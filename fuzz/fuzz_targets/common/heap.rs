//! The one heap a fuzz target's thread publishes into across inputs.

use jitmap::{ExecutionManager, HeapConfig, OwnedHeap};

/// A manager with one 1 MiB heap of the default configuration.
pub fn small_heap() -> (ExecutionManager, OwnedHeap) {
    let manager = ExecutionManager::new(4);
    let heap = manager
        .create_heap(HeapConfig {
            span: 1 << 20,
            ..HeapConfig::default()
        })
        .expect("a 1 MiB heap");
    (manager, heap)
}
