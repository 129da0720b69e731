//! The shared library's SONAME: `libjitmap.so.<major>` (`0` while the crate
//! is at 0.x), the name a C host records and a distribution installs beside
//! the versioned file (`capi/install.sh`).

fn main() {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap_or_else(|_| "0".into());
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libjitmap.so.{major}");
    println!("cargo:rerun-if-changed=build.rs");
}
