//! The same target at another optimization level: what a tiered JIT compiles
//! its baseline and optimized versions of one function with.

use cranelift_codegen::isa::{self, OwnedTargetIsa, TargetIsa};
use cranelift_codegen::settings::{self, Configurable, OptLevel};
use cranelift_module::ModuleError;

use crate::JitError;

/// `isa` with every shared and ISA-specific flag as it is, but `opt_level`.
pub(crate) fn at_level(isa: &dyn TargetIsa, level: OptLevel) -> Result<OwnedTargetIsa, JitError> {
    let setting = |e: settings::SetError| JitError::from(ModuleError::from(e));
    let mut shared = settings::builder();
    for value in isa.flags().iter() {
        shared
            .set(value.name, &value.value_string())
            .map_err(setting)?;
    }
    shared
        .set("opt_level", &level.to_string())
        .map_err(setting)?;
    let mut target = isa::lookup(isa.triple().clone()).map_err(|_| JitError::UnsupportedArch)?;
    for value in isa.isa_flags() {
        target
            .set(value.name, &value.value_string())
            .map_err(setting)?;
    }
    target
        .finish(settings::Flags::new(shared))
        .map_err(|e| JitError::from(ModuleError::from(e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_opt_level_changes() {
        let builder = cranelift_native::builder().unwrap();
        let mut flags = settings::builder();
        flags.set("preserve_frame_pointers", "true").unwrap();
        flags.set("opt_level", "none").unwrap();
        let isa = builder.finish(settings::Flags::new(flags)).unwrap();
        let fast = at_level(&*isa, OptLevel::Speed).unwrap();
        assert_eq!(fast.flags().opt_level(), OptLevel::Speed);
        assert!(fast.flags().preserve_frame_pointers());
        let names = |i: &dyn TargetIsa| -> Vec<(String, String)> {
            let shared = i.flags().iter().filter(|v| v.name != "opt_level");
            shared
                .chain(i.isa_flags())
                .map(|v| (v.name.to_owned(), v.value_string()))
                .collect()
        };
        assert_eq!(names(&*fast), names(&*isa));
        assert_eq!(fast.triple(), isa.triple());
    }
}
