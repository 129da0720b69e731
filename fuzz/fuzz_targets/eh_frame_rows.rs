//! A method's `.eh_frame` turned into its unwind rows at publish, on
//! arbitrary input: raw bytes, or one CIE and one FDE built from arbitrary
//! call-frame instructions at an arbitrary place in the method. Publish
//! never panics (it may refuse, with a typed error). The rows are sorted by
//! offset and inside the method; for a built FDE, the rule at every offset
//! agrees with gimli's own evaluation of the section at that address. The
//! same holds for the section evaluated as a loaded object's
//! (`jitmap::unwind::object_rows`, the eBPF walk's native rows), at an
//! address below 4 GiB.
#![no_main]

use std::cell::RefCell;

use arbitrary::Arbitrary;
use gimli::X86_64;
use jitmap::heap::EhFrame as JitEhFrame;
use jitmap::remote::UnwindRow;
use jitmap::unwind::object_rows;
use jitmap::{CodeInfo, ExecutionManager, JitKind, OwnedHeap};
use libfuzzer_sys::fuzz_target;

#[path = "common/cfi.rs"]
mod cfi;
#[path = "common/heap.rs"]
mod heap;
use cfi::{Instruction, build};
use heap::small_heap;

#[derive(Arbitrary, Debug)]
struct Input {
    /// The method's size, 1 to 4096 bytes.
    size: u16,
    frame: Frame,
}

#[derive(Arbitrary, Debug)]
enum Frame {
    /// The bytes as they come.
    Raw(Vec<u8>),
    /// One CIE and one FDE of `len` bytes starting `at` bytes into the code.
    Built {
        at: u8,
        len: u16,
        cie: Vec<Instruction>,
        fde: Vec<(u16, Instruction)>,
    },
}

thread_local! {
    static HEAP: RefCell<Option<(ExecutionManager, OwnedHeap)>> = const { RefCell::new(None) };
}

/// What gimli says the row at `addr` is, in the rows' terms: `None` where
/// no FDE covers it.
fn gimli_row(frame: &[u8], addr: u64) -> Option<UnwindRow> {
    use gimli::{BaseAddresses, CfaRule, RegisterRule, UnwindContext, UnwindSection};
    let section = gimli::EhFrame::new(frame, gimli::LittleEndian);
    let bases = BaseAddresses::default().set_eh_frame(frame.as_ptr() as u64);
    let mut context = UnwindContext::new();
    let unsupported = UnwindRow {
        kind: UnwindRow::UNSUPPORTED,
        ..UnwindRow::default()
    };
    let row = match section.unwind_info_for_address(
        &bases,
        &mut context,
        addr,
        gimli::EhFrame::cie_from_offset,
    ) {
        Ok(row) => row,
        Err(gimli::Error::NoUnwindInfoForAddress) => return None,
        // CFI gimli cannot evaluate: the walk must end there.
        Err(_) => return Some(unsupported),
    };
    let (base, cfa) = match *row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => {
            let base = match register {
                X86_64::RSP => UnwindRow::BASE_SP,
                X86_64::RBP => UnwindRow::BASE_FP,
                _ => return Some(unsupported),
            };
            match i32::try_from(offset) {
                Ok(cfa) => (base, cfa),
                Err(_) => return Some(unsupported),
            }
        }
        CfaRule::Expression(_) => return Some(unsupported),
    };
    let (has_ra, ra) = match row.register(X86_64::RA) {
        RegisterRule::Offset(n) => match i16::try_from(n) {
            Ok(n) => (1, n),
            Err(_) => return Some(unsupported),
        },
        RegisterRule::Undefined => (0, 0),
        _ => return Some(unsupported),
    };
    let (fp_rule, fp) = match row.register(X86_64::RBP) {
        RegisterRule::Undefined | RegisterRule::SameValue => (UnwindRow::FP_SAME, 0),
        RegisterRule::Offset(n) => match i16::try_from(n) {
            Ok(n) => (UnwindRow::FP_AT, n),
            Err(_) => return Some(unsupported),
        },
        _ => (UnwindRow::FP_LOST, 0),
    };
    Some(UnwindRow {
        offset: 0,
        cfa,
        ra,
        fp,
        kind: UnwindRow::RULE,
        base,
        fp_rule,
        has_ra,
    })
}

/// The row in force at `addr` among `rows` (sorted by offset), in
/// [`gimli_row`]'s terms: `None` where none gives a rule.
fn row_at(rows: &[UnwindRow], addr: u64) -> Option<UnwindRow> {
    rows.iter()
        .rev()
        .find(|r| u64::from(r.offset) <= addr)
        .filter(|r| r.kind != UnwindRow::NONE)
        .map(|r| UnwindRow { offset: 0, ..*r })
}

/// `frame` as a loaded object's rows: sorted, and for a built FDE (`fde`
/// bytes from `base`), gimli's rule at every byte of `size`.
fn check_object_rows(frame: &[u8], checked: Option<(u64, usize)>) {
    let Some(rows) = object_rows(frame, frame.as_ptr() as u64) else {
        assert!(checked.is_none(), "a built FDE below 4 GiB has rows");
        return;
    };
    assert!(
        rows.windows(2).all(|w| w[0].offset < w[1].offset),
        "object rows out of order: {rows:?}"
    );
    if let Some((base, size)) = checked {
        for addr in base..base + size as u64 {
            assert_eq!(
                row_at(&rows, addr),
                gimli_row(frame, addr),
                "at {addr:#x}: rows {rows:?}"
            );
        }
    }
}

fuzz_target!(|input: Input| {
    let size = usize::from(input.size % 4096) + 1;
    match &input.frame {
        Frame::Raw(bytes) => check_object_rows(bytes, None),
        Frame::Built { at, len, cie, fde } => {
            // An object's code at 64 KiB, the FDE `at` bytes in.
            let base = 0x1_0000;
            if let Some(frame) = build(base + u64::from(*at) % size as u64, *len, cie, fde) {
                check_object_rows(&frame, Some((base, size)));
            }
        }
    }
    HEAP.with(|cell| {
        let mut cell = cell.borrow_mut();
        let (manager, heap) = cell.get_or_insert_with(small_heap);
        let mut r = heap.reserve(size as u64).expect("the heap has room");
        r.code_mut().fill(0xCC);
        let start = r.address();
        let (frame, fde) = match &input.frame {
            Frame::Raw(bytes) => (bytes.clone(), None),
            Frame::Built { at, len, cie, fde } => {
                let at = u64::from(*at) % size as u64;
                match build(start as u64 + at, *len, cie, fde) {
                    Some(frame) => (frame, Some(at)),
                    None => {
                        r.abort();
                        return;
                    }
                }
            }
        };
        let info = CodeInfo {
            eh_frame: Some(JitEhFrame {
                frame: frame.into_boxed_slice(),
                header: Box::new([]),
            }),
            ..CodeInfo::new(1, "fuzzed", JitKind::Optimized)
        };
        let code = match r.publish(info) {
            Ok(code) => code,
            // A refusal is a typed error; the heap is unchanged.
            Err(_) => return,
        };
        {
            let reader = manager.register_reader().expect("a reader slot");
            let guard = manager.pin(&reader).expect("a pin");
            let block = guard.find(code.start()).expect("the method just published");
            let rows = block.unwind_rows();
            assert!(
                rows.windows(2).all(|w| w[0].offset < w[1].offset),
                "rows out of order: {rows:?}"
            );
            assert!(
                rows.iter().all(|r| (r.offset as usize) < size),
                "a row outside the method of {size} bytes: {rows:?}"
            );
            if let (Some(_), Some(eh)) = (fde, block.eh_frame()) {
                // The row in force at each offset is gimli's (none before the
                // FDE's start and after its end).
                for offset in 0..size {
                    let ours = rows
                        .iter()
                        .rev()
                        .find(|r| r.offset as usize <= offset)
                        .filter(|r| r.kind != UnwindRow::NONE)
                        .map(|r| UnwindRow { offset: 0, ..*r });
                    let theirs = gimli_row(&eh.frame, (start + offset) as u64);
                    assert_eq!(ours, theirs, "at offset {offset} of {size}: rows {rows:?}");
                }
            }
        }
        heap.free(code).expect("the method just published frees");
    });
});
