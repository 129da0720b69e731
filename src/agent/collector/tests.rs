//! The collector's unit tests, kept beside it for its private state.

use super::*;

use crate::JitKind;
use crate::agent::record::{FrameKind, RawFrame};
use crate::events::{CodeEvent, CodeListener};

use super::events::LogEntry;

/// Ten versions, each sampled once into a stack of its own with `i + 1`
/// samples; the first is optimized, the rest baseline.
fn sampled(max_versions: usize) -> (Collector, Vec<BlockId>) {
    let infos: Vec<Arc<CodeInfo>> = (0..10u64)
        .map(|i| {
            let kind = if i == 0 {
                JitKind::Optimized
            } else {
                JitKind::Baseline
            };
            Arc::new(CodeInfo::new(i, format!("m{i}"), kind))
        })
        .collect();
    let keys: Vec<BlockId> = (1..=10)
        .map(|generation| BlockId {
            heap: 1,
            generation,
        })
        .collect();
    let live = infos
        .into_iter()
        .zip(&keys)
        .enumerate()
        .map(|(i, (info, &key))| (info, key, 0x1000 * (i + 1), 64));
    let mut c = Collector::new(false, max_versions, live, Vec::new());
    for (i, &key) in keys.iter().enumerate() {
        let m = c.method_of(key).unwrap();
        c.stacks
            .insert(vec![FrameKey::Native(0), FrameKey::Jit(m)], i as u64 + 1);
    }
    (c, keys)
}

/// A version is known by the block it was first known in: one listed
/// before the agent listened, moved twice, then freed through its third
/// block, is marked freed under its first, every placement names it,
/// and no alias outlives the free. (Its info's `Arc` is no identity: a
/// heap makes a fresh one for each event of a plain method.)
#[test]
fn moves_and_frees_reach_the_version_through_its_blocks() {
    let block = |generation| BlockId {
        heap: 7,
        generation,
    };
    let info = Arc::new(CodeInfo::new(42, "m", JitKind::Baseline));
    let mut c = Collector::new(false, 16, [(info, block(1), 0x1000, 64)], Vec::new());
    for (from, to, start, at_ns) in [(1, 2, 0x2000, 10), (2, 3, 0x3000, 20)] {
        c.apply(LogEntry::Moved {
            from: block(from),
            to: block(to),
            start,
            at_ns,
            tag: at_ns,
            unpublished_ns: at_ns + 1,
        });
    }
    assert_eq!(c.aliases.get(&block(3)), Some(&block(1)));
    assert_eq!(c.aliases.len(), 1);
    c.apply(LogEntry::Freed {
        block: block(3),
        tag: 99,
        at_ns: u64::MAX,
    });
    let known = &c.known[&block(1)];
    assert_eq!((known.start, known.freed), (0x3000, Some(99)));
    assert!(c.aliases.is_empty());
    for (start, at_ns) in [(0x1000, 5), (0x2000, 15), (0x3000, 25)] {
        assert_eq!(
            c.placed_at(start, at_ns, at_ns),
            Some(block(1)),
            "{start:#x}"
        );
        assert_eq!(
            c.occupant_at(start + 8, at_ns),
            Some((block(1), start)),
            "{start:#x}"
        );
    }
    let m = c.method_of(block(1)).unwrap();
    assert_eq!(
        (c.methods[m].method_id, c.methods[m].name.as_str()),
        (42, "m")
    );
    // Every placement left; once their tags are safe, all is forgotten.
    assert_eq!(c.leaving.len(), 3);
    c.forget(100);
    assert!(c.occupants.is_empty() && c.known.is_empty() && c.leaving.is_empty());
    // A free of a block never known changes nothing.
    c.apply(LogEntry::Freed {
        block: block(8),
        tag: 100,
        at_ns: u64::MAX,
    });
    assert!(c.known.is_empty() && c.occupants.is_empty());
}

/// A block published while the agent started is both in the listing and
/// announced by its load event: it is placed once, and forgotten whole
/// after its free. (On the old code the event placed it a second time,
/// and that placement never left: `occupants` kept it for good.)
#[test]
fn a_block_listed_and_announced_is_placed_once() {
    let key = BlockId {
        heap: 2,
        generation: 1,
    };
    let info = Arc::new(CodeInfo::new(7, "k", JitKind::Baseline));
    let mut c = Collector::new(
        false,
        16,
        [(Arc::clone(&info), key, 0x1000, 64)],
        Vec::new(),
    );
    c.apply(LogEntry::Loaded {
        block: key,
        info,
        start: 0x1000,
        size: 64,
        at_ns: 5,
    });
    assert_eq!(c.occupants[&0x1000].len(), 1);
    assert_eq!(c.known[&key].placements, 1);
    c.apply(LogEntry::Freed {
        block: key,
        tag: 9,
        at_ns: u64::MAX,
    });
    c.forget(10);
    assert!(c.occupants.is_empty() && c.known.is_empty() && c.leaving.is_empty());
}

/// A block published and then moved while the agent started: the
/// listing holds its new block, the log its load and its move. Each
/// copy is placed once, and after the free everything is forgotten.
/// (Before, the move placed the new block's bytes a second time, and
/// the listed entry was never freed.)
#[test]
fn a_block_moved_while_the_agent_started_is_forgotten_after_its_free() {
    let block = |generation| BlockId {
        heap: 2,
        generation,
    };
    let info = Arc::new(CodeInfo::new(7, "k", JitKind::Baseline));
    let mut c = Collector::new(
        false,
        16,
        [(Arc::clone(&info), block(2), 0x2000, 64)],
        Vec::new(),
    );
    c.apply(LogEntry::Loaded {
        block: block(1),
        info,
        start: 0x1000,
        size: 64,
        at_ns: 5,
    });
    c.apply(LogEntry::Moved {
        from: block(1),
        to: block(2),
        start: 0x2000,
        at_ns: 6,
        tag: 7,
        unpublished_ns: 7,
    });
    assert_eq!(
        (c.occupants[&0x1000].len(), c.occupants[&0x2000].len()),
        (1, 1)
    );
    c.apply(LogEntry::Freed {
        block: block(2),
        tag: 9,
        at_ns: u64::MAX,
    });
    c.forget(10);
    assert!(c.occupants.is_empty() && c.known.is_empty() && c.leaving.is_empty());
    assert!(c.aliases.is_empty());
}

/// A drained sample whose only frame is `kind` at `addr` (`key`: a JIT
/// frame's start), ended at `end_ns`.
fn one_frame(kind: FrameKind, addr: usize, key: u64, end_ns: u64) -> Pending {
    Pending {
        attempts: 0,
        native: None,
        tid: 1,
        begin_ns: end_ns,
        end_ns,
        weight: 1,
        frames: vec![RawFrame {
            kind,
            addr,
            key,
            offset: 0,
        }],
    }
}

/// A host that churns versions while a steady stream of samples waits
/// to be named (frames nothing names yet): each freed version is
/// forgotten once its grace period has passed, unless a waiting sample
/// has a frame in its bytes. (On the old code nothing was forgotten
/// while any sample waited: 1,000 versions stayed.)
#[test]
fn freed_versions_are_forgotten_while_other_samples_wait() {
    let block = |generation| BlockId {
        heap: 3,
        generation,
    };
    let mut c = Collector::new(false, 16, [], Vec::new());
    for g in 0..1000u64 {
        let start = 0x10_0000 + 0x100 * (g as usize % 4);
        c.apply(LogEntry::Loaded {
            block: block(g),
            info: Arc::new(CodeInfo::new(g, format!("v{g}"), JitKind::Baseline)),
            start,
            size: 64,
            at_ns: 10 * g,
        });
        c.apply(LogEntry::Freed {
            block: block(g),
            tag: g,
            at_ns: u64::MAX,
        });
        // Always one sample waiting, in a big method's bytes elsewhere
        // (a version-1 frame too deep for the handler's scan).
        c.pending = vec![one_frame(FrameKind::Unattributed, 0x90_0000, 0, 10 * g)];
        c.forget(g + 1);
    }
    assert_eq!((c.known.len(), c.occupants.len()), (0, 0));
    // A waiting sample in a freed version's bytes holds that version.
    c.apply(LogEntry::Loaded {
        block: block(5000),
        info: Arc::new(CodeInfo::new(9, "held", JitKind::Baseline)),
        start: 0x20_0000,
        size: 64,
        at_ns: 20_000,
    });
    c.apply(LogEntry::Freed {
        block: block(5000),
        tag: 2000,
        at_ns: u64::MAX,
    });
    c.pending = vec![one_frame(FrameKind::Unattributed, 0x20_0010, 0, 20_001)];
    c.forget(3000);
    assert_eq!(
        c.occupant_at(0x20_0010, 20_001),
        Some((block(5000), 0x20_0000))
    );
    c.pending.clear();
    c.forget(3000);
    assert_eq!((c.known.len(), c.occupants.len()), (0, 0));
}

/// A host that compacts 1,000 live methods 1,000 times: the collector
/// keeps one placement and one alias per method once each move's grace
/// period has passed. (On the old code each move left a placement
/// behind for as long as the method lived: a million.)
#[test]
fn compacting_live_methods_keeps_one_placement_each() {
    let mut c = Collector::new(false, 16, [], Vec::new());
    let mut generation = 0u64;
    let mut block = || {
        generation += 1;
        BlockId {
            heap: 4,
            generation,
        }
    };
    let mut current: Vec<BlockId> = Vec::new();
    for m in 0..1000usize {
        let b = block();
        c.apply(LogEntry::Loaded {
            block: b,
            info: Arc::new(CodeInfo::new(m as u64, "m", JitKind::Optimized)),
            start: 0x100_0000 + 0x40 * m,
            size: 0x40,
            at_ns: 1,
        });
        current.push(b);
    }
    let mut tag = 0;
    for round in 1..=1000usize {
        for (m, from) in current.iter_mut().enumerate() {
            let to = block();
            tag += 1;
            c.apply(LogEntry::Moved {
                from: *from,
                to,
                start: 0x100_0000 + 0x40 * m + (round % 2) * 0x10_0000,
                at_ns: 1 + round as u64,
                tag,
                unpublished_ns: 2 + round as u64,
            });
            *from = to;
        }
        c.forget(tag + 1);
        let placements: usize = c.occupants.values().map(Vec::len).sum();
        assert_eq!(
            (placements, c.aliases.len(), c.known.len()),
            (1000, 1000, 1000)
        );
    }
}

/// A sample in the old copy of a moved method, taken after the move,
/// names the moved method at the old copy's offset, until the move's
/// grace period ends; never a version that held those bytes before.
/// (On the old code only current starts were searched: the frame was
/// unattributed, or named the earlier version.)
#[test]
fn a_sample_in_a_moved_methods_old_copy_names_it() {
    let block = heap5_block;
    let mut c = Collector::new(false, 16, [], Vec::new());
    load(&mut c, 1, "earlier", 0x4000, 10);
    c.apply(LogEntry::Freed {
        block: block(1),
        tag: 1,
        at_ns: u64::MAX,
    });
    load(&mut c, 2, "moved", 0x4000, 20);
    c.apply(LogEntry::Moved {
        from: block(2),
        to: block(3),
        start: 0x8000,
        at_ns: 30,
        tag: 2,
        unpublished_ns: 31,
    });
    // Held in the old copy at 40 ns, after the move.
    c.pending = vec![one_frame(FrameKind::Unattributed, 0x4010, 0, 40)];
    c.forget(2);
    let sample = std::mem::take(&mut c.pending).remove(0);
    assert!(c.add(&sample, u64::MAX));
    let (keys, _) = c.stacks.iter().next().unwrap();
    let FrameKey::Jit(m) = keys[0] else {
        panic!("{keys:?}")
    };
    assert_eq!(c.methods[m].name, "moved");
    // Past the move's grace period the old copy is forgotten; the
    // method, live at its new start, is not.
    c.forget(3);
    assert_eq!(c.occupant_at(0x4010, 40), None);
    assert_eq!(c.occupant_at(0x8010, 40), Some((block(2), 0x8000)));
}

/// A move's old copy leaves at the tag the heap took after unpublishing
/// it (the event's), not at one the listener takes when the event
/// reaches it, which may be before the unpublish (then a handler pinned
/// later still finds the old copy, and the collector, having forgotten
/// its placement once that earlier tag was safe, never names it).
#[test]
fn a_moves_old_copy_leaves_at_the_tag_the_heap_retired_it_at() {
    let manager = ExecutionManager::new(2);
    for _ in 0..5 {
        manager.domain().retire_tag();
    }
    let log = Arc::new(EventLog::default());
    let listener = EventListener {
        log: Arc::clone(&log),
        manager: manager.clone(),
    };
    let block = |generation| BlockId {
        heap: 1,
        generation,
    };
    listener.on_event(&CodeEvent::Move(crate::events::CodeMove {
        timestamp: 30,
        tid: 7,
        old_block: block(1),
        new_block: block(2),
        old_start: 0x4000,
        new_start: 0x8000,
        size: 0x80,
        info: Arc::new(CodeInfo::new(1, "moved", JitKind::Optimized)),
        retire_tag: 2,
        unpublished: 33,
    }));
    let events = std::mem::take(&mut *log.events.lock());
    let [
        LogEntry::Moved {
            from,
            to,
            start,
            at_ns,
            tag,
            unpublished_ns,
        },
    ] = events.as_slice()
    else {
        panic!("one move expected");
    };
    assert_eq!(
        (*from, *to, *start, *at_ns, *tag, *unpublished_ns),
        (block(1), block(2), 0x8000, 30, 2, 33)
    );
}

/// A sample whose signal the kernel coalesced with others counts each
/// expiration: its stack, the periods and the coalesced count grow by
/// its weight; the samples by one.
#[test]
fn a_coalesced_signal_counts_every_period_it_stands_for() {
    let mut c = Collector::new(true, 16, [], Vec::new());
    c.open_window(0);
    let plain = one_frame(FrameKind::Native, 0x10, 0, 5);
    let coalesced = Pending {
        weight: 4,
        ..one_frame(FrameKind::Native, 0x10, 0, 6)
    };
    assert!(c.add(&plain, u64::MAX) && c.add(&coalesced, u64::MAX));
    assert_eq!((c.samples, c.periods), (2, 5));
    assert_eq!(c.stacks.values().copied().collect::<Vec<_>>(), [5]);
    assert_eq!(
        c.kept_samples.iter().map(|s| s.weight).collect::<Vec<_>>(),
        [1, 4]
    );
    let window = c.take_window(std::time::Duration::from_secs(1)).unwrap();
    assert_eq!(
        (window.samples, window.periods, window.coalesced()),
        (2, 5, 3)
    );
    assert_eq!(window.stacks[0].count, 5);
    let profile = c.finish(Profile::default());
    assert_eq!(
        (profile.samples, profile.periods, profile.coalesced()),
        (2, 5, 3)
    );
    assert_eq!(profile.summary()[0].self_share, 1.0);
}

/// An image unloaded while the agent started, and another loaded at
/// its base: the unload names the first by identity, so the second,
/// listed at the start and announced again, stays known. (On the old
/// code the unload, by base, marked the second unloaded.)
#[test]
fn an_unload_at_a_base_does_not_unload_the_newer_image_there() {
    let first = image(0x7000_0000, 1, "old");
    let second = image(0x7000_0000, 2, "new");
    let mut c = Collector::new(false, 16, [], vec![Arc::clone(&second)]);
    c.apply(LogEntry::ImageUnloaded {
        id: first.id(),
        tag: 1,
    });
    c.apply(LogEntry::ImageLoaded(Arc::clone(&second)));
    assert_eq!(c.images.len(), 1);
    assert_eq!(c.images[0].unloaded, None);
    c.forget(u64::MAX);
    assert!(c.name_image_method(0x7000_0010, 2, true));
    assert_eq!(c.image_names[&2], "new");
}

/// A sample whose JIT frame names a version the collector never heard
/// of, beside an unloaded image: it waits two passes for the version's
/// load event, then counts, its frame unattributed, as a sample that
/// gave up; the image, in none of its frames, is forgotten meanwhile.
/// (On the old code the sample waited for good, and the image was never
/// forgotten.)
#[test]
fn a_sample_of_a_version_never_heard_of_gives_up_on_its_third_pass() {
    let unloaded = image(0x7000_0000, 1, "gone");
    let mut c = Collector::new(false, 16, [], vec![Arc::clone(&unloaded)]);
    c.apply(LogEntry::ImageUnloaded {
        id: unloaded.id(),
        tag: 1,
    });
    let unknown = one_frame(FrameKind::Jit, 0x50_0010, 0x50_0000, 5);
    c.settle(&mut vec![unknown], u64::MAX);
    c.settle(&mut Vec::new(), u64::MAX);
    // Still waiting after two passes; the image, in none of its frames, is
    // forgotten.
    assert_eq!((c.pending.len(), c.images.len()), (1, 0));
    c.settle(&mut Vec::new(), u64::MAX);
    assert_eq!(c.pending.len(), 0);
    assert_eq!((c.samples, c.unattributed, c.gave_up), (1, 1, 1));
    assert_eq!(
        c.stacks
            .iter()
            .map(|(k, &n)| (k.clone(), n))
            .collect::<Vec<_>>(),
        [(vec![FrameKey::Unattributed], 1)]
    );
}

/// A steady stream of samples waiting for their events (here unattributed
/// frames in code nothing knows, each waiting [`WAIT_NS`]) does not keep an
/// unloaded image alive; a waiting sample with an image frame in it does.
/// (On the old code an image was kept while any sample waited: it stayed
/// for good.)
#[test]
fn an_unloaded_image_goes_while_samples_wait_unless_one_has_a_frame_in_it() {
    let gone = image(0x7000_0000, 1, "gone");
    let held = image(0x7100_0000, 2, "held");
    let mut c = Collector::new(false, 16, [], vec![Arc::clone(&gone), Arc::clone(&held)]);
    for unloaded in [&gone, &held] {
        c.apply(LogEntry::ImageUnloaded {
            id: unloaded.id(),
            tag: 1,
        });
    }
    // An image frame of a method id neither image has at its address: it
    // waits, holding `held`.
    // (Ended "in the future": they wait whatever the time the test takes.)
    let mut waiting = image_sample(9, 0x7100_0020, 0x7100_0020);
    waiting.end_ns = u64::MAX;
    c.settle(&mut vec![waiting], u64::MAX);
    for _ in 0..5 {
        c.settle(
            &mut vec![one_frame(FrameKind::Unattributed, 0x90_0000, 0, u64::MAX)],
            u64::MAX,
        );
    }
    assert_eq!(c.pending.len(), 6);
    let ids: Vec<u64> = c.images.iter().map(|k| k.image.id()).collect();
    assert_eq!(ids, [held.id()]);
}

#[inline(never)]
fn native_caller() -> usize {
    native_caller as *const () as usize
}

/// A sample still waiting when the agent stops keeps the frames that are
/// named: an unattributed leaf in code nothing knows, called from a native
/// function, gives that stack, and the sample did not give up on a version
/// it never heard of. (On the old code every frame of it became
/// `[unattributed]` and it counted as one that gave up.)
#[test]
fn a_sample_waiting_at_stop_keeps_its_named_frames() {
    let mut c = Collector::new(false, 16, [], Vec::new());
    let mut sample = one_frame(FrameKind::Unattributed, 0x90_0000, 0, u64::MAX);
    sample.frames.push(RawFrame {
        kind: FrameKind::Native,
        addr: native_caller() + 1,
        key: 0,
        offset: 0,
    });
    c.settle(&mut vec![sample], u64::MAX);
    assert_eq!(c.pending.len(), 1);
    let profile = c.finish(Profile::default());
    assert_eq!(
        (profile.samples, profile.unattributed, profile.gave_up),
        (1, 1, 0)
    );
    assert_eq!(profile.stacks.len(), 1);
    let frames = &profile.stacks[0].frames;
    assert_eq!((frames.len(), frames[0].as_str()), (2, "[unattributed]"));
    assert!(frames[1].ends_with("tests::native_caller"), "{frames:?}");
}

/// Rows made at the loader counts read after the previous drain hold for a
/// walk that ended before that read; a walk that ended after it may have
/// read the table after a `dlclose` and a `dlopen`, and is cut at its first
/// native step. (On the old code the handler's entry time was compared: a
/// walk that began before the read and ended after was kept whole.)
#[test]
fn native_rows_hold_for_walks_that_ended_before_the_counts_were_read() {
    let mut c = Collector::new(false, 16, [], Vec::new());
    let now = crate::agent::loader::counts();
    let before = (now.0.wrapping_sub(2), now.1);
    c.loader_seen = Some((before, 100));
    let sample = |begin_ns, end_ns| {
        let frame = |addr| RawFrame {
            kind: FrameKind::Native,
            addr,
            key: 0,
            offset: 0,
        };
        Pending {
            attempts: 0,
            native: Some(NativeRows {
                from: 0,
                loader: before,
                end: 0,
                record: 0,
            }),
            tid: 1,
            begin_ns,
            end_ns,
            weight: 1,
            frames: vec![frame(0x1000), frame(0x2000), frame(0x3000)],
        }
    };
    let mut drained = [sample(90, 95), sample(90, 110)];
    c.check_native_rows(&[], &mut drained);
    let depths: Vec<usize> = drained.iter().map(|s| s.frames.len()).collect();
    assert_eq!(depths, [3, 1]);
}

/// Block `generation` of heap 5.
fn heap5_block(generation: u64) -> BlockId {
    BlockId {
        heap: 5,
        generation,
    }
}

/// Applies the load of version `g` (block `g` of heap 5), named `name`,
/// 0x80 bytes at `start`, at `at_ns`.
fn load(c: &mut Collector, g: u64, name: &str, start: usize, at_ns: u64) {
    c.apply(LogEntry::Loaded {
        block: heap5_block(g),
        info: Arc::new(CodeInfo::new(g, name, JitKind::Optimized)),
        start,
        size: 0x80,
        at_ns,
    });
}

/// The names of the JIT versions the counted stacks' leaves are in, sorted.
fn jit_leaves(c: &Collector) -> Vec<&str> {
    let mut named: Vec<&str> = c
        .stacks
        .keys()
        .map(|keys| match keys[0] {
            FrameKey::Jit(m) => c.methods[m].name.as_str(),
            _ => panic!("{keys:?}"),
        })
        .collect();
    named.sort();
    named
}

/// A sample that found a moved method's new copy before the move's
/// event came (the heap sends it just after the copy is visible) is not
/// named by a version that left that start, freed or moved away, before
/// the sample began: it waits, and the event names it. One that began
/// before the version left may have found it, and names it. A sample that
/// ended less than [`WAIT_NS`] ago keeps waiting past its passes. (Before,
/// the freed version's placement answered, and the sample was billed to
/// it; a moved-away copy had no unpublish time, and answered too.)
#[test]
fn a_sample_in_a_new_copy_waits_for_its_move_not_for_a_version_that_left() {
    let b = heap5_block;
    for moved_away in [false, true] {
        let mut c = Collector::new(false, 16, [], Vec::new());
        load(&mut c, 1, "earlier", 0x8000, 10);
        // It leaves 0x8000 by 15.
        c.apply(if moved_away {
            LogEntry::Moved {
                from: b(1),
                to: b(4),
                start: 0x9000,
                at_ns: 12,
                tag: 1,
                unpublished_ns: 15,
            }
        } else {
            LogEntry::Freed {
                block: b(1),
                tag: 1,
                at_ns: 15,
            }
        });
        load(&mut c, 2, "moved", 0x4000, 20);
        // Moved to 0x8000 at 30, sampled there from 40, before the move's
        // event.
        let mut sample = one_frame(FrameKind::Jit, 0x8010, 0x8000, 45);
        sample.begin_ns = 40;
        c.settle(&mut vec![sample], 0);
        assert_eq!((c.pending.len(), c.samples), (1, 0), "{moved_away}");
        let mut before = one_frame(FrameKind::Jit, 0x8010, 0x8000, 14);
        before.begin_ns = 12;
        c.settle(&mut vec![before], 0);
        c.apply(LogEntry::Moved {
            from: b(2),
            to: b(3),
            start: 0x8000,
            at_ns: 30,
            tag: 2,
            unpublished_ns: 31,
        });
        c.settle(&mut Vec::new(), 0);
        assert_eq!((c.pending.len(), c.samples), (0, 2), "{moved_away}");
        assert_eq!(jit_leaves(&c), ["earlier", "moved"], "{moved_away}");
    }
    // A sample of unknown code that ended just now waits past its passes:
    // its event may still be on its way.
    let mut c = Collector::new(false, 16, [], Vec::new());
    let now = crate::events::monotonic_ns();
    c.settle(&mut vec![one_frame(FrameKind::Jit, 0xA010, 0xA000, now)], 0);
    c.settle(&mut Vec::new(), 0);
    c.settle(&mut Vec::new(), 0);
    assert_eq!((c.pending.len(), c.pending[0].attempts), (1, 3));
}

fn counts(c: &Collector) -> Vec<(String, u64, u64)> {
    let mut by_stack: Vec<(String, u64, u64)> = c
        .stacks
        .iter()
        .map(|(keys, &n)| {
            let FrameKey::Jit(m) = keys[1] else {
                unreachable!()
            };
            (c.methods[m].name.clone(), c.methods[m].merged, n)
        })
        .collect();
    by_stack.sort();
    by_stack
}

fn image(base: usize, id: u64, name: &str) -> Arc<ImageSection> {
    use crate::image::{ImageFunction, ImageInfo, ImageMethod};
    Arc::new(
        ImageSection::new(ImageInfo {
            base,
            size: 0x100,
            functions: vec![ImageFunction {
                begin: 0x10,
                end: 0x40,
                unwind: Box::new([]),
            }],
            methods: vec![ImageMethod {
                entry: 0x10,
                method_id: id,
                gc: None,
                debug: vec![],
                name: name.to_owned(),
            }],
            ..ImageInfo::default()
        })
        .unwrap(),
    )
}

/// A sample of image method `id`: its leaf at `leaf`, called from
/// `caller` in the same method.
fn image_sample(id: u64, leaf: usize, caller: usize) -> Pending {
    let frame = |addr| RawFrame {
        addr,
        key: id,
        offset: 0,
        kind: FrameKind::Image,
    };
    Pending {
        attempts: 0,
        native: None,
        tid: 1,
        begin_ns: 1,
        end_ns: 2,
        weight: 1,
        frames: vec![frame(leaf), frame(caller)],
    }
}

#[test]
fn image_methods_are_named_by_the_image_that_holds_them_at_the_address() {
    let base = 0x7000_0000;
    // An unloaded image and the one loaded at its base after it: each
    // names only its own method id. A return address (the caller's
    // frame) is looked up one byte back: 0x40 is the end of the method.
    let mut c = Collector::new(false, 16, [], vec![image(base, 1, "a::f")]);
    c.images[0].unloaded = Some(5);
    c.images.push(KnownImage {
        image: image(base, 2, "b::f"),
        unloaded: None,
    });
    assert!(c.add(&image_sample(1, base + 0x10, base + 0x40), u64::MAX));
    assert!(c.add(&image_sample(2, base + 0x3f, base + 0x11), u64::MAX));
    // A method id no image has there waits two passes for its image,
    // then stays unnamed.
    let mut unknown = image_sample(3, base + 0x20, base + 0x20);
    assert!(!c.add(&unknown, u64::MAX));
    unknown.attempts = 2;
    assert!(c.add(&unknown, u64::MAX));
    let stacks = named_stacks(
        &c.methods,
        &c.image_names,
        &c.stub_names,
        &c.names,
        &c.stacks,
    );
    let mut named: Vec<(Vec<String>, u64)> =
        stacks.into_iter().map(|s| (s.frames, s.count)).collect();
    named.sort();
    let v = |a: &str| vec![a.to_owned(), a.to_owned()];
    assert_eq!(
        named,
        [(v("[image method 3]"), 1), (v("a::f"), 1), (v("b::f"), 1)]
    );
}

#[test]
fn forgotten_versions_merge_by_tier_keeping_their_counts_and_no_others() {
    let (mut c, keys) = sampled(4);
    c.known.retain(|key, _| *key == keys[3] || *key == keys[7]);
    c.merge_retired();
    let names: Vec<&str> = c.methods.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "m3",
            "m7",
            "[retired optimized versions]",
            "[retired baseline versions]"
        ]
    );
    assert_eq!(
        counts(&c),
        [
            (
                "[retired baseline versions]".to_owned(),
                7,
                2 + 3 + 5 + 6 + 7 + 9 + 10
            ),
            ("[retired optimized versions]".to_owned(), 1, 1),
            ("m3".to_owned(), 0, 4),
            ("m7".to_owned(), 0, 8),
        ]
    );
    assert_eq!(c.known[&keys[3]].method, Some(0));
    assert_eq!(c.known[&keys[7]].method, Some(1));
}

#[test]
fn a_second_merge_joins_the_first_entries_and_stops_at_half_the_cap() {
    let (mut c, keys) = sampled(4);
    c.known
        .retain(|key, _| keys[..3].contains(key) || keys[8..].contains(key));
    // m3..m7 are forgotten; merging stops once 4 / 2 entries would remain
    // over the cap: 10 - 2 = 8 to go, but only 5 can.
    c.merge_retired();
    let names: Vec<&str> = c.methods.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(
        names,
        ["m0", "m1", "m2", "m8", "m9", "[retired baseline versions]"]
    );
    assert_eq!(c.methods[5].merged, 5);
    // Then m0 and m1 are forgotten too: m0 starts the optimized entry, m1
    // joins the baseline one.
    c.known.retain(|key, _| *key != keys[0] && *key != keys[1]);
    c.merge_retired();
    assert_eq!(
        counts(&c),
        [
            (
                "[retired baseline versions]".to_owned(),
                6,
                2 + 4 + 5 + 6 + 7 + 8
            ),
            ("[retired optimized versions]".to_owned(), 1, 1),
            ("m2".to_owned(), 0, 3),
            ("m8".to_owned(), 0, 9),
            ("m9".to_owned(), 0, 10),
        ]
    );
}

#[test]
fn versions_named_by_kept_samples_are_not_merged() {
    let (mut c, _) = sampled(4);
    c.known.clear();
    c.kept_samples.push(Sample {
        tid: 1,
        begin_ns: 0,
        end_ns: 0,
        weight: 1,
        frames: vec![SampleFrame::Jit {
            addr: 0x5010,
            method: 4,
            offset: 16,
        }],
    });
    c.merge_retired();
    let names: Vec<&str> = c.methods.iter().map(|m| m.name.as_str()).collect();
    // Eight of the nine forgotten go (10 - 4 / 2), the first sampled first.
    assert_eq!(
        names,
        [
            "m4",
            "m9",
            "[retired optimized versions]",
            "[retired baseline versions]"
        ]
    );
    assert_eq!(
        c.kept_samples[0].frames,
        [SampleFrame::Jit {
            addr: 0x5010,
            method: 0,
            offset: 16
        }]
    );
}

// Issue 67, item 6: until a million ticks had passed, a tick counted 1 ns: probe
// times were off by the counter's rate for the first 40 ms of a 25 MHz
// counter (Ampere Altra, Apple M1). The architecture's rate serves until
// calibration.
#[test]
fn a_counter_of_known_rate_converts_from_the_first_pass() {
    let (mut c, _) = sampled(4);
    assert_eq!(
        c.ns_per_tick,
        if cfg!(target_arch = "aarch64") {
            1e9 / crate::arch::tick_rate().unwrap() as f64
        } else {
            1.0
        }
    );
    c.clock_origin = (1_000, 5_000);
    c.ns_per_tick = ns_per_tick(Some(25_000_000));
    assert_eq!(c.ticks_to_ns(1_000 + 25_000), 5_000 + 1_000_000);
    // Before the origin: clamped, not wrapped.
    c.clock_origin = (1_000_000, 100);
    assert_eq!(c.ticks_to_ns(0), 0);
    assert_eq!(ns_per_tick(None), 1.0);
}

/// A window's profile carries the handlers' time on its own samples, those
/// that ended inside it, and not on the samples before or after it; the
/// whole profile carries every drained sample's (counted at the drain, so
/// not here).
#[test]
fn a_window_counts_the_handler_time_of_its_own_samples() {
    let mut c = Collector::new(false, 16, [], Vec::new());
    let timed = |begin_ns, end_ns| Pending {
        begin_ns,
        ..one_frame(FrameKind::Native, 0x10, 0, end_ns)
    };
    assert!(c.add(&timed(100, 130), u64::MAX));
    c.open_window(1_000);
    assert!(c.add(&timed(990, 1_007), u64::MAX));
    assert!(c.add(&timed(1_500, 1_750), u64::MAX));
    c.end_window(2_000);
    assert!(c.add(&timed(1_990, 2_500), u64::MAX));
    let window = c.take_window(std::time::Duration::from_secs(1)).unwrap();
    assert_eq!(window.samples, 2);
    assert_eq!(
        window.handler_time,
        std::time::Duration::from_nanos(17 + 250)
    );
}
