//! What a patch writes: the aligned words holding the bytes a patch closure
//! changed in its copy of a block, each written whole by one store
//! (`arch::store_patch_word`), so that a thread running the code sees each
//! word old or new.

/// The stores of a patch that turned `before` into `after` (a block's
/// bytes; the block starts on a multiple of `W`): for each aligned word of
/// `W` bytes holding a changed byte, in ascending order, its offset in the
/// block and its new contents: the changed bytes from `after`, every other
/// byte as `live` holds it now (a concurrent patch may have changed it since
/// `before` was copied; the caller reads `live` under the heap lock). `live`
/// is the block's bytes from its start, through the end of its last word.
pub(super) fn word_stores<const W: usize>(
    before: &[u8],
    after: &[u8],
    live: &[u8],
) -> Vec<(usize, [u8; W])> {
    let mut stores: Vec<(usize, [u8; W])> = Vec::new();
    for (i, (&old, &new)) in before.iter().zip(after).enumerate() {
        if old == new {
            continue;
        }
        let start = i - i % W;
        if stores.last().is_none_or(|&(at, _)| at != start) {
            let mut word = [0u8; W];
            word.copy_from_slice(&live[start..start + W]);
            stores.push((start, word));
        }
        if let Some((_, word)) = stores.last_mut() {
            word[i - start] = new;
        }
    }
    stores
}

#[cfg(test)]
mod tests {
    use super::word_stores;

    /// Each aligned word holding a changed byte is written once, whole: its
    /// changed bytes from the patch, the rest as the live code holds them.
    #[test]
    fn each_changed_word_is_one_store_of_its_width() {
        // A `call rel32` at offset 1 whose displacement changes in its
        // bytes 0 and 2 (block bytes 2 and 4): one 8-byte store, not two
        // byte copies with the unchanged byte 3 between them.
        let before = [0x50, 0xE8, 0x10, 0x00, 0x01, 0x00, 0x59, 0xC3, 0xCC, 0xCC];
        let mut after = before;
        (after[2], after[4]) = (0x20, 0x02);
        let mut live = before.to_vec();
        live.resize(16, 0xCC);
        assert_eq!(
            word_stores::<8>(&before, &after, &live),
            vec![(0, [0x50, 0xE8, 0x20, 0x00, 0x02, 0x00, 0x59, 0xC3])]
        );
        // In 4-byte words (aarch64) the same change is two stores, one per
        // instruction word it touches.
        assert_eq!(
            word_stores::<4>(&before, &after, &live),
            vec![(0, [0x50, 0xE8, 0x20, 0x00]), (4, [0x02, 0x00, 0x59, 0xC3])]
        );
        // Nothing changed: no store.
        assert_eq!(word_stores::<8>(&before, &before, &live), vec![]);
        // A byte another patch changed since the copy (live[7]) is kept;
        // the last word reaches past the block into its padding.
        live[7] = 0x90;
        let mut tail = before;
        tail[9] = 0xC3;
        assert_eq!(
            word_stores::<8>(&before, &tail, &live),
            vec![(8, [0xCC, 0xC3, 0xCC, 0xCC, 0xCC, 0xCC, 0xCC, 0xCC])]
        );
        (after[7], after[9]) = (0xC3, 0xC3);
        assert_eq!(
            word_stores::<8>(&before, &after, &live),
            vec![
                (0, [0x50, 0xE8, 0x20, 0x00, 0x02, 0x00, 0x59, 0x90]),
                (8, [0xCC, 0xC3, 0xCC, 0xCC, 0xCC, 0xCC, 0xCC, 0xCC])
            ]
        );
    }
}
