//! Exports the jitmap descriptor from the `jitmap-sim` executable's dynamic
//! symbol table, where readers in other processes look for it first (a shared
//! library exports it by itself; an executable must ask the linker).

fn main() {
    println!("cargo:rustc-link-arg-bins=-Wl,--export-dynamic-symbol=jitmap_descriptor");
}
