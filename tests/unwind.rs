//! Unwinding through JIT frames: a method's `.eh_frame`, registered with the
//! process's unwinder, lets a Rust panic raised in a function that JIT code
//! called unwind through the JIT frame to a `catch_unwind` above it.
use jitmap::heap::EhFrame as JitEhFrame;
use jitmap::info::InfoError;
use jitmap::{CodeHeap, CodeInfo, Domain, HeapConfig, HeapError, JitKind};
use jitmap_testkit::arch;
use jitmap_testkit::frameless::eh_frame;

/// Calls `target` inside a frame-pointer frame (a frame record on aarch64).
fn calls(target: usize) -> Vec<u8> {
    arch::call_in_frame(target)
}

extern "C-unwind" fn boom() {
    panic!("raised below a JIT frame");
}

fn heap(register_unwind: bool) -> CodeHeap {
    CodeHeap::new(
        HeapConfig {
            span: 1 << 20,
            register_unwind,
            ..HeapConfig::default()
        },
        &Domain::new(1),
    )
    .unwrap()
}

#[test]
fn a_panic_unwinds_through_a_jit_frame() {
    let heap = heap(true);
    let code = calls(boom as *const () as usize);
    let mut r = heap.reserve(code.len() as u64).unwrap();
    let start = r.address();
    r.code_mut().copy_from_slice(&code);
    let info = CodeInfo {
        eh_frame: Some(JitEhFrame {
            // [`calls`] keeps the frame-pointer convention.
            frame: eh_frame(start, code.len() as u32, arch::CALL_IN_FRAME_CFI),
            header: Box::new([]),
        }),
        ..CodeInfo::new(1, "calls_boom", JitKind::Optimized)
    };
    let published = r.publish(info).unwrap();
    // SAFETY: a complete C function with its unwind info registered; it
    // calls `boom`, whose panic unwinds through it.
    let jit: extern "C-unwind" fn() = unsafe { std::mem::transmute(start) };
    for _ in 0..3 {
        let caught = std::panic::catch_unwind(|| jit()).unwrap_err();
        assert_eq!(
            caught.downcast_ref::<&str>(),
            Some(&"raised below a JIT frame")
        );
    }
    // The registered address is absolute: such a method cannot move.
    assert_eq!(
        heap.move_block(published),
        Err(HeapError::PositionDependent { start })
    );
    heap.free(published).unwrap();
    assert!(
        heap.try_reclaim() > 0,
        "deregistered with the reclaimed header"
    );
}

#[test]
fn malformed_eh_frames_are_refused_before_registration() {
    let heap = heap(true);
    drop(heap.reserve(8).unwrap()); // commits the first pages
    let before = heap.stats();
    for (frame, offset) in [
        (vec![], 0),
        (vec![0, 0, 0, 0], 0),
        (vec![8, 0, 0, 0, 1, 2, 3], 0),
        (vec![4, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF], 8),
        (vec![2, 0, 0, 0, 9, 9], 0),
    ] {
        let mut r = heap.reserve(8).unwrap();
        r.code_mut().fill(0xC3);
        let info = CodeInfo {
            eh_frame: Some(JitEhFrame {
                frame: frame.into(),
                header: Box::new([]),
            }),
            ..CodeInfo::new(1, "bad", JitKind::Optimized)
        };
        assert_eq!(
            r.publish(info).err(),
            Some(HeapError::Info(InfoError::BadEhFrame { offset }))
        );
    }
    assert_eq!(heap.stats(), before);
    // Without registration the same bytes are just data for profilers.
    let plain = self::heap(false);
    let mut r = plain.reserve(8).unwrap();
    r.code_mut().fill(0xC3);
    let info = CodeInfo {
        eh_frame: Some(JitEhFrame {
            frame: vec![1, 2, 3].into(),
            header: Box::new([]),
        }),
        ..CodeInfo::new(1, "data", JitKind::Optimized)
    };
    let code = r.publish(info).unwrap();
    plain.move_block(code).unwrap();
}

/// A method's `.eh_frame` is evaluated at publish into the unwind rows the
/// agent's handler and the eBPF profiler step with, by offset from its code
/// start (the end of the FDE is the end of the code, so no end row).
#[test]
fn published_cfi_becomes_the_methods_unwind_rows() {
    use jitmap::remote::UnwindRow;
    let manager = jitmap::ExecutionManager::new(4);
    let heap = manager
        .create_heap(HeapConfig {
            span: 1 << 20,
            ..HeapConfig::default()
        })
        .unwrap();
    let body = arch::call_in_frame(0);
    let mut r = heap.reserve(body.len() as u64).unwrap();
    r.code_mut().copy_from_slice(&body);
    let frame = eh_frame(r.address(), body.len() as u32, arch::CALL_IN_FRAME_CFI);
    let code = r
        .publish(CodeInfo {
            eh_frame: Some(JitEhFrame {
                frame,
                header: Box::new([]),
            }),
            ..CodeInfo::new(1, "framed", JitKind::Optimized)
        })
        .unwrap();
    let reader = manager.register_reader().unwrap();
    let guard = manager.pin(&reader).unwrap();
    let block = guard.find(code.start()).unwrap();
    let rule = |offset, cfa, fp, base, fp_rule| UnwindRow {
        offset,
        cfa,
        ra: -8,
        fp,
        kind: UnwindRow::RULE,
        base,
        fp_rule,
        has_ra: UnwindRow::RA_AT,
    };
    let (sp, fp) = (UnwindRow::BASE_SP, UnwindRow::BASE_FP);
    let expected = if arch::ENTRY_CFA == 0 {
        // aarch64: at entry and at `ret` the CFA is sp and the return
        // address is in x30.
        let link = |offset| UnwindRow {
            offset,
            kind: UnwindRow::RULE,
            has_ra: UnwindRow::RA_LINK,
            ..UnwindRow::default()
        };
        [
            link(0),
            // After `stp x29, x30, [sp, #-16]!`.
            rule(4, 16, -16, sp, UnwindRow::FP_AT),
            // After `mov x29, sp`.
            rule(8, 16, -16, fp, UnwindRow::FP_AT),
            // After `ldp x29, x30, [sp], #16`, at `ret`.
            link(20),
        ]
    } else {
        [
            // At entry: the return address on top.
            rule(0, 8, 0, sp, UnwindRow::FP_SAME),
            // After `push rbp`.
            rule(1, 16, -16, sp, UnwindRow::FP_AT),
            // After `mov rbp, rsp`.
            rule(4, 16, -16, fp, UnwindRow::FP_AT),
            // After `pop rbp`, at `ret`.
            rule(17, 8, 0, sp, UnwindRow::FP_SAME),
        ]
    };
    assert_eq!(block.unwind_rows(), expected);
    // A method without `.eh_frame` has none.
    let mut r = heap.reserve(1).unwrap();
    r.code_mut()[0] = 0xC3;
    let plain = r
        .publish(CodeInfo::new(2, "plain", JitKind::Optimized))
        .unwrap();
    assert_eq!(guard.find(plain.start()).unwrap().unwind_rows(), []);
}
