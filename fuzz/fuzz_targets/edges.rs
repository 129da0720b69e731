//! Sizes, spans, alignments, addresses and image bases near the edges of their
//! types and of the address space: every call returns exactly the expected value
//! or typed error, and never panics or overflows.
#![no_main]

use arbitrary::Arbitrary;
use jitmap::heap::PREFIX;
use jitmap::image::{ImageError, ImageInfo};
use jitmap::manager::ManagerError;
use jitmap::range::RangeError;
use jitmap::{CodeInfo, ExecutionManager, HeapConfig, HeapError, JitKind, Lookup, MapVersion};
use libfuzzer_sys::fuzz_target;

/// A number near an edge: zero, the type's maximum, or a power of two.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Near {
    Zero(u16),
    Max(u16),
    Pow2 { bit: u8, delta: i16 },
    Raw(u64),
}

impl Near {
    fn value(self) -> u64 {
        match self {
            Self::Zero(d) => u64::from(d),
            Self::Max(d) => u64::MAX - u64::from(d),
            Self::Pow2 { bit, delta } => (1u64 << (bit % 64)).wrapping_add(delta as i64 as u64),
            Self::Raw(x) => x,
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Op {
    Reserve {
        size: Near,
        align: Near,
    },
    /// A reservation `delta` bytes short of (or past) the largest one.
    ReserveTop {
        delta: i16,
        align_log: u8,
    },
    Find {
        addr: Near,
    },
    FindNearHeap {
        delta: i32,
        from_end: bool,
    },
    Image {
        base: Near,
        size: Near,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    span: Near,
    v2: bool,
    ops: Vec<Op>,
}

/// Heaps larger than this are created and checked, then replaced by a small one
/// for the operations (filling gigabytes per input would make the target slow).
const OPS_SPAN: u64 = 16 << 20;

fuzz_target!(|input: Input| {
    let page = 4096u64;
    let manager = ExecutionManager::new(2);
    let version = if input.v2 {
        MapVersion::V2
    } else {
        MapVersion::V1
    };
    let config = |span| HeapConfig {
        span,
        version,
        huge_pages: false,
        ..HeapConfig::default()
    };
    let span = input.span.value();
    let rounded = span.checked_next_multiple_of(page);
    let valid = span != 0 && rounded.is_some_and(|r| r < 1 << 32);
    let heap = match manager.create_heap(config(span)) {
        Ok(heap) => {
            assert!(valid, "span {span:#x} accepted");
            assert_eq!(heap.span(), rounded.unwrap());
            if heap.span() <= OPS_SPAN {
                heap
            } else {
                drop(heap);
                manager.create_heap(config(OPS_SPAN)).unwrap()
            }
        }
        Err(ManagerError::Heap(HeapError::BadSpan { span: s })) => {
            assert!(!valid && s == span, "span {span:#x} refused");
            manager.create_heap(config(1 << 20)).unwrap()
        }
        Err(e) => panic!("span {span:#x}: {e:?}"),
    };
    let (base, span) = (heap.base(), heap.span());
    let reader = manager.register_reader().unwrap();
    let mut images = Vec::new();
    for op in input.ops.iter().take(64) {
        let reserve = match *op {
            Op::Reserve { size, align } => Some((size.value(), align.value())),
            Op::ReserveTop { delta, align_log } => Some((
                (span - PREFIX).wrapping_add(delta as i64 as u64),
                1u64 << (align_log % 16),
            )),
            _ => None,
        };
        if let Some((size, align)) = reserve {
            let result = heap.reserve_aligned(size, align);
            let bad_align = !align.is_power_of_two() || !(8..=page).contains(&align);
            match result {
                Err(HeapError::ZeroSize) => assert_eq!(size, 0),
                Err(HeapError::TooLarge { size: s, max }) => {
                    assert_eq!((s, max), (size, span - PREFIX));
                    assert!(size > max && size != 0);
                }
                Err(HeapError::BadAlignment { align: a }) => {
                    assert!(bad_align && a == align && size != 0 && size <= span - PREFIX)
                }
                Err(HeapError::HeapFull { .. }) => assert!(!bad_align && size <= span - PREFIX),
                Err(e) => panic!("reserve({size:#x}, {align:#x}): {e:?}"),
                Ok(mut r) => {
                    assert!(size != 0 && size <= span - PREFIX && !bad_align);
                    let start = r.address();
                    assert_eq!(start % align as usize, 0);
                    assert!(start >= base + PREFIX as usize);
                    assert!(start as u64 + size <= (base as u64) + span);
                    let code = r.code_mut();
                    code[0] = 0xC3;
                    let last = code.len() - 1;
                    code[last] = 0xC3;
                    let published = r
                        .publish(CodeInfo::new(7, "edge", JitKind::Optimized))
                        .unwrap();
                    let g = manager.pin(&reader).unwrap();
                    for (ip, offset) in [(start, 0), (start + size as usize - 1, size - 1)] {
                        let b = g.find(ip).expect("inside the block");
                        assert_eq!((b.start(), b.offset()), (start, offset));
                    }
                    assert!(g.find(start + size as usize).is_none());
                    assert!(g.find(start - 1).is_none());
                    drop(g);
                    heap.free(published).unwrap();
                }
            }
            continue;
        }
        match *op {
            Op::Find { addr } => {
                let ip = addr.value() as usize;
                let g = manager.pin(&reader).unwrap();
                let inside_image = images
                    .iter()
                    .any(|&(b, s): &(usize, usize)| ip >= b && ip - b < s);
                // Nothing is live in the heap between operations, and the images
                // have no functions: every address resolves to nothing.
                assert!(g.find(ip).is_none());
                assert!(matches!(g.classify(ip), Lookup::Nothing));
                let in_heap = ip.wrapping_sub(base) < span as usize;
                assert_eq!(g.section(ip).is_some(), in_heap || inside_image, "{ip:#x}");
                assert!(g.find_return_address(ip).is_none());
            }
            Op::FindNearHeap { delta, from_end } => {
                let edge = if from_end { base + span as usize } else { base };
                let ip = edge.wrapping_add(delta as isize as usize);
                let g = manager.pin(&reader).unwrap();
                assert!(heap.find(&g, ip).unwrap().is_none());
                assert!(g.find(ip).is_none());
            }
            Op::Image { base: b, size } => {
                let (b, size) = (b.value() as usize, size.value() as usize);
                let result = manager.load_image(ImageInfo {
                    base: b,
                    size,
                    ..ImageInfo::default()
                });
                let end = b.checked_add(size);
                let overlaps = |s: usize, e: usize| {
                    let heap_overlap = s < base + span as usize && base < e;
                    heap_overlap || images.iter().any(|&(ib, is)| s < ib + is && ib < e)
                };
                match result {
                    Err(ManagerError::Image(ImageError::Empty)) => assert_eq!(size, 0),
                    Err(ManagerError::Image(ImageError::TooLarge { size: s })) => {
                        assert!(s == size && size as u64 > 1 << 32)
                    }
                    Err(ManagerError::Range(RangeError::OutOfRange { begin, end: e })) => {
                        assert_eq!(begin, b);
                        match end {
                            None => assert_eq!(e, usize::MAX),
                            Some(end) => assert!(end == e && (end - 1) >> 57 != 0),
                        }
                    }
                    Err(ManagerError::Range(RangeError::Overlap { begin, .. })) => {
                        assert_eq!(begin, b);
                        assert!(overlaps(b, end.unwrap()));
                    }
                    Err(e) => panic!("image {b:#x}+{size:#x}: {e:?}"),
                    Ok(at) => {
                        let end = end.unwrap();
                        assert_eq!(at, b);
                        assert!(size != 0 && size as u64 <= 1 << 32 && (end - 1) >> 57 == 0);
                        assert!(!overlaps(b, end));
                        images.push((b, size));
                    }
                }
                if images.len() > 4 {
                    let (first, _) = images.remove(0);
                    manager.unload_image(first).unwrap();
                }
            }
            _ => {}
        }
    }
    for (b, _) in images {
        manager.unload_image(b).unwrap();
    }
    assert_eq!(
        manager.unload_image(base),
        Err(ManagerError::NotAnImage { base })
    );
});
