//! What a patch writes: the runs of bytes a patch closure changed in its copy
//! of a block, so that only those reach the live code.

use std::ops::Range;

/// The maximal runs of positions where `before` and `after` differ, in
/// ascending order (`[1, 2, 3, 4]` against `[1, 9, 9, 4]` is one run, `1..3`).
/// The slices have the same length.
pub(super) fn changed_runs(before: &[u8], after: &[u8]) -> Vec<Range<usize>> {
    let mut runs: Vec<Range<usize>> = Vec::new();
    for (i, _) in before
        .iter()
        .zip(after)
        .enumerate()
        .filter(|(_, (a, b))| a != b)
    {
        match runs.last_mut() {
            Some(run) if run.end == i => run.end = i + 1,
            _ => runs.push(i..i + 1),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::changed_runs;

    #[test]
    fn runs_are_maximal_and_ordered() {
        assert_eq!(
            changed_runs(&[1, 2, 3], &[1, 2, 3]),
            Vec::<std::ops::Range<usize>>::new()
        );
        assert_eq!(changed_runs(&[1, 2, 3, 4], &[1, 9, 9, 4]), vec![1..3]);
        assert_eq!(
            changed_runs(&[0; 6], &[1, 0, 1, 1, 0, 1]),
            vec![0..1, 2..4, 5..6]
        );
        assert_eq!(changed_runs(&[0; 3], &[7; 3]), vec![0..3]);
    }
}
