//! The library's version, as the header's `JITMAP_VERSION_*` macros give it
//! to C hosts at compile time, and `jitmap_version` at run time.

/// The major version (`JITMAP_VERSION_MAJOR`): the `0` of 0.1.0.
pub const JITMAP_VERSION_MAJOR: u32 = 0;
/// The minor version (`JITMAP_VERSION_MINOR`).
pub const JITMAP_VERSION_MINOR: u32 = 1;
/// The patch version (`JITMAP_VERSION_PATCH`).
pub const JITMAP_VERSION_PATCH: u32 = 0;

/// The version of the library the host runs with, as
/// `major * 10000 + minor * 100 + patch`: a host compares it with the
/// header's macros to find a library older than the header it was built
/// with. Async-signal-safe.
#[unsafe(no_mangle)]
pub extern "C" fn jitmap_version() -> u32 {
    JITMAP_VERSION_MAJOR * 10_000 + JITMAP_VERSION_MINOR * 100 + JITMAP_VERSION_PATCH
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The macros are the crate's version: a release that bumps one bumps
    /// the other, or this fails.
    #[test]
    fn the_macros_are_the_crates_version() {
        let parse = |s: &str| s.parse::<u32>().unwrap();
        assert_eq!(JITMAP_VERSION_MAJOR, parse(env!("CARGO_PKG_VERSION_MAJOR")));
        assert_eq!(JITMAP_VERSION_MINOR, parse(env!("CARGO_PKG_VERSION_MINOR")));
        assert_eq!(JITMAP_VERSION_PATCH, parse(env!("CARGO_PKG_VERSION_PATCH")));
        assert_eq!(
            jitmap_version(),
            JITMAP_VERSION_MAJOR * 10_000 + JITMAP_VERSION_MINOR * 100 + JITMAP_VERSION_PATCH
        );
    }
}
