//! The pprof endpoint's request parsing, on arbitrary request heads: every
//! answer is 200, 400, 404 or 405, the same each time, and nothing panics.
#![no_main]

use jitmap::agent::serve::status_of;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|head: &[u8]| {
    let status = status_of(head);
    assert!(
        matches!(status, 200 | 400 | 404 | 405),
        "{status} for {head:?}"
    );
    assert_eq!(status_of(head), status);
});
