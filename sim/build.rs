//! Exports the jitmap descriptor from the `jitmap-sim` executable's dynamic
//! symbol table, where readers in other processes look for it first (a shared
//! library exports it by itself; an executable must ask the linker).
//!
//! With the `ebpf` feature, also compiles the eBPF profiler's program
//! (`bpf/profile.bpf.c`) with clang into `OUT_DIR/profile.bpf.o`.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rustc-link-arg-bins=-Wl,--export-dynamic-symbol=jitmap_descriptor");
    if std::env::var_os("CARGO_FEATURE_EBPF").is_some() {
        compile_bpf();
    }
}

fn compile_bpf() {
    let source = "bpf/profile.bpf.c";
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
