//! aarch64: `ldr x16, <literal>; ldr x16, [x16]; br x16`, `bl` with
//! veneers, and ADRP pairs.
//!
//! x16 (IP0) is the intra-procedure-call scratch register of AAPCS64: linkers
//! put veneers and PLT entries in it, so no caller expects it kept and no
//! argument is passed in it. `br` leaves x30, the return address, as the
//! caller's `bl` set it.

use cranelift_codegen::binemit::Reloc;

use super::Site;

/// The trampoline's size in bytes: three instructions, a `nop` so that the
/// literal is 8-aligned, and the literal.
pub(crate) const TRAMPOLINE_LEN: usize = 24;

/// A veneer: `ldr x16, #8; br x16; .quad target`.
pub(crate) const VENEER_LEN: usize = 16;

/// `ldr x16, #16` (the literal four instructions on).
const LDR_X16_LITERAL_16: u32 = 0x5800_0090;
/// `ldr x16, #8`.
const LDR_X16_LITERAL_8: u32 = 0x5800_0050;
/// `ldr x16, [x16]`.
const LDR_X16_X16: u32 = 0xF940_0210;
/// `br x16`.
const BR_X16: u32 = 0xD61F_0200;
/// `nop`.
const NOP: u32 = 0xD503_201F;

/// The trampoline that jumps through the cell at `cell`.
pub(crate) fn trampoline(cell: usize) -> [u8; TRAMPOLINE_LEN] {
    let mut code = [0u8; TRAMPOLINE_LEN];
    for (i, word) in [LDR_X16_LITERAL_16, LDR_X16_X16, BR_X16, NOP]
        .into_iter()
        .enumerate()
    {
        code[4 * i..4 * i + 4].copy_from_slice(&word.to_le_bytes());
    }
    code[16..].copy_from_slice(&(cell as u64).to_le_bytes());
    code
}

/// A `bl`/`b` offset in words, if it fits the 26-bit field (±128 MiB).
fn branch26(from: i64, to: i64) -> Option<u32> {
    let delta = to.checked_sub(from)?;
    if delta % 4 != 0 || !(-(1 << 27)..(1 << 27)).contains(&delta) {
        return None;
    }
    Some(((delta >> 2) as u32) & 0x03FF_FFFF)
}

/// Writes an aarch64 relocation; `None` refuses it (out of reach with no
/// veneer room left, past the end, or a kind a non-PIC JIT never needs: the
/// GOT pairs and TLS descriptors).
pub(crate) fn patch(kind: Reloc, mut site: Site<'_>) -> Option<()> {
    let inst = site.word(site.offset)?;
    let inst = match kind {
        Reloc::Arm64Call => match branch26(site.at, site.what) {
            Some(imm26) => inst | imm26,
            None => {
                // Farther than a branch reaches: through a veneer in the
                // room reserved after the function's code.
                let veneer = *site.veneer;
                let mut bytes = [0u8; VENEER_LEN];
                bytes[..4].copy_from_slice(&LDR_X16_LITERAL_8.to_le_bytes());
                bytes[4..8].copy_from_slice(&BR_X16.to_le_bytes());
                bytes[8..].copy_from_slice(&(site.what as u64).to_le_bytes());
                site.write(veneer, &bytes)?;
                *site.veneer = veneer + VENEER_LEN;
                inst | branch26(site.at, site.base + veneer as i64)?
            }
        },
        Reloc::Aarch64AdrPrelPgHi21 => {
            // The 4 KiB page delta, in 21 bits (±4 GiB): immlo in bits 29-30,
            // immhi in bits 5-23.
            let pages = (site.what >> 12) - (site.at >> 12);
            if !(-(1 << 20)..(1 << 20)).contains(&pages) {
                return None;
            }
            let pages = pages as u32;
            inst | (pages & 3) << 29 | ((pages >> 2) & 0x7_FFFF) << 5
        }
        Reloc::Aarch64AddAbsLo12Nc => inst | ((site.what as u32) & 0xFFF) << 10,
        _ => return None,
    };
    site.write(site.offset, &inst.to_le_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site<'a>(code: &'a mut [u8], veneer: &'a mut usize, offset: usize, what: i64) -> Site<'a> {
        Site {
            code,
            offset,
            at: 0x10_0000 + offset as i64,
            what,
            veneer,
            base: 0x10_0000,
        }
    }

    #[test]
    fn the_trampoline_loads_the_cell_and_jumps_through_it() {
        let code = trampoline(0x1122_3344_5566_7788);
        assert_eq!(
            code,
            [
                0x90, 0x00, 0x00, 0x58, 0x10, 0x02, 0x40, 0xF9, 0x00, 0x02, 0x1F, 0xD6, 0x1F, 0x20,
                0x03, 0xD5, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11
            ]
        );
    }

    #[test]
    fn a_near_call_is_a_direct_branch_and_a_far_one_goes_through_a_veneer() {
        const BL: u32 = 0x9400_0000;
        let mut code = [0u8; 8 + 2 * VENEER_LEN];
        code[..4].copy_from_slice(&BL.to_le_bytes());
        code[4..8].copy_from_slice(&BL.to_le_bytes());
        let mut veneer = 8;
        // 1 MiB back: imm26 = -0x40000 words.
        patch(Reloc::Arm64Call, site(&mut code, &mut veneer, 0, 0)).unwrap();
        assert_eq!(code[..4], (BL | 0x03FC_0000).to_le_bytes());
        assert_eq!(veneer, 8);
        // 1 GiB on: through the veneer at offset 8, two words on from the call.
        let far = 0x4000_0000 + 0x10_0000;
        patch(Reloc::Arm64Call, site(&mut code, &mut veneer, 4, far)).unwrap();
        assert_eq!(code[4..8], (BL | 1).to_le_bytes());
        assert_eq!(code[8..12], LDR_X16_LITERAL_8.to_le_bytes());
        assert_eq!(code[12..16], BR_X16.to_le_bytes());
        assert_eq!(code[16..24], (far as u64).to_le_bytes());
        assert_eq!(veneer, 24);
        // No veneer room left: refused.
        let mut small = [0u8; 4];
        let mut none = 4;
        assert!(patch(Reloc::Arm64Call, site(&mut small, &mut none, 0, far)).is_none());
    }

    #[test]
    fn an_adrp_pair_names_the_page_and_its_offset() {
        const ADRP_X0: u32 = 0x9000_0000;
        const ADD_X0_X0: u32 = 0x9100_0000;
        let mut code = [0u8; 8];
        code[..4].copy_from_slice(&ADRP_X0.to_le_bytes());
        code[4..].copy_from_slice(&ADD_X0_X0.to_le_bytes());
        let mut veneer = 8;
        // Five pages and 0x123 on from the page of 0x10_0000: immlo = 1, immhi = 1.
        let target = 0x10_0000 + 5 * 4096 + 0x123;
        patch(
            Reloc::Aarch64AdrPrelPgHi21,
            site(&mut code, &mut veneer, 0, target),
        )
        .unwrap();
        patch(
            Reloc::Aarch64AddAbsLo12Nc,
            site(&mut code, &mut veneer, 4, target),
        )
        .unwrap();
        assert_eq!(code[..4], (ADRP_X0 | 1 << 29 | 1 << 5).to_le_bytes());
        assert_eq!(code[4..], (ADD_X0_X0 | 0x123 << 10).to_le_bytes());
        // Past ±4 GiB: refused; so are the GOT pair and TLS.
        let far = 0x10_0000 + (5i64 << 32);
        assert!(
            patch(
                Reloc::Aarch64AdrPrelPgHi21,
                site(&mut code, &mut veneer, 0, far)
            )
            .is_none()
        );
        assert!(
            patch(
                Reloc::Aarch64AdrGotPage21,
                site(&mut code, &mut veneer, 0, 0)
            )
            .is_none()
        );
        assert!(
            patch(
                Reloc::Aarch64TlsDescCall,
                site(&mut code, &mut veneer, 0, 0)
            )
            .is_none()
        );
    }
}
