//! Reserve, publish, abort, free, move and find on a real `CodeHeap` (v1 or v2,
//! RWX, W^X or flip) against a model: every lookup is exact, names every
//! method by its own name (names of 0 to 300 bytes share the heap's arena and
//! reuse freed slots), and a forged reference is refused without a change.
#![no_main]

use arbitrary::Arbitrary;
use jitmap::heap::{BlockKind, JitKind, StubKind};
use jitmap::{CodeHeap, CodeInfo, CodeRef, Domain, HeapConfig, HeapError, MapVersion, MemoryMode};
use jitmap_testkit::model::MapModel;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Op {
    Reserve {
        size: u16,
        align_log: u8,
    },
    Publish {
        index: u8,
        name_len: u16,
    },
    PublishStub {
        index: u8,
        kind: u8,
    },
    Abort {
        index: u8,
    },
    Free {
        index: u8,
    },
    DoubleFree {
        index: u8,
    },
    Move {
        index: u8,
    },
    Find {
        offset: u32,
    },
    FindInside {
        index: u8,
        offset: u16,
    },
    Reclaim,
    Forge {
        index: u8,
        start: i8,
        size: i8,
        generation: i8,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    v2: bool,
    wx: bool,
    flip: bool,
    huge: bool,
    pin: bool,
    ops: Vec<Op>,
}

const SPAN: u64 = 4 << 20;

fuzz_target!(|input: Input| {
    let domain = Domain::new(2);
    let config = HeapConfig {
        span: SPAN,
        version: if input.v2 {
            MapVersion::V2
        } else {
            MapVersion::V1
        },
        mode: match (input.wx, input.flip) {
            (_, true) => MemoryMode::FlipOnPublish,
            (true, false) => MemoryMode::WriteXorExecute,
            (false, false) => MemoryMode::Rwx,
        },
        align: 16,
        huge_pages: input.huge,
        ..HeapConfig::default()
    };
    let heap = CodeHeap::new(config, &domain).unwrap();
    let reader = domain.register().unwrap();
    // A guard held across the run delays every reclamation but changes no answer.
    let held = input.pin.then(|| reader.pin().unwrap());
    let mut pending = Vec::new();
    // (ref, method id or stub kind, is_stub)
    let mut live: Vec<(CodeRef, u64, bool)> = Vec::new();
    // Method id → its name.
    let mut names = std::collections::HashMap::new();
    // Freed references, with the new start of the moved ones.
    let mut freed: Vec<(CodeRef, Option<usize>)> = Vec::new();
    let mut next_id = 1u64;
    for op in input.ops.iter().take(200) {
        match *op {
            Op::Reserve { size, align_log } => {
                let align = 1u64 << (align_log % 14);
                match heap.reserve_aligned(u64::from(size), align) {
                    Ok(mut r) => {
                        assert_eq!(r.address() % align.max(8) as usize, 0);
                        r.code_mut().fill(0xCC);
                        pending.push(r);
                    }
                    Err(HeapError::ZeroSize) => assert_eq!(size, 0),
                    Err(HeapError::BadAlignment { .. }) => assert!(!(8..=4096).contains(&align)),
                    Err(HeapError::HeapFull { .. }) => {}
                    Err(e) => panic!("unexpected {e:?}"),
                }
            }
            Op::Publish { index, name_len } if !pending.is_empty() => {
                let r = pending.swap_remove(usize::from(index) % pending.len());
                let name = name_of(next_id, usize::from(name_len) % 301);
                let code = r
                    .publish(CodeInfo::new(next_id, name.clone(), JitKind::Baseline))
                    .unwrap();
                names.insert(next_id, name);
                live.push((code, next_id, false));
                next_id += 1;
            }
            Op::PublishStub { index, kind } if !pending.is_empty() => {
                let r = pending.swap_remove(usize::from(index) % pending.len());
                // A bad kind is refused when it is made; the reservation is
                // then aborted, as a failed publish would give it back.
                match StubKind::try_from(kind) {
                    Ok(stub) => live.push((r.publish_stub(stub).unwrap(), u64::from(kind), true)),
                    Err(e) => {
                        assert_eq!(e, HeapError::BadStubKind { kind });
                        r.abort();
                    }
                }
            }
            Op::Abort { index } if !pending.is_empty() => {
                pending
                    .swap_remove(usize::from(index) % pending.len())
                    .abort();
            }
            Op::Free { index } if !live.is_empty() => {
                let (code, ..) = live.swap_remove(usize::from(index) % live.len());
                heap.free(code).unwrap();
                freed.push((code, None));
            }
            Op::DoubleFree { index } if !freed.is_empty() => {
                let (code, moved_to) = freed[usize::from(index) % freed.len()];
                let start = code.start();
                assert_eq!(
                    heap.free(code),
                    Err(match moved_to {
                        Some(to) => HeapError::Moved { start, to },
                        None => HeapError::DoubleFree { start },
                    })
                );
            }
            Op::Move { index } if !live.is_empty() => {
                let i = usize::from(index) % live.len();
                let (code, id, stub) = live[i];
                match heap.move_block(code) {
                    Ok(moved) => {
                        assert!(!stub);
                        live[i] = (moved, id, false);
                        freed.push((code, Some(moved.start())));
                    }
                    Err(HeapError::NotAMethod { .. }) => assert!(stub),
                    Err(HeapError::HeapFull { .. }) => {}
                    Err(e) => panic!("unexpected {e:?}"),
                }
            }
            Op::Find { offset } => check(
                &heap,
                &reader,
                &live,
                &names,
                heap.base().wrapping_add(offset as usize),
            ),
            Op::FindInside { index, offset } if !live.is_empty() => {
                let (code, ..) = live[usize::from(index) % live.len()];
                check(
                    &heap,
                    &reader,
                    &live,
                    &names,
                    code.start() + usize::from(offset) % (code.size() as usize + 32),
                );
            }
            Op::Reclaim => {
                heap.try_reclaim();
            }
            Op::Forge {
                index,
                start,
                size,
                generation,
            } if !live.is_empty() && (start, size, generation) != (0, 0, 0) => {
                let (code, ..) = live[usize::from(index) % live.len()];
                let [heap_id, at, len, generation_now] = code.to_raw();
                let forged = CodeRef::from_raw([
                    heap_id,
                    at.wrapping_add_signed(i64::from(start)),
                    len.wrapping_add_signed(i64::from(size)),
                    generation_now.wrapping_add_signed(i64::from(generation)),
                ]);
                // Another live block's very reference is no forgery.
                if live.iter().any(|(c, ..)| *c == forged) {
                    continue;
                }
                let before = heap.stats();
                match heap.free(forged) {
                    Err(
                        HeapError::UnknownRef { .. }
                        | HeapError::DoubleFree { .. }
                        | HeapError::Moved { .. },
                    ) => {}
                    other => panic!("{forged:?} from {code:?}: {other:?}"),
                }
                assert_eq!(heap.stats(), before);
            }
            _ => {}
        }
    }
    let stats = heap.stats();
    assert_eq!(stats.live_blocks, live.len());
    // Canonical form: the heap's map words are exactly those of a map rebuilt from
    // the live blocks (freed blocks are unpublished at once, even while retired).
    let mut model = MapModel::new(heap.span());
    for (code, ..) in &live {
        model.insert((code.start() - heap.base()) as u64, code.size());
    }
    let version = if input.v2 {
        MapVersion::V2
    } else {
        MapVersion::V1
    };
    let expected: Vec<(usize, u32)> = model
        .canonical_words(version)
        .into_iter()
        .enumerate()
        .filter(|&(_, w)| w != 0)
        .collect();
    assert_eq!(heap.map().nonzero_words().collect::<Vec<_>>(), expected);
    // The listing: every live block with its reference and, for a method,
    // its id and name.
    let mut listed: Vec<(CodeRef, Option<(u64, String)>)> = heap
        .live_blocks()
        .into_iter()
        .map(|b| (b.code, b.info.map(|i| (i.method_id, i.name.clone()))))
        .collect();
    let mut modelled: Vec<(CodeRef, Option<(u64, String)>)> = live
        .iter()
        .map(|&(code, id, stub)| (code, (!stub).then(|| (id, names[&id].clone()))))
        .collect();
    listed.sort_by_key(|(c, _)| c.start());
    modelled.sort_by_key(|(c, _)| c.start());
    assert_eq!(listed, modelled);
    drop(held);
});

/// A name of `len` bytes that differs from method to method.
fn name_of(id: u64, len: usize) -> String {
    format!("{id}:").chars().cycle().take(len).collect()
}

fn check(
    heap: &CodeHeap,
    reader: &jitmap::Reader,
    live: &[(CodeRef, u64, bool)],
    names: &std::collections::HashMap<u64, String>,
    ip: usize,
) {
    let guard = reader.pin().unwrap();
    let expected = live
        .iter()
        .find(|(c, ..)| ip >= c.start() && ip < c.start() + c.size() as usize)
        .map(|&(c, id, stub)| (c.start(), (ip - c.start()) as u64, id, stub));
    let found = heap.find(&guard, ip).unwrap().map(|b| match b.kind() {
        BlockKind::Method(h) => {
            assert_eq!(h.name(), names[&h.method_id()], "ip {ip:#x}");
            (b.start(), b.offset(), h.method_id(), false)
        }
        BlockKind::Stub(k) => (b.start(), b.offset(), u64::from(k.get()), true),
    });
    assert_eq!(found, expected, "ip {ip:#x}");
}
