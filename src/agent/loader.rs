//! The process's loaded objects, as the dynamic loader lists them
//! (`dl_iterate_phdr`): what the unwinder's tables and the native names
//! follow. Called by the collector and at start, never by the handler (the
//! loader takes its lock).

use std::ffi::CStr;

/// A loaded object: its load bias and its name (empty for the main program).
pub(crate) type Object = (usize, String);

/// Calls `f` with each loaded object and its program headers, until it
/// returns true. `f` runs inside the loader's callback, under its lock: the
/// object's segments stay mapped until it returns.
pub(crate) fn each_object(mut f: impl FnMut(&libc::dl_phdr_info, &[libc::Elf64_Phdr]) -> bool) {
    type Visit<'a> = &'a mut dyn FnMut(&libc::dl_phdr_info, &[libc::Elf64_Phdr]) -> bool;
    unsafe extern "C" fn call(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: `data` is the closure reference below; the loader passes a
        // valid info whose program headers stay mapped during the callback.
        unsafe {
            let f = &mut *data.cast::<Visit<'_>>();
            let info = &*info;
            let headers = std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum.into());
            libc::c_int::from(f(info, headers))
        }
    }
    let mut f: Visit<'_> = &mut f;
    // SAFETY: `call` matches the callback type and uses `data` only as the
    // closure reference, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(call), (&raw mut f).cast()) };
}

/// The object `info` describes.
pub(crate) fn object(info: &libc::dl_phdr_info) -> Object {
    let name = if info.dlpi_name.is_null() {
        String::new()
    } else {
        // SAFETY: a NUL-terminated name from the loader, read in its callback.
        unsafe { CStr::from_ptr(info.dlpi_name) }
            .to_string_lossy()
            .into_owned()
    };
    (info.dlpi_addr as usize, name)
}

/// The loader's counts of loads and unloads: they change whenever an object
/// is loaded or unloaded.
pub(crate) fn counts() -> (u64, u64) {
    let mut counts = (0, 0);
    each_object(|info, _| {
        counts = (info.dlpi_adds, info.dlpi_subs);
        true
    });
    counts
}

/// The loaded objects.
pub(crate) fn objects() -> Vec<Object> {
    let mut found = Vec::new();
    each_object(|info, _| {
        found.push(object(info));
        false
    });
    found
}

/// The object whose segments hold `at`.
pub(crate) fn object_of(at: usize) -> Option<Object> {
    let mut found = None;
    each_object(|info, headers| {
        let base = info.dlpi_addr as usize;
        let holds = headers.iter().any(|h| {
            let lo = base + h.p_vaddr as usize;
            h.p_type == libc::PT_LOAD && (lo..lo + h.p_memsz as usize).contains(&at)
        });
        if holds {
            found = Some(object(info));
        }
        holds
    });
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_function_is_in_an_object_that_is_listed_and_counted() {
        let here = this_function_is_in_an_object_that_is_listed_and_counted as *const () as usize;
        let object = object_of(here).unwrap();
        assert!(objects().contains(&object));
        assert_eq!(object_of(8), None);
        // At least this binary, libc and the loader were loaded.
        assert!(counts().0 >= 3, "{:?}", counts());
    }
}
