//! x86-64: `movabs r11, cell; jmp [r11]`, and rel32 fields.
//!
//! r11 is a scratch register in the System V ABI, never an argument, so the
//! jump passes every argument and the return address (on the stack)
//! through untouched.

use cranelift_codegen::binemit::Reloc;

use super::Site;

/// The trampoline's size in bytes.
pub(crate) const TRAMPOLINE_LEN: usize = 13;

/// Calls reach ±2 GiB, the whole heap (`MAX_SPAN`): no veneers.
pub(crate) const VENEER_LEN: usize = 0;

/// The trampoline that jumps through the cell at `cell`:
/// `49 BB imm64` (`movabs r11, cell`), `41 FF 23` (`jmp qword ptr [r11]`).
pub(crate) fn trampoline(cell: usize) -> [u8; TRAMPOLINE_LEN] {
    let mut code = [0u8; TRAMPOLINE_LEN];
    code[..2].copy_from_slice(&[0x49, 0xBB]);
    code[2..10].copy_from_slice(&(cell as u64).to_le_bytes());
    code[10..].copy_from_slice(&[0x41, 0xFF, 0x23]);
    code
}

/// Writes an x86-64 relocation; `None` refuses it (out of reach, past the
/// end, or a kind a non-PIC JIT never needs).
pub(crate) fn patch(kind: Reloc, mut site: Site<'_>) -> Option<()> {
    match kind {
        Reloc::X86PCRel4 | Reloc::X86CallPCRel4 => {
            let value = i32::try_from(site.what - site.at).ok()?;
            site.write(site.offset, &value.to_le_bytes())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_trampoline_loads_the_cell_and_jumps_through_it() {
        let code = super::trampoline(0x1122_3344_5566_7788);
        assert_eq!(
            code,
            [
                0x49, 0xBB, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, 0x41, 0xFF, 0x23
            ]
        );
    }
}
