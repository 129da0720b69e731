//! Facts the docs state that the build decides, so the docs cannot drift:
//! each crate's toolchain (its `Cargo.toml`'s `rust-version`), every
//! relative link in the README, the guide and BENCHMARKS, and the size of
//! BENCHMARKS.md (current figures only).

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
        ("`jitmap-cli` (the `jitmap` tool)", "cli"),
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

/// The anchor GitHub gives a heading: lower case, spaces to hyphens, and
/// everything but letters, digits, hyphens and underscores dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown file's headings (outside code blocks).
fn anchors(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.push(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

/// The targets of a Markdown file's inline links, `[text](target)`, outside
/// code blocks and code spans.
fn link_targets(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Code spans are not links.
        let plain: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = plain.as_str();
        while let Some(at) = rest.find("](") {
            let tail = &rest[at + 2..];
            let Some(end) = tail.find(')') else { break };
            out.push(tail[..end].to_owned());
            rest = &tail[end..];
        }
    }
    out
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![
        root.join("README.md"),
        root.join("BENCHMARKS.md"),
        root.join("docs/descriptor.md"),
    ];
    for entry in std::fs::read_dir(root.join("docs/guide")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            files.push(path);
        }
    }
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for target in link_targets(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, fragment) = target.split_once('#').unwrap_or((&target, ""));
            let linked = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            if !linked.exists() {
                broken.push(format!("{}: {target} (no such file)", file.display()));
            } else if !fragment.is_empty()
                && linked.extension().is_some_and(|e| e == "md")
                && !anchors(&std::fs::read_to_string(&linked).unwrap())
                    .contains(&fragment.to_owned())
            {
                broken.push(format!("{}: {target} (no such heading)", file.display()));
            }
        }
    }
    assert!(checked >= 30, "only {checked} links found");
    assert_eq!(broken, Vec::<String>::new());
}

#[test]
fn the_link_scanner_finds_links_and_anchors() {
    assert_eq!(
        link_targets("see [a](x.md#b-c) and `[not](y)` then [d](../e)\n```\n[f](g)\n```"),
        ["x.md#b-c", "../e"]
    );
    assert_eq!(
        anchor(" Native code without frame pointers"),
        "native-code-without-frame-pointers"
    );
    assert_eq!(
        anchor(" `jitmap-sim`: the main job"),
        "jitmap-sim-the-main-job"
    );
}

/// BENCHMARKS.md holds current figures only: a new result replaces the row
/// it supersedes, and history lives in git.
#[test]
fn benchmarks_stays_current_figures_only() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let size = std::fs::metadata(root.join("BENCHMARKS.md")).unwrap().len();
    assert!(
        size <= 25 * 1024,
        "BENCHMARKS.md is {size} bytes, over 25 KB"
    );
}
