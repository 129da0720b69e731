//! Setup shared by the integration tests.

use std::sync::Arc;

use jitmap::{CodeHeap, Domain, HeapConfig};

/// A 1 MiB v2 RWX heap (small pages) and a reader domain of `slots` slots.
pub fn small_heap(slots: usize) -> (Arc<Domain>, CodeHeap) {
    let domain = Domain::new(slots);
    let heap = CodeHeap::new(
        HeapConfig {
            span: 1 << 20,
            ..HeapConfig::default()
        },
        &domain,
    )
    .expect("a 1 MiB heap");
    (domain, heap)
}
