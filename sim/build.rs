//! Exports the jitmap descriptor from the `jitmap-sim` executable's dynamic
//! symbol table, where readers in other processes (`jitmap inspect`,
//! `jitmap profile`) look for it first: a shared library exports it by
//! itself, an executable must ask the linker. `spin` and `profile` are hosts
//! those readers are pointed at.

fn main() {
    println!("cargo:rustc-link-arg-bins=-Wl,--export-dynamic-symbol=jitmap_descriptor");
}
