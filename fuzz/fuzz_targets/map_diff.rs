//! v1, v2 and a `BTreeMap` model under arbitrary set/delete/find sequences: exact
//! answers everywhere (each version's documented semantics outside blocks), and
//! canonical words after every operation.
#![no_main]

use arbitrary::Arbitrary;
use jitmap::map_words::VecWords;
use jitmap::nibble::words_for_span;
use jitmap::{MapVersion, MapWriter};
use jitmap_testkit::model::{MapModel, Verdict};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Op {
    Set { start: u16, size: u16 },
    Delete { start: u16 },
    DeleteLive { index: u8 },
    Find { addr: u16 },
}

#[derive(Arbitrary, Debug)]
struct Input {
    span_words: u8,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    let span = (u64::from(input.span_words) + 1) * 256;
    let mut model = MapModel::new(span);
    let new = |v| MapWriter::with_store(v, span, VecWords::new(words_for_span(span))).unwrap();
    let (mut v1, mut v2) = (new(MapVersion::V1), new(MapVersion::V2));
    for op in input.ops.iter().take(256) {
        match *op {
            Op::Set { start, size } => {
                let (start, size) = (u64::from(start), u64::from(size));
                match model.judge(start, size) {
                    Verdict::Hidden => continue,
                    Verdict::Valid => {
                        v1.set(start, size).unwrap();
                        v2.set(start, size).unwrap();
                        model.insert(start, size);
                    }
                    Verdict::Visible => {
                        assert!(v1.set(start, size).is_err());
                        assert!(v2.set(start, size).is_err());
                    }
                }
            }
            Op::Delete { start } => {
                let start = u64::from(start);
                let live = model.remove(start);
                assert_eq!(v1.delete(start).is_ok(), live);
                assert_eq!(v2.delete(start).is_ok(), live);
            }
            Op::DeleteLive { index } => {
                let live: Vec<u64> = model.live().keys().copied().collect();
                if let Some(&start) = live.get(usize::from(index) % live.len().max(1)) {
                    model.remove(start);
                    v1.delete(start).unwrap();
                    v2.delete(start).unwrap();
                }
            }
            Op::Find { addr } => {
                let addr = u64::from(addr);
                let (a1, a2) = (v1.map().find(addr), v2.map().find(addr));
                if let Some((start, _)) = model.containing(addr) {
                    assert_eq!((a1, a2), (Some(start), Some(start)));
                }
                assert_eq!(a1, model.expected(MapVersion::V1, addr));
                assert_eq!(a2, model.expected(MapVersion::V2, addr));
            }
        }
        for (v, w) in [(MapVersion::V1, &v1), (MapVersion::V2, &v2)] {
            let words: Vec<u32> = (0..w.map().word_count()).map(|i| w.map().word(i)).collect();
            assert_eq!(words, model.canonical_words(v));
        }
    }
});
