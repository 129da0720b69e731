//! Exports the jitmap descriptor from `jitmap-host`'s dynamic symbol table,
//! where a reader in another process looks for it first.

fn main() {
    println!("cargo:rustc-link-arg-bins=-Wl,--export-dynamic-symbol=jitmap_descriptor");
}
