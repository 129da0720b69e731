//! x86-64 encodings (System V).

/// `mov eax, value; ret`.
pub fn returns(value: u16) -> Vec<u8> {
    let mut code = vec![0xB8];
    code.extend_from_slice(&u32::from(value).to_le_bytes());
    code.push(0xC3);
    code
}

/// Rewrites the immediate of a [`returns`] body.
pub fn set_returned(code: &mut [u8], value: u16) {
    code[1..5].copy_from_slice(&u32::from(value).to_le_bytes());
}

/// `mov rcx, n; l: dec rcx; jnz l; mov eax, value; ret` (`n` ≥ 1).
pub fn spin_then_return(n: u64, value: u16) -> Vec<u8> {
    let mut code = vec![0x48, 0xB9];
    code.extend_from_slice(&n.to_le_bytes());
    code.extend_from_slice(&[0x48, 0xFF, 0xC9, 0x75, 0xFB]);
    code.extend_from_slice(&returns(value));
    code
}

/// `xor eax, eax; mov ecx, count; l: add eax, step; dec ecx; jnz l; ret`
/// (`count` ≥ 1, `step` < 128).
pub fn add_loop(count: u16, step: u8) -> Vec<u8> {
    let mut code = vec![0x31, 0xC0, 0xB9];
    code.extend_from_slice(&u32::from(count).to_le_bytes());
    code.extend_from_slice(&[0x83, 0xC0, step, 0xFF, 0xC9, 0x75, 0xF9, 0xC3]);
    code
}

/// `pause; mov rax, cell; jmp qword ptr [rax]`. The `pause` (it pushes
/// nothing) holds the thread in the stub for tens of cycles, so that a
/// sampling profiler's samples land in it and not only around it: without
/// it, the eBPF trampoline test saw 2 to 11 of 4,000 samples there on one
/// machine, against 500 on another.
pub fn jump_through(cell: usize) -> Vec<u8> {
    let mut code = vec![0xF3, 0x90, 0x48, 0xB8];
    code.extend_from_slice(&(cell as u64).to_le_bytes());
    code.extend_from_slice(&[0xFF, 0x20]);
    code
}

/// `int3` in every byte.
pub fn trap_fill(code: &mut [u8]) {
    code.fill(0xCC);
}

/// `push rbp; mov rbp, rsp; mov rax, target; call rax; pop rbp; ret`: calls
/// `target` with its own argument, inside a frame-pointer frame.
pub fn call_in_frame(target: usize) -> Vec<u8> {
    let mut code = vec![0x55, 0x48, 0x89, 0xE5, 0x48, 0xB8];
    code.extend_from_slice(&(target as u64).to_le_bytes());
    code.extend_from_slice(&[0xFF, 0xD0, 0x5D, 0xC3]);
    code
}

/// The DWARF numbers of the stack pointer, the frame pointer and the
/// return address column, for test CFI.
pub const DWARF_SP_FP_RA: [gimli::Register; 3] =
    [gimli::X86_64::RSP, gimli::X86_64::RBP, gimli::X86_64::RA];

/// The CFA at a function's first instruction, from the stack pointer.
pub const ENTRY_CFA: i32 = 8;

/// The CFI of [`call_in_frame`] (the rows of `frameless::FRAME_POINTER_CFI`):
/// `push rbp` (1 byte), `mov rbp, rsp` (3), `mov rax, imm64` (10), `call rax`
/// (2), `pop rbp` at 16, `ret` at 17.
pub const CALL_IN_FRAME_CFI: crate::frameless::Cfi = crate::frameless::FRAME_POINTER_CFI;

/// `fn(flag: *const u64)`: spins until `*flag` is not zero.
/// `l: pause; mov rax, [rdi]; test rax, rax; jz l; ret`
pub fn spin_until_set() -> Vec<u8> {
    vec![
        0xF3, 0x90, 0x48, 0x8B, 0x07, 0x48, 0x85, 0xC0, 0x74, 0xF6, 0xC3,
    ]
}
