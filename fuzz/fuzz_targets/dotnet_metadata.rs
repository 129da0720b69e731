//! The .NET metadata reader over arbitrary bytes, as a metadata root and as
//! a PE file: each is refused with a typed error or parsed, and a parsed
//! one names each of its first methods or refuses to, without a panic, an
//! unbounded loop or an allocation beyond its input's size.
#![no_main]

use jitmap::remote::dotnet::metadata::Metadata;
use libfuzzer_sys::fuzz_target;

/// Methods named in each parsed input.
const NAMED: u32 = 64;

fuzz_target!(|data: &[u8]| {
    for parsed in [Metadata::parse(data), Metadata::from_pe(data)] {
        if let Ok(metadata) = parsed {
            for row in 1..=metadata.method_defs().min(NAMED) {
                if let Ok(name) = metadata.method_name(row) {
                    assert!(name.contains("::"), "{name}");
                }
            }
        }
    }
});
