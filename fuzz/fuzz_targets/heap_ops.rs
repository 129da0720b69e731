//! Reserve, publish, abort, free, move and find on a real `CodeHeap` (v1 or v2,
//! RWX, W^X or flip) against a model: every lookup is exact.
#![no_main]

use arbitrary::Arbitrary;
use jitmap::heap::{BlockKind, JitKind, StubKind};
use jitmap::{CodeHeap, CodeInfo, CodeRef, Domain, HeapConfig, HeapError, MapVersion, MemoryMode};
use jitmap_testkit::model::MapModel;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Op {
    Reserve { size: u16, align_log: u8 },
    Publish { index: u8 },
    PublishStub { index: u8, kind: u8 },
    Abort { index: u8 },
    Free { index: u8 },
    DoubleFree { index: u8 },
    Move { index: u8 },
    Find { offset: u32 },
    FindInside { index: u8, offset: u16 },
    Reclaim,
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
            Op::Publish { index } if !pending.is_empty() => {
                let r = pending.swap_remove(usize::from(index) % pending.len());
                let code = r
                    .publish(CodeInfo::new(
                        next_id,
                        format!("m{next_id}"),
                        JitKind::Baseline,
                    ))
                    .unwrap();
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
                heap.base().wrapping_add(offset as usize),
            ),
            Op::FindInside { index, offset } if !live.is_empty() => {
                let (code, ..) = live[usize::from(index) % live.len()];
                check(
                    &heap,
                    &reader,
                    &live,
                    code.start() + usize::from(offset) % (code.size() as usize + 32),
                );
            }
            Op::Reclaim => {
                heap.try_reclaim();
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
    drop(held);
});

fn check(heap: &CodeHeap, reader: &jitmap::Reader, live: &[(CodeRef, u64, bool)], ip: usize) {
    let guard = reader.pin().unwrap();
    let expected = live
        .iter()
        .find(|(c, ..)| ip >= c.start() && ip < c.start() + c.size() as usize)
        .map(|&(c, id, stub)| (c.start(), (ip - c.start()) as u64, id, stub));
    let found = heap.find(&guard, ip).unwrap().map(|b| match b.kind() {
        BlockKind::Method(h) => (b.start(), b.offset(), h.method_id(), false),
        BlockKind::Stub(k) => (b.start(), b.offset(), u64::from(k.get()), true),
    });
    assert_eq!(found, expected, "ip {ip:#x}");
}
