//! Arbitrary bytes through the replay parser: no panic, and every parsed line
//! prints back to a line that parses to the same command. Small scripts also run.
#![no_main]

use jitmap::MapVersion;
use jitmap_sim::replay::{self, Command, parse_line};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(script) = std::str::from_utf8(data) else {
        return;
    };
    let mut small = true;
    for line in script.lines() {
        if let Ok(Some(command)) = parse_line(line) {
            assert_eq!(parse_line(&command.to_string()), Ok(Some(command)));
            small &= !matches!(command, Command::Heap(size) if size > 1 << 20);
        }
    }
    if small && script.lines().count() <= 64 {
        let mut out = Vec::new();
        replay::run(script, MapVersion::V2, &mut out).unwrap();
    }
});
