//! Facts the README states that the build decides: each crate's toolchain
//! (its `Cargo.toml`'s `rust-version`), so the README cannot drift from it.

use std::path::Path;

/// The `rust-version` of the package whose manifest is `dir/Cargo.toml`.
fn rust_version(dir: &Path) -> Option<String> {
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    let package = manifest.split("\n[").next().unwrap_or_default();
    package.lines().find_map(|l| {
        let v = l
            .strip_prefix("rust-version")?
            .trim_start()
            .strip_prefix('=')?;
        Some(v.trim().trim_matches('"').to_owned())
    })
}

#[test]
fn the_readme_names_each_crates_toolchain() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let row = |label: &str| -> String {
        readme
            .lines()
            .find_map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                (cells.len() == 4 && cells[1] == label).then(|| cells[2].to_owned())
            })
            .unwrap_or_else(|| panic!("no README row for {label}"))
    };
    let crates = [
        ("`jitmap` (the library)", "."),
        ("`jitmap-capi`", "capi"),
        ("`jitmap-cranelift`", "cranelift"),
        ("`jitmap-sim`", "sim"),
    ];
    let mut newest = String::new();
    for (label, dir) in crates {
        let version = rust_version(&root.join(dir)).unwrap();
        assert_eq!(row(label), version, "{label}");
        if version
            .split('.')
            .map(|p| p.parse::<u32>().unwrap())
            .collect::<Vec<_>>()
            > newest
                .split('.')
                .filter_map(|p| p.parse::<u32>().ok())
                .collect::<Vec<_>>()
        {
            newest = version;
        }
    }
    // The workspace builds every crate: it needs the newest toolchain.
    assert_eq!(row("the workspace (`cargo test --workspace`)"), newest);
}
