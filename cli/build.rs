//! With the `ebpf` feature, compiles the eBPF profiler's program
//! (`src/ebpf/profile.bpf.c`, beside the Rust that loads it) with clang into
//! `OUT_DIR/profile.bpf.o`.
//!
//! This crate's test executables act as the jitmap hosts that `jitmap
//! inspect` and `jitmap profile` read in the tests. They are linked as a
//! host that asks nothing of its linker is: the descriptor is not in their
//! dynamic symbol table, and a stripped copy is found by its section alone.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    if std::env::var_os("CARGO_FEATURE_EBPF").is_some() {
        compile_bpf();
    }
}

fn compile_bpf() {
    let source = "src/ebpf/profile.bpf.c";
    println!("cargo:rerun-if-changed={source}");
    println!("cargo:rerun-if-env-changed=CLANG");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".to_owned());
    let status = Command::new(&clang)
        .args([
            "-target", "bpf", "-O2", "-g", "-Wall", "-Werror", "-c", source, "-o",
        ])
        .arg(out.join("profile.bpf.o"))
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("{clang} failed to compile {source} ({s})"),
        Err(e) => panic!(
            "the `ebpf` feature compiles {source} with clang, which could not run ({e}); \
             install it (Debian: apt-get install clang) or set CLANG"
        ),
    }
}
