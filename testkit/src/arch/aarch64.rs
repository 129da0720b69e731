//! aarch64 encodings (AAPCS64), little-endian words.

/// `ret`.
const RET: u32 = 0xD65F_03C0;
/// `brk #0`.
const BRK: u32 = 0xD420_0000;

fn words(code: &[u32]) -> Vec<u8> {
    code.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// `movz w0, #value`.
fn movz_w0(value: u16) -> u32 {
    0x5280_0000 | u32::from(value) << 5
}

/// `movz w0, #value; ret`.
pub fn returns(value: u16) -> Vec<u8> {
    words(&[movz_w0(value), RET])
}

/// Rewrites the immediate of a [`returns`] body.
pub fn set_returned(code: &mut [u8], value: u16) {
    code[..4].copy_from_slice(&movz_w0(value).to_le_bytes());
}

/// `movz x9, #n0; movk x9, #n1, lsl 16; movk x9, #n2, lsl 32;
/// movk x9, #n3, lsl 48; l: subs x9, x9, #1; b.ne l; movz w0, #value; ret`
/// (`n` ≥ 1).
pub fn spin_then_return(n: u64, value: u16) -> Vec<u8> {
    let half = |i: u32| ((n >> (16 * i)) & 0xFFFF) as u32;
    let mut code = vec![0xD280_0009 | half(0) << 5];
    code.extend((1..4).map(|i| 0xF280_0009 | i << 21 | half(i) << 5));
    // subs x9, x9, #1; b.ne -4
    code.extend([0xF100_0529, 0x54FF_FFE1, movz_w0(value), RET]);
    words(&code)
}

/// `movz w0, #0; movz w9, #count; l: add w0, w0, #step; subs w9, w9, #1;
/// b.ne l; ret` (`count` ≥ 1).
pub fn add_loop(count: u16, step: u8) -> Vec<u8> {
    words(&[
        movz_w0(0),
        0x5280_0009 | u32::from(count) << 5,
        0x1100_0000 | u32::from(step) << 10,
        0x7100_0529,
        0x54FF_FFC1,
        RET,
    ])
}

/// `ldr x16, #16; ldr x16, [x16]; br x16; nop; .quad cell`: x16 is the
/// intra-procedure-call scratch register, never an argument.
pub fn jump_through(cell: usize) -> Vec<u8> {
    let mut code = words(&[0x5800_0090, 0xF940_0210, 0xD61F_0200, 0xD503_201F]);
    code.extend_from_slice(&(cell as u64).to_le_bytes());
    code
}

/// `brk #0` in every word (and zeros in a tail shorter than a word, which
/// no instruction can start in).
pub fn trap_fill(code: &mut [u8]) {
    for chunk in code.chunks_mut(4) {
        let n = chunk.len();
        chunk.copy_from_slice(&BRK.to_le_bytes()[..n]);
    }
}

/// `stp x29, x30, [sp, #-16]!; mov x29, sp; ldr x16, #16; blr x16;
/// ldp x29, x30, [sp], #16; ret; .quad target`: calls `target` with its own
/// argument, inside a frame record.
pub fn call_in_frame(target: usize) -> Vec<u8> {
    let mut code = words(&[
        0xA9BF_7BFD,
        0x9100_03FD,
        0x5800_0090,
        0xD63F_0200,
        0xA8C1_7BFD,
        RET,
    ]);
    code.extend_from_slice(&(target as u64).to_le_bytes());
    code
}

/// The DWARF numbers of the stack pointer, the frame pointer and the
/// return address column, for test CFI.
pub const DWARF_SP_FP_RA: [gimli::Register; 3] =
    [gimli::AArch64::SP, gimli::AArch64::X29, gimli::AArch64::X30];

/// The CFA at a function's first instruction, from the stack pointer.
pub const ENTRY_CFA: i32 = 0;

/// The CFI of [`call_in_frame`]: at entry CFA = sp (x30 holds the return
/// address); after the `stp` at 0 the record is at sp, CFA = sp + 16; after
/// `mov x29, sp` at 4, CFA = x29 + 16; after the `ldp` at 16, CFA = sp again.
pub const CALL_IN_FRAME_CFI: crate::frameless::Cfi = &[
    (0, false, 0, false),
    (4, false, 16, true),
    (8, true, 16, true),
    (20, false, 0, false),
];

/// `fn(flag: *const u64)`: spins until `*flag` is not zero.
/// `l: yield; ldr x1, [x0]; cbz x1, l; ret`
pub fn spin_until_set() -> Vec<u8> {
    words(&[0xD503_203F, 0xF940_0001, 0xB4FF_FFC1, RET])
}
