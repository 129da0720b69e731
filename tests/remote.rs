//! Readers of another process's memory, run against this process: every answer
//! is compared with the in-process manager's.

use std::cell::{Cell, RefCell};

use jitmap::heap::MemoryMode;
use jitmap::heap::StubKind;
use jitmap::remote::{
    self, Memory, MemoryImage, ProcessMemory, RemoteError, RemoteReader, RemoteSection, Resolution,
    SectionKind, Unknown,
};
use jitmap::{CodeInfo, CodeRef, ExecutionManager, HeapConfig, JitKind, MapVersion};
use jitmap_testkit::frameless::{FRAME_POINTER_CFI, eh_frame};

fn me() -> ProcessMemory {
    ProcessMemory::new(std::process::id() as i32)
}

fn reader() -> RemoteReader<ProcessMemory> {
    RemoteReader::new(me(), remote::descriptor_address()).unwrap()
}

/// A small deterministic generator (xorshift).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// A 1 MiB v2 heap of `manager`.
fn small_heap(manager: &ExecutionManager) -> jitmap::OwnedHeap {
    manager
        .create_heap(HeapConfig {
            span: 1 << 20,
            ..HeapConfig::default()
        })
        .unwrap()
}

/// Publishes method `id` of `size` bytes; every third one of 18 bytes or
/// more has an `.eh_frame`, and so unwind rows (descriptor layout 2).
fn publish(heap: &jitmap::CodeHeap, id: u64, size: u64) -> CodeRef {
    let mut r = heap.reserve(size).unwrap();
    r.code_mut().fill(0xCC);
    let mut info = CodeInfo::new(id, format!("m{id}"), JitKind::Optimized);
    if id.is_multiple_of(3) && size >= 18 {
        info.eh_frame = Some(jitmap::heap::EhFrame {
            frame: eh_frame(r.address(), size as u32, FRAME_POINTER_CFI),
            header: Box::new([]),
        });
    }
    r.publish(info).unwrap()
}

/// What the in-process manager says `ip` is, in the remote reader's terms.
fn expected(manager: &ExecutionManager, ip: usize) -> Resolution {
    let reader = manager.register_reader().unwrap();
    let guard = manager.pin(&reader).unwrap();
    let heap_id = manager
        .heaps()
        .iter()
        .find(|h| h.contains(ip))
        .map(|h| h.id());
    match guard.find(ip) {
        Some(block) if block.is_jit() => Resolution::Method(remote::RemoteMethod {
            heap_id: heap_id.unwrap(),
            start: block.start() as u64,
            offset: block.offset(),
            size: block.region().hot_size,
            method_id: block.method_id(),
            name: block.name().unwrap().to_string(),
            rows: block.unwind_rows().to_vec(),
        }),
        Some(block) => panic!("unexpected block {block:?}"),
        None => Resolution::Nothing,
    }
}

#[test]
fn every_byte_class_resolves_as_in_process_in_both_versions() {
    let manager = ExecutionManager::new(8);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut probes = Vec::new();
    for version in [MapVersion::V1, MapVersion::V2] {
        let heap = manager
            .create_heap(HeapConfig {
                span: 8 << 20,
                version,
                ..HeapConfig::default()
            })
            .unwrap();
        let mut live = Vec::new();
        for id in 0..600u64 {
            let size = 1 + rng.next() % if id % 50 == 0 { 200_000 } else { 3000 };
            live.push(publish(&heap, id, size));
            if rng.next().is_multiple_of(4) {
                let victim = live.swap_remove((rng.next() % live.len() as u64) as usize);
                heap.free(victim).unwrap();
            }
        }
        for code in &live {
            let (s, n) = (code.start(), code.size() as usize);
            probes.extend([s, s + n / 2, s + n - 1, s + n, s.wrapping_sub(1)]);
        }
        for _ in 0..2000 {
            probes.push(heap.base() + (rng.next() % heap.span()) as usize);
        }
        std::mem::forget(heap);
    }
    let reader = reader();
    let mut methods = 0;
    let mut with_rows = 0;
    let mut too_far = 0;
    for &ip in &probes {
        let got = reader.resolve(ip as u64).unwrap();
        let want = expected(&manager, ip);
        // In v1, the capped walk gives up 1,024 words (256 KiB) back: inside a
        // large method, or in free space far past the last start.
        if got == Resolution::Unknown(Unknown::TooFar) {
            let heaps = manager.heaps();
            let heap = heaps.iter().find(|h| h.contains(ip)).unwrap();
            assert_eq!(heap.map().version(), MapVersion::V1);
            match want {
                Resolution::Method(m) => assert!(m.offset >= 255 * 1024, "{m:?}"),
                other => assert_eq!(other, Resolution::Nothing),
            }
            too_far += 1;
            continue;
        }
        assert_eq!(got, want, "ip {ip:#x}");
        methods += usize::from(matches!(got, Resolution::Method(_)));
        with_rows += usize::from(matches!(&got, Resolution::Method(m) if m.rows.len() == 4));
    }
    assert!(methods > 3000, "{methods}");
    // A third of the methods have four rows each, read as in process.
    assert!(with_rows > 800, "{with_rows}");
    // Only v1 probes can be too far: at most its 2,000 random ones plus those
    // in its large methods.
    assert!(too_far <= 2000 + 5 * 12, "{too_far}");
    let stats = reader.stats();
    assert_eq!(stats.lookups, probes.len() as u64);
}

/// Memory that runs a hook before each read: a writer changing the host at an
/// exact point of a lookup.
struct Hooked<'a> {
    inner: ProcessMemory,
    hook: RefCell<Box<dyn FnMut(u64) + 'a>>,
}

impl Memory for Hooked<'_> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), RemoteError> {
        (self.hook.borrow_mut())(addr);
        self.inner.read(addr, buf)
    }
}

#[test]
fn a_block_replaced_during_the_lookup_is_retried_not_mixed() {
    let manager = ExecutionManager::new(4);
    let heap = small_heap(&manager);
    let x = publish(&heap, 1, 600);
    let start = x.start() as u64;
    let prefix = start - 16;
    let live = Cell::new(Some(x));
    let replaced = Cell::new(0);
    let memory = Hooked {
        inner: me(),
        // Before the first read of the block's prefix: free X (600 bytes) and
        // publish Y (32 bytes) at the same start.
        hook: RefCell::new(Box::new(|addr| {
            if addr == prefix && replaced.get() == 0 {
                heap.free(live.take().unwrap()).unwrap();
                assert!(heap.try_reclaim() > 0);
                let y = publish(&heap, 2, 32);
                assert_eq!(y.start() as u64, start, "the allocator reuses the start");
                live.set(Some(y));
                replaced.set(1);
            }
        })),
    };
    let reader = RemoteReader::new(memory, remote::descriptor_address()).unwrap();
    // The start and end maps were read for X (address inside it), the prefix
    // is Y's: the attempt sees the heap's sequence move and starts again.
    // (Tests running beside this one change their own managers' maps, which
    // this reader also walks, so retries are counted at least.)
    assert_eq!(reader.resolve(start + 300).unwrap(), Resolution::Nothing);
    assert!(reader.stats().retries >= 1);
    match reader.resolve(start + 31).unwrap() {
        Resolution::Method(m) => assert_eq!((m.method_id, m.name.as_str(), m.size), (2, "m2", 32)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_host_that_never_stops_changing_gets_unknown() {
    let manager = ExecutionManager::new(4);
    let heap = small_heap(&manager);
    let x = publish(&heap, 1, 100);
    let start = x.start() as u64;
    let live = Cell::new(Some(x));
    let memory = Hooked {
        inner: me(),
        // Before every prefix read, the method moves and comes back.
        hook: RefCell::new(Box::new(|addr| {
            if addr == start - 16 {
                heap.free(live.take().unwrap()).unwrap();
                heap.try_reclaim();
                live.set(Some(publish(&heap, 1, 100)));
            }
        })),
    };
    let reader = RemoteReader::new(memory, remote::descriptor_address()).unwrap();
    assert_eq!(
        reader.resolve(start + 5).unwrap(),
        Resolution::Unknown(Unknown::Changing)
    );
    assert_eq!(reader.stats().retries, remote::RETRIES as u64);
}

#[test]
fn a_heap_dropped_during_the_lookup_is_nothing() {
    let manager = ExecutionManager::new(4);
    let heap = small_heap(&manager);
    let start = publish(&heap, 1, 100).start() as u64;
    let heap = RefCell::new(Some(heap));
    let memory = Hooked {
        inner: me(),
        hook: RefCell::new(Box::new(|addr| {
            if addr == start - 16 {
                drop(heap.borrow_mut().take());
            }
        })),
    };
    let reader = RemoteReader::new(memory, remote::descriptor_address()).unwrap();
    assert_eq!(reader.resolve(start + 5).unwrap(), Resolution::Nothing);
    assert!(reader.stats().retries >= 1);
}

#[test]
fn a_manager_dropped_during_the_lookup_is_retried_not_an_error() {
    let manager = ExecutionManager::new(4);
    let heap = manager
        .create_heap(HeapConfig {
            span: 1 << 20,
            ..HeapConfig::default()
        })
        .unwrap();
    let start = publish(&heap, 1, 100).start() as u64;
    // The heap holds the manager; dropping both drops the manager, its range
    // map and its descriptor entry in the middle of the lookup.
    let owned = RefCell::new(Some((heap, manager)));
    let memory = Hooked {
        inner: me(),
        hook: RefCell::new(Box::new(|addr| {
            if addr == start - 16 {
                drop(owned.borrow_mut().take());
            }
        })),
    };
    let reader = RemoteReader::new(memory, remote::descriptor_address()).unwrap();
    assert_eq!(reader.resolve(start + 5).unwrap(), Resolution::Nothing);
    assert!(reader.stats().retries >= 1);
}

/// A listed block: start, size, and for a method its id and name.
type Listed = (u64, u64, Option<(u64, String)>);

#[test]
fn listing_names_every_live_block_and_section() {
    let manager = ExecutionManager::new(4);
    let heaps: Vec<_> = [MapVersion::V1, MapVersion::V2]
        .into_iter()
        .map(|version| {
            manager
                .create_heap(HeapConfig {
                    span: 2 << 20,
                    version,
                    mode: MemoryMode::WriteXorExecute,
                    ..HeapConfig::default()
                })
                .unwrap()
        })
        .collect();
    let mut rng = Rng(7);
    for (h, heap) in heaps.iter().enumerate() {
        for id in 0..300u64 {
            if id % 10 == 3 {
                let r = heap.reserve(24).unwrap();
                r.publish_stub(StubKind::new(1 + (id % 15) as u8).unwrap())
                    .unwrap();
            } else {
                let code = publish(heap, 1000 * h as u64 + id, 1 + rng.next() % 2000);
                if id % 7 == 0 {
                    heap.free(code).unwrap();
                }
            }
        }
    }
    let reader = reader();
    let sections: Vec<RemoteSection> = reader
        .sections()
        .unwrap()
        .into_iter()
        .filter(|s| heaps.iter().any(|h| h.base() as u64 == s.begin))
        .collect();
    assert_eq!(sections.len(), 2);
    let mut heaps = heaps;
    heaps.sort_by_key(|h| h.base());
    for (section, heap) in sections.iter().zip(&heaps) {
        assert_eq!(
            (section.begin, section.end),
            (
                heap.base() as u64,
                (heap.base() + heap.span() as usize) as u64
            )
        );
        assert_eq!(
            section.kind,
            SectionKind::Heap {
                id: heap.id(),
                version: heap.map().version() as u8
            }
        );
        let want: Vec<Listed> = heap
            .live_blocks()
            .into_iter()
            .map(|b| {
                let info = b.info.map(|i| (i.method_id, i.name.clone()));
                (b.code.start() as u64, b.code.size(), info)
            })
            .collect();
        let got: Vec<Listed> = reader
            .blocks(section)
            .unwrap()
            .into_iter()
            .map(|r| match r {
                Resolution::Method(m) => (m.start, m.size, Some((m.method_id, m.name))),
                Resolution::Stub { start, size, .. } => (start, size, None),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(got, want);
        // 300 blocks, less the 43 multiples of 7 freed, except the 4 of them
        // (63, 133, 203, 273) that are stubs.
        assert_eq!(got.len(), 300 - 43 + 4);
    }
}

/// The descriptor's bytes as this process holds them.
fn descriptor_bytes() -> Vec<u8> {
    let mut bytes = vec![0u8; size_of::<remote::Descriptor>()];
    me().read(remote::descriptor_address(), &mut bytes).unwrap();
    bytes
}

#[test]
fn a_descriptor_is_checked_before_it_is_trusted() {
    let at = 0x10_0000;
    let good = descriptor_bytes();
    let mut image = MemoryImage::new();
    image.insert(at, good.clone()).unwrap();
    assert!(RemoteReader::new(&image, at).is_ok());
    // A version 1 host (before the unwind rows) is refused too.
    let cases: [(usize, u32, &str); 5] = [
        (0, 0x1234, "magic"),
        (8, 1, "layout version"),
        (12, 7, "descriptor size"),
        (16, 4, "pointer size"),
        (136, 24, "unwind row size"),
    ];
    for (offset, value, what) in cases {
        let mut bad = good.clone();
        bad[offset..offset + 4].copy_from_slice(&value.to_ne_bytes());
        let mut image = MemoryImage::new();
        image.insert(at, bad).unwrap();
        assert_eq!(
            RemoteReader::new(&image, at).unwrap_err(),
            RemoteError::BadDescriptor { what }
        );
    }
    assert!(matches!(
        RemoteReader::new(&MemoryImage::new(), at),
        Err(RemoteError::Unreadable {
            addr: 0x10_0000,
            ..
        })
    ));
}

#[test]
fn random_memory_behind_a_good_descriptor_never_misleads() {
    // A valid descriptor whose manager root leads into pages of random bytes,
    // with a few plausible pointers sprinkled in: every lookup must end in an
    // error or a definite answer, never a panic, a hang or unbounded reads.
    let at = 0x10_0000u64;
    let pages = 0x20_0000u64;
    let mut rng = Rng(0xDEAD_BEEF);
    for round in 0..300 {
        let mut descriptor = descriptor_bytes();
        let managers = std::mem::offset_of!(remote::Descriptor, managers);
        descriptor[managers..managers + 8].copy_from_slice(&pages.to_ne_bytes());
        let mut image = MemoryImage::new();
        image.insert(at, descriptor).unwrap();
        let mut page_bytes = vec![0u8; 16 * 4096];
        for chunk in page_bytes.chunks_exact_mut(8) {
            let r = rng.next();
            let value = match r % 4 {
                0 => 0,
                1 => pages + (r >> 8) % (16 * 4096) / 64 * 64,
                2 => pages + (r >> 8) % 16 * 4096,
                _ => rng.next(),
            };
            chunk.copy_from_slice(&value.to_ne_bytes());
        }
        image.insert(pages, page_bytes).unwrap();
        let reader = RemoteReader::new(&image, at).unwrap();
        for _ in 0..20 {
            let ip = pages + rng.next() % (1 << 24);
            let _ = reader.resolve(ip);
        }
        let _ = reader.sections();
        let stats = reader.stats();
        assert!(
            stats.max_reads <= 5000,
            "round {round}: {} reads",
            stats.max_reads
        );
    }
}

/// A manager's frameless stub kinds are in its descriptor entry's
/// `frameless` word, for walkers in other processes, and a manager that
/// takes a freed entry starts with none.
#[test]
fn frameless_kinds_are_published_beside_the_managers_entry() {
    use jitmap::heap::StubKind;
    use std::sync::atomic::Ordering;
    // Relaxed: this thread wrote the words it reads.
    let word = |i: usize| remote::jitmap_descriptor.frameless[i].load(Ordering::Relaxed);
    let manager = ExecutionManager::new(2);
    let Some(i) = manager.remote_index() else {
        panic!("every descriptor entry is taken");
    };
    assert_eq!(word(i), 0);
    manager.declare_frameless_stub(StubKind::new(3).unwrap());
    manager.declare_frameless_stub(StubKind::new(1).unwrap());
    assert_eq!(word(i), 0b1010);
    drop(manager);
    assert_eq!(word(i), 0);
}

/// A manager's names of its stub kinds are in its descriptor entry's
/// labels, where a reader in another process finds them beside each stub
/// it resolves; a manager that takes a freed entry starts with none.
#[test]
fn stub_kind_names_are_read_from_outside_beside_each_stub() {
    use jitmap::heap::StubKind;
    use jitmap::{ManagerError, StubKindName};
    let manager = ExecutionManager::new(2);
    let Some(index) = manager.remote_index() else {
        panic!("every descriptor entry is taken");
    };
    let heap = manager
        .create_heap(HeapConfig {
            span: 1 << 16,
            ..HeapConfig::default()
        })
        .unwrap();
    let (named, unnamed) = (StubKind::new(3).unwrap(), StubKind::new(15).unwrap());
    let trampoline = StubKindName::new("jitmap-tests", "trampoline").unwrap();
    manager.name_stub_kind(named, trampoline.clone()).unwrap();
    // Naming it again the same is nothing; otherwise refused, and the first
    // name stays, in process and outside.
    manager.name_stub_kind(named, trampoline.clone()).unwrap();
    assert_eq!(
        manager.name_stub_kind(named, StubKindName::new("jitmap-tests", "other").unwrap()),
        Err(ManagerError::StubKindNamed { kind: named })
    );
    let publish = |kind| {
        heap.reserve(16)
            .unwrap()
            .publish_stub(kind)
            .unwrap()
            .start()
    };
    let (at_named, at_unnamed) = (publish(named), publish(unnamed));
    let reader = reader();
    let stub = |at: usize| match reader.resolve(at as u64 + 4).unwrap() {
        Resolution::Stub { kind, name, .. } => (kind, name),
        other => panic!("{other:?}"),
    };
    assert_eq!(stub(at_named), (3, Some(trampoline.clone())));
    assert_eq!(stub(at_unnamed), (15, None));
    // Other tests' managers run beside this one: this one's names are
    // those under its root. Relaxed: this thread's manager took the
    // entry, so it reads its own store.
    let root =
        remote::jitmap_descriptor.managers[index].load(std::sync::atomic::Ordering::Relaxed) as u64;
    let ours: Vec<_> = reader
        .stub_names()
        .unwrap()
        .into_iter()
        .filter(|(r, _)| *r == root)
        .collect();
    assert_eq!(ours, [(root, vec![(3, trampoline)])]);
    drop(heap);
    drop(manager);
    // The freed entry's labels are zeros: the next manager there starts
    // unnamed.
    use std::sync::atomic::Ordering;
    for label in &remote::jitmap_descriptor.stub_labels[index] {
        // Relaxed: this thread cleared them.
        assert_eq!(label.lens.load(Ordering::Relaxed), 0);
        assert!(label.bytes.iter().all(|b| b.load(Ordering::Relaxed) == 0));
    }
}

#[test]
fn the_descriptor_layout_is_the_documented_one() {
    use remote::Descriptor as D;
    use std::mem::offset_of;
    // docs/descriptor.md, section 2.
    let offsets = [
        offset_of!(D, magic),
        offset_of!(D, layout_version),
        offset_of!(D, descriptor_size),
        offset_of!(D, pointer_size),
        offset_of!(D, levels),
        offset_of!(D, fanout),
        offset_of!(D, chunk_bits),
        offset_of!(D, address_bits),
        offset_of!(D, root_seq),
        offset_of!(D, fragment_size),
        offset_of!(D, fragment_begin),
        offset_of!(D, fragment_end),
        offset_of!(D, fragment_next),
        offset_of!(D, fragment_tag),
        offset_of!(D, tag_heap),
        offset_of!(D, tag_image),
        offset_of!(D, heap_base),
        offset_of!(D, heap_words),
        offset_of!(D, heap_ends),
        offset_of!(D, heap_word_count),
        offset_of!(D, heap_version),
        offset_of!(D, heap_seq),
        offset_of!(D, heap_id),
        offset_of!(D, prefix_bytes),
        offset_of!(D, prefix_size),
        offset_of!(D, prefix_slot),
        offset_of!(D, max_stub_kind),
        offset_of!(D, header_method_id),
        offset_of!(D, header_code_size),
        offset_of!(D, header_name_ptr),
        offset_of!(D, header_name_len),
        offset_of!(D, header_rows_ptr),
        offset_of!(D, header_rows_len),
        offset_of!(D, unwind_row_size),
        offset_of!(D, image_table),
        offset_of!(D, image_count),
        offset_of!(D, image_entry_size),
        offset_of!(D, entry_begin),
        offset_of!(D, entry_end),
        offset_of!(D, entry_delta),
        offset_of!(D, entry_name_len),
        offset_of!(D, entry_method_id),
        offset_of!(D, entry_name_ptr),
        offset_of!(D, stub_label_size),
        offset_of!(D, stub_label_bytes),
        offset_of!(D, max_managers),
        offset_of!(D, managers),
        offset_of!(D, frameless),
        offset_of!(D, stub_labels),
    ];
    let documented: Vec<usize> = (0..46)
        .map(|i| if i == 0 { 0 } else { 4 + 4 * i })
        .chain([192, 256, 288])
        .collect();
    assert_eq!(offsets.to_vec(), documented);
    assert_eq!(size_of::<D>(), 6048);
    let d = &remote::jitmap_descriptor;
    assert_eq!(d.magic.to_le_bytes(), *b"JITMAPD\0");
    assert_eq!(
        (
            d.layout_version,
            d.descriptor_size,
            d.pointer_size,
            d.levels,
            d.fanout
        ),
        (5, 6048, 8, 5, 256)
    );
    assert_eq!((d.stub_label_size, d.stub_label_bytes), (48, 44));
    assert_eq!(
        (
            d.chunk_bits,
            d.address_bits,
            d.prefix_bytes,
            d.max_stub_kind
        ),
        (17, 57, 16, 15)
    );
    assert_eq!((d.tag_heap, d.tag_image, d.max_managers), (0, 1, 8));
    // docs/descriptor.md, the image table's entries.
    assert_eq!(
        (
            d.image_entry_size,
            d.entry_begin,
            d.entry_end,
            d.entry_delta,
            d.entry_name_len,
            d.entry_method_id,
            d.entry_name_ptr
        ),
        (32, 0, 4, 8, 12, 16, 24)
    );
    // docs/descriptor.md, the unwind rows.
    use remote::UnwindRow as R;
    assert_eq!(d.unwind_row_size, 16);
    assert_eq!(
        [
            offset_of!(R, offset),
            offset_of!(R, cfa),
            offset_of!(R, ra),
            offset_of!(R, fp),
            offset_of!(R, kind),
            offset_of!(R, base),
            offset_of!(R, fp_rule),
            offset_of!(R, has_ra),
        ],
        [0, 4, 8, 10, 12, 13, 14, 15]
    );
}

/// An image of `methods` methods at random places: some with a funclet,
/// every fifth with a cold part at the end, a thunk range, gaps, and every
/// seventh method unnamed.
fn random_image(base: usize, methods: u32, rng: &mut Rng) -> jitmap::image::ImageInfo {
    use jitmap::image::{HotCold, ImageFunction, ImageInfo, ImageMethod};
    let f = |begin, end| ImageFunction {
        begin,
        end,
        unwind: Box::new([]),
    };
    let (mut functions, mut list, mut cold) = (Vec::new(), Vec::new(), Vec::new());
    let mut at = 0x40u32;
    for m in 0..methods {
        at += (rng.next() % 3) as u32 * 16;
        let size = 1 + (rng.next() % 200) as u32;
        list.push(ImageMethod {
            entry: at,
            method_id: 5000 + u64::from(m),
            gc: None,
            debug: vec![],
            name: if m.is_multiple_of(7) {
                String::new()
            } else {
                format!("image::m{m}")
            },
        });
        let main = functions.len() as u32;
        functions.push(f(at, at + size));
        at += size;
        if rng.next().is_multiple_of(4) {
            let funclet = 1 + (rng.next() % 40) as u32;
            functions.push(f(at, at + funclet));
            at += funclet;
        }
        if m.is_multiple_of(5) {
            cold.push(main);
        }
    }
    let thunks = at + 16..at + 80;
    at += 96;
    let mut hot_cold = Vec::new();
    for hot in cold {
        hot_cold.push(HotCold {
            cold: functions.len() as u32,
            hot,
        });
        let size = 1 + (rng.next() % 64) as u32;
        functions.push(f(at, at + size));
        at += size + 8;
    }
    ImageInfo {
        base,
        size: at as usize + 64,
        functions,
        methods: list,
        hot_cold,
        thunks: Some(thunks),
    }
}

#[test]
fn every_image_byte_resolves_to_its_named_method_as_in_process() {
    let manager = ExecutionManager::new(4);
    let base = 0x7200_0000_0000;
    let info = random_image(base, 150, &mut Rng(11));
    let size = info.size;
    manager.load_image(info).unwrap();
    let reader = reader();
    let me = manager.register_reader().unwrap();
    let (mut named, mut unnamed) = (0, 0);
    for rel in 0..size {
        let ip = base + rel;
        let guard = manager.pin(&me).unwrap();
        let want = match guard.classify(ip) {
            jitmap::Lookup::Method(block) => Some((
                block.method_id(),
                block.offset(),
                block.name().unwrap_or("").to_owned(),
            )),
            _ => None,
        };
        drop(guard);
        let Resolution::Image {
            begin,
            end,
            offset,
            method,
        } = reader.resolve(ip as u64).unwrap()
        else {
            panic!("{ip:#x} is not in the image");
        };
        assert_eq!(
            (begin, end, offset),
            (base as u64, (base + size) as u64, rel as u64)
        );
        let got = method.map(|m| {
            assert!(m.start <= ip as u64 && ip as u64 - m.start < m.size);
            (m.method_id, m.offset, m.name)
        });
        assert_eq!(got, want, "at {ip:#x}");
        match &got {
            Some((_, _, name)) if name.is_empty() => unnamed += 1,
            Some(_) => named += 1,
            None => {}
        }
    }
    assert!(named > 1000 && unnamed > 100, "{named} {unnamed}");
    // A binary search: at most 25 entry reads, the name, and the rest of a
    // lookup (managers, sequence twice, five levels, a fragment).
    assert!(
        reader.stats().max_reads <= 9 + 25 + 1,
        "{:?}",
        reader.stats()
    );
    manager.unload_image(base).unwrap();
    assert_eq!(
        reader.resolve(base as u64 + 0x40).unwrap(),
        Resolution::Nothing
    );
}
