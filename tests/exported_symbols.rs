//! Which symbols a binary that links jitmap exports by fixed name. A runtime
//! may link jitmap beside another JIT library (LLVM's, wasmtime's) that
//! defines the GDB JIT interface's two symbols, so jitmap defines them only
//! with its `gdb-jit` feature; its probes are reached by address and carry
//! no fixed name at all. The one fixed name it always exports is
//! `jitmap_descriptor`, which readers in other processes look up.
//!
//! The host in `tests/linking/` is built in a cargo run of its own, so that
//! no other workspace member's features are unified into its jitmap.

use std::path::{Path, PathBuf};
use std::process::Command;

use object::{Object, ObjectSection, ObjectSymbol};

/// Builds the linking host, with `features`, and returns its executable.
fn build(features: &[&str]) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target = jitmap_testkit::e2e::cargo_target_dir(root).join("linking");
    let mut cargo = Command::new(env!("CARGO"));
    cargo
        .args(["build", "--locked", "--quiet", "--manifest-path"])
        .arg(root.join("tests/linking/Cargo.toml"))
        .arg("--target-dir")
        .arg(&target);
    if !features.is_empty() {
        cargo.args(["--features", &features.join(",")]);
    }
    let out = cargo.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    target.join("debug").join("jitmap-linking-check")
}

/// The defined symbols, by unmangled name, of the executable at `path`.
fn defined(path: &Path) -> Vec<String> {
    let data = std::fs::read(path).unwrap();
    let elf = object::File::parse(&*data).unwrap();
    elf.symbols()
        .chain(elf.dynamic_symbols())
        .filter(|s| s.is_definition())
        .filter_map(|s| s.name().ok().map(str::to_owned))
        .collect()
}

#[test]
fn only_the_descriptor_has_a_fixed_name_unless_gdb_jit_is_asked_for() {
    let fixed = [
        "__jit_debug_descriptor",
        "__jit_debug_register_code",
        "jitmap_probe_enter",
        "jitmap_probe_value",
        "jitmap_probe_count",
    ];
    let plain_host = build(&[]);
    let plain = defined(&plain_host);
    assert!(plain.iter().any(|s| s == "jitmap_descriptor"));
    // And the descriptor alone in its section, which a stripped copy keeps.
    let data = std::fs::read(&plain_host).unwrap();
    let elf = object::File::parse(&*data).unwrap();
    let section = elf.section_by_name("jitmap.descriptor").unwrap();
    assert_eq!(
        section.size(),
        size_of::<jitmap::remote::Descriptor>() as u64
    );
    for name in fixed {
        assert!(!plain.iter().any(|s| s == name), "{name} is exported");
    }
    let with_gdb = defined(&build(&["gdb-jit"]));
    for name in ["__jit_debug_descriptor", "__jit_debug_register_code"] {
        assert!(with_gdb.iter().any(|s| s == name), "{name} is missing");
    }
    for name in &fixed[2..] {
        assert!(!with_gdb.iter().any(|s| s == name), "{name} is exported");
    }
    // The hosts run: they publish, find and profile without the symbols,
    // and a heap that asks for the GDB JIT interface without the feature is
    // refused with a typed error.
    let out = Command::new(build(&[])).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("Heap(GdbJitUnavailable) Some(1) 0x"),
        "{text}"
    );
    let out = Command::new(build(&["gdb-jit"])).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("gdb-jit Some(1) 0x"), "{text}");
}
