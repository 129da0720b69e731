//! Workload generators: method sizes and map operation sequences.

use crate::model::{MapModel, Verdict};
use crate::rng::Rng;

/// A realistic method-size mix: most methods are under 1 KiB, with a tail of large
/// ones (up to `max_large`).
pub fn method_size(rng: &mut Rng, max_large: u64) -> u64 {
    match rng.below(100) {
        0..=59 => rng.range(16, 256),
        60..=89 => rng.range(257, 1024),
        90..=97 => rng.range(1025, 16 * 1024),
        _ => rng.range(16 * 1024, max_large.max(16 * 1024)),
    }
}

/// One generated map operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapOp {
    /// Set a block; `verdict` is the model's judgement of it.
    Set {
        start: u64,
        size: u64,
        verdict: Verdict,
    },
    /// Delete; `live` is whether the model holds the start.
    Delete { start: u64, live: bool },
}

/// Draws the next map operation for a map over `span` bytes in the state `model`
/// describes. Sizes scale with the span; a share of the operations are invalid.
pub fn map_op(rng: &mut Rng, model: &MapModel, span: u64) -> MapOp {
    let live = model.live();
    if !live.is_empty() && rng.chance(35) {
        let start = if rng.chance(90) {
            *live
                .keys()
                .nth(rng.below(live.len() as u64) as usize)
                .unwrap_or(&0)
        } else {
            rng.below(span) & !3
        };
        return MapOp::Delete {
            start,
            live: live.contains_key(&start),
        };
    }
    let align = if rng.chance(95) { 4 } else { 1 };
    let start = rng.below(span) / align * align;
    let size = match rng.below(10) {
        0 => 0,
        1..=5 => rng.range(1, 64),
        6..=8 => rng.range(64, 2048),
        _ => rng.range(2048, span / 2),
    };
    MapOp::Set {
        start,
        size,
        verdict: model.judge(start, size),
    }
}
