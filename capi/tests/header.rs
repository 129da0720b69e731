//! The committed header is cbindgen's output for the current source: this
//! test fails when they differ. `JITMAP_BLESS=1` writes the fresh one.

use std::path::Path;

#[test]
fn the_committed_header_is_a_fresh_generation() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).unwrap();
    let mut fresh = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .unwrap()
        .write(&mut fresh);
    let fresh = String::from_utf8(fresh).unwrap();
    let path = dir.join("include/jitmap.h");
    if std::env::var_os("JITMAP_BLESS").is_some() {
        std::fs::write(&path, &fresh).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == fresh,
        "{} differs from cbindgen's output; regenerate it with \
         JITMAP_BLESS=1 cargo test -p jitmap-capi --test header",
        path.display()
    );
}
