//! The worked examples and vectors from the spec errata, and one test per error.

use jitmap::map_words::VecWords;
use jitmap::nibble::encoding::{decode_pointer, encode_pointer, is_pointer};
use jitmap::{MapError, MapVersion, MapWriter};

fn writer(version: MapVersion, span: u64) -> MapWriter<VecWords> {
    let words = VecWords::new(jitmap::nibble::words_for_span(span));
    MapWriter::with_store(version, span, words).unwrap()
}

fn words(w: &MapWriter<VecWords>) -> Vec<(usize, u32)> {
    w.map().nonzero_words().collect()
}

#[test]
fn pointer_encoding_vectors() {
    assert_eq!(encode_pointer(0), 0x9);
    assert_eq!(encode_pointer(4), 0xA);
    assert_eq!(encode_pointer(100), 0x6A);
    assert_eq!(encode_pointer(0x1000), 0x1009);
    assert_eq!(encode_pointer(304), 0x139);
    for off in (0..0x10000u32).step_by(4) {
        assert!(is_pointer(encode_pointer(off)));
        assert_eq!(decode_pointer(encode_pointer(off)), off);
    }
}

#[test]
fn spec_example_304_v2() {
    let mut w = writer(MapVersion::V2, 0x1000);
    w.set(304, 1024).unwrap();
    assert_eq!(
        words(&w),
        vec![(1, 0x0500_0000), (2, 0x139), (3, 0x139), (4, 0x139)]
    );
    assert_eq!(w.map().find(1300), Some(304));
    assert_eq!(w.map().find(306), Some(304));
    assert_eq!(w.map().find(302), None);
}

#[test]
fn spec_example_304_v1() {
    let mut w = writer(MapVersion::V1, 0x1000);
    w.set(304, 1024).unwrap();
    assert_eq!(words(&w), vec![(1, 0x0500_0000)]);
    assert_eq!(w.map().find(1300), Some(304));
    assert_eq!(w.map().find(306), Some(304));
    assert_eq!(w.map().find(302), None);
}

#[test]
fn block_0x200_v2_words_and_every_byte() {
    let mut w = writer(MapVersion::V2, 0x1000);
    w.set(0x200, 0x400).unwrap();
    assert_eq!(
        words(&w),
        vec![(2, 0x1000_0000), (3, 0x209), (4, 0x209), (5, 0x209)]
    );
    let map = w.map();
    for addr in 0..0x200 {
        assert_eq!(map.find(addr), None, "before the block: {addr:#x}");
    }
    for addr in 0x200..0x600 {
        assert_eq!(map.find(addr), Some(0x200), "inside: {addr:#x}");
    }
    // The word after the last covered word still names the block (past the end).
    for addr in 0x600..0x700 {
        assert_eq!(map.find(addr), Some(0x200), "past the end: {addr:#x}");
    }
    for addr in 0x700..0x1000 {
        assert_eq!(map.find(addr), None, "far past the end: {addr:#x}");
    }
}

#[test]
fn block_0x200_v1_finds_to_map_end() {
    let mut w = writer(MapVersion::V1, 0x1000);
    w.set(0x200, 0x400).unwrap();
    assert_eq!(words(&w), vec![(2, 0x1000_0000)]);
    for addr in 0..0x200 {
        assert_eq!(w.map().find(addr), None);
    }
    for addr in 0x200..0x1000 {
        assert_eq!(w.map().find(addr), Some(0x200), "{addr:#x}");
    }
    assert_eq!(w.map().find(0x1000), None, "beyond the map");
}

#[test]
fn start_at_word_offset_zero_gets_no_pointer_in_its_own_word() {
    let mut w = writer(MapVersion::V2, 0x1000);
    w.set(0x100, 0x200).unwrap();
    assert_eq!(words(&w), vec![(1, 0x1000_0000), (2, 0x109)]);
}

#[test]
fn adjacent_buckets_may_be_closer_than_32_bytes() {
    let mut w = writer(MapVersion::V2, 0x1000);
    w.set(0x1C, 4).unwrap();
    w.set(0x20, 8).unwrap();
    assert_eq!(words(&w), vec![(0, 0x8100_0000)]);
    assert_eq!(w.map().find(0x1F), Some(0x1C));
    assert_eq!(w.map().find(0x20), Some(0x20));
}

#[test]
fn starts_iterates_in_order_and_skips_pointers() {
    let mut w = writer(MapVersion::V2, 0x4000);
    for (s, n) in [(0x2004, 0x10), (0x30, 0x800), (0x8E0, 0x4), (0x900, 0x1000)] {
        w.set(s, n).unwrap();
    }
    let starts: Vec<u64> = w.map().starts().collect();
    assert_eq!(starts, vec![0x30, 0x8E0, 0x900, 0x2004]);
}

#[test]
fn delete_restores_empty_words() {
    for version in [MapVersion::V1, MapVersion::V2] {
        let mut w = writer(version, 0x2000);
        w.set(0x40, 0x20).unwrap();
        w.set(304, 1024).unwrap();
        w.delete(304).unwrap();
        assert_eq!(words(&w), vec![(0, 0x0010_0000)], "{version}");
        w.delete(0x40).unwrap();
        assert_eq!(words(&w), vec![], "{version}");
    }
}

/// Sets up a map with one block, applies `op`, and checks the error and that no
/// word changed.
fn rejects(
    version: MapVersion,
    op: impl FnOnce(&mut MapWriter<VecWords>) -> Result<(), MapError>,
) -> MapError {
    let mut w = writer(version, 0x1000);
    w.set(0x200, 0x400).unwrap();
    let before = words(&w);
    let err = op(&mut w).unwrap_err();
    assert_eq!(words(&w), before, "{version}: words changed on {err:?}");
    err
}

#[test]
fn error_misaligned_start() {
    for v in [MapVersion::V1, MapVersion::V2] {
        assert_eq!(
            rejects(v, |w| w.set(0x802, 16)),
            MapError::Misaligned { start: 0x802 }
        );
    }
}

#[test]
fn error_second_start_in_bucket() {
    for v in [MapVersion::V1, MapVersion::V2] {
        assert_eq!(
            rejects(v, |w| w.set(0x204, 4)),
            MapError::BucketOccupied {
                start: 0x204,
                existing: 0x200
            }
        );
    }
}

#[test]
fn error_overlap_visible_to_map() {
    for v in [MapVersion::V1, MapVersion::V2] {
        // A block whose range contains the live start.
        assert_eq!(
            rejects(v, |w| w.set(0x100, 0x200)),
            MapError::Overlap {
                start: 0x100,
                existing: 0x200
            }
        );
    }
    // v2 also sees a start inside a pointer word of the live block.
    assert_eq!(
        rejects(MapVersion::V2, |w| w.set(0x440, 0x10)),
        MapError::Overlap {
            start: 0x440,
            existing: 0x200
        }
    );
}

#[test]
fn error_out_of_range() {
    for v in [MapVersion::V1, MapVersion::V2] {
        assert_eq!(
            rejects(v, |w| w.set(0xFF0, 0x20)),
            MapError::OutOfRange {
                start: 0xFF0,
                size: 0x20
            }
        );
        assert_eq!(
            rejects(v, |w| w.set(0x1000, 4)),
            MapError::OutOfRange {
                start: 0x1000,
                size: 4
            }
        );
        assert_eq!(
            rejects(v, |w| w.set(0xFFFF_FFFF_FFFF_FFF0, 0x20)),
            MapError::OutOfRange {
                start: 0xFFFF_FFFF_FFFF_FFF0,
                size: 0x20
            }
        );
    }
}

#[test]
fn error_span_of_4_gib() {
    assert_eq!(
        MapWriter::new(MapVersion::V2, 1 << 32).err(),
        Some(MapError::SpanTooLarge { span: 1 << 32 })
    );
    let w = MapWriter::new(MapVersion::V2, (1 << 32) - 256).unwrap();
    assert_eq!(w.map().word_count(), (1 << 24) - 1);
}

#[test]
fn error_zero_size() {
    for v in [MapVersion::V1, MapVersion::V2] {
        assert_eq!(rejects(v, |w| w.set(0x800, 0)), MapError::ZeroSize);
    }
}

#[test]
fn error_delete_not_present() {
    for v in [MapVersion::V1, MapVersion::V2] {
        assert_eq!(
            rejects(v, |w| w.delete(0x204)),
            MapError::NotPresent { start: 0x204 }
        );
        assert_eq!(
            rejects(v, |w| w.delete(0x800)),
            MapError::NotPresent { start: 0x800 }
        );
        assert_eq!(
            rejects(v, |w| w.delete(0x300)),
            MapError::NotPresent { start: 0x300 }
        );
    }
}

#[test]
fn error_store_too_small() {
    let words = VecWords::new(3);
    assert_eq!(
        MapWriter::with_store(MapVersion::V1, 0x400, words).err(),
        Some(MapError::StoreTooSmall)
    );
}

#[test]
fn lookups_beyond_the_map_find_nothing() {
    let mut w = writer(MapVersion::V2, 0x1000);
    w.set(0xF00, 0x100).unwrap();
    for addr in [0x1000, 0x1100, u64::MAX, 1 << 40] {
        assert_eq!(w.map().find(addr), None);
    }
}

#[test]
fn set_allocated_keeps_the_constant_time_checks() {
    for v in [MapVersion::V1, MapVersion::V2] {
        assert_eq!(
            rejects(v, |w| w.set_allocated(0x204, 4)),
            MapError::BucketOccupied {
                start: 0x204,
                existing: 0x200
            }
        );
        assert_eq!(
            rejects(v, |w| w.set_allocated(0x802, 4)),
            MapError::Misaligned { start: 0x802 }
        );
        assert_eq!(
            rejects(v, |w| w.set_allocated(0xFF0, 0x20)),
            MapError::OutOfRange {
                start: 0xFF0,
                size: 0x20
            }
        );
        assert_eq!(
            rejects(v, |w| w.set_allocated(0x800, 0)),
            MapError::ZeroSize
        );
    }
    assert_eq!(
        rejects(MapVersion::V2, |w| w.set_allocated(0x440, 0x10)),
        MapError::Overlap {
            start: 0x440,
            existing: 0x200
        }
    );
    let mut w = writer(MapVersion::V2, 0x1000);
    w.set_allocated(304, 1024).unwrap();
    assert_eq!(
        words(&w),
        vec![(1, 0x0500_0000), (2, 0x139), (3, 0x139), (4, 0x139)]
    );
}

#[test]
fn untouched_words_cost_nothing() {
    // 1 GiB of code span: 16 MiB of map words, reserved but not committed.
    let mut w = MapWriter::with_huge_pages(MapVersion::V2, 1 << 30, false).unwrap();
    assert_eq!(w.map().words().resident_bytes().unwrap(), 0);
    w.set(0x1234_5600, 0x800).unwrap();
    assert_eq!(
        w.map().words().resident_bytes().unwrap(),
        4096,
        "one page of words"
    );
}
