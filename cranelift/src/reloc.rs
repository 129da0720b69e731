//! Applying a function's relocations to its bytes at their final address,
//! before the code is published (and so before anything can run it).

use cranelift_codegen::binemit::Reloc;
use cranelift_module::{ModuleReloc, ModuleRelocTarget};

use crate::JitError;
use crate::arch;

/// The veneer room a function with `relocs` reserves after its code, so
/// that every call that may be out of a branch's reach has one (aarch64's
/// `bl` reaches ±128 MiB; nothing on x86-64).
pub(crate) fn veneer_room(relocs: &[ModuleReloc]) -> usize {
    if arch::VENEER_LEN == 0 {
        return 0;
    }
    let calls = relocs.iter().filter(|r| r.kind == Reloc::Arm64Call).count();
    calls * arch::VENEER_LEN
}

/// Writes every relocation of `relocs` into `code`, which will run at
/// `base`; `resolve` gives each target's address. `code` is the function's
/// bytes, then room for [`veneer_room`] bytes of veneers from offset
/// `veneers`. The code is the private bytes of a reservation, so an error
/// leaves nothing visible behind.
pub(crate) fn apply(
    code: &mut [u8],
    base: usize,
    veneers: usize,
    relocs: &[ModuleReloc],
    resolve: impl Fn(&ModuleRelocTarget) -> Result<usize, JitError>,
) -> Result<(), JitError> {
    let mut veneer = veneers;
    for reloc in relocs {
        let target = resolve(&reloc.name)?;
        let what = (target as i64).wrapping_add(reloc.addend);
        let offset = reloc.offset as usize;
        let at = base as i64 + offset as i64;
        let refused = || JitError::Relocation {
            kind: reloc.kind,
            target: format!("{:?}", reloc.name),
        };
        match reloc.kind {
            Reloc::Abs8 => write(code, offset, &what.to_le_bytes()).ok_or_else(refused)?,
            Reloc::Abs4 => {
                let value = u32::try_from(what).map_err(|_| refused())?;
                write(code, offset, &value.to_le_bytes()).ok_or_else(refused)?;
            }
            kind => {
                let site = arch::Site {
                    code: &mut *code,
                    offset,
                    at,
                    what,
                    veneer: &mut veneer,
                    base: base as i64,
                };
                arch::patch(kind, site).ok_or_else(refused)?;
            }
        }
    }
    Ok(())
}

/// Copies `bytes` into `code` at `offset`, if they fit.
fn write(code: &mut [u8], offset: usize, bytes: &[u8]) -> Option<()> {
    code.get_mut(offset..offset.checked_add(bytes.len())?)?
        .copy_from_slice(bytes);
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cranelift_codegen::ir::LibCall;

    fn reloc(kind: Reloc, offset: u32, addend: i64) -> ModuleReloc {
        ModuleReloc {
            offset,
            kind,
            name: ModuleRelocTarget::LibCall(LibCall::Memcpy),
            addend,
        }
    }

    #[test]
    fn each_kind_is_written_exactly() {
        let mut code = [0u8; 16];
        let relocs = [reloc(Reloc::Abs8, 0, 2), reloc(Reloc::Abs4, 12, 0)];
        apply(&mut code, 0x1000, 16, &relocs, |_| Ok(0x2000)).unwrap();
        assert_eq!(&code[..8], &0x2002u64.to_le_bytes());
        assert_eq!(&code[8..12], &[0; 4]);
        assert_eq!(&code[12..], &0x2000u32.to_le_bytes());
        if cfg!(target_arch = "x86_64") {
            let pcrel = [reloc(Reloc::X86CallPCRel4, 8, -4)];
            apply(&mut code, 0x1000, 16, &pcrel, |_| Ok(0x2000)).unwrap();
            // target + addend - (base + offset) = 0x2000 - 4 - 0x1008
            assert_eq!(&code[8..12], &(0x2000i32 - 4 - 0x1008).to_le_bytes());
        }
    }

    #[test]
    fn out_of_reach_and_unknown_kinds_are_refused() {
        let mut code = [0u8; 8];
        let far = [reloc(Reloc::X86CallPCRel4, 0, 0)];
        assert!(matches!(
            apply(&mut code, 0x1000, 8, &far, |_| Ok(1 << 40)),
            Err(JitError::Relocation {
                kind: Reloc::X86CallPCRel4,
                ..
            })
        ));
        let got = [reloc(Reloc::X86GOTPCRel4, 0, 0)];
        assert!(apply(&mut code, 0x1000, 8, &got, |_| Ok(0)).is_err());
        let past_the_end = [reloc(Reloc::Abs8, 4, 0)];
        assert!(apply(&mut code, 0x1000, 8, &past_the_end, |_| Ok(0)).is_err());
        let unresolved = [reloc(Reloc::Abs8, 0, 0)];
        assert!(matches!(
            apply(&mut code, 0x1000, 8, &unresolved, |_| Err(
                JitError::UnknownSymbol("memcpy".into())
            )),
            Err(JitError::UnknownSymbol(_))
        ));
    }
}
