//! The library's layering, checked over its sources: every `crate::` path
//! (in a `use` or inline, outside comments) points to a module at the same
//! layer or below, and no import circle spans two top-level modules.
//!
//! The layers, bottom to top (DESIGN.md): words and maps; grace periods;
//! unwinding; heaps, images and the range map; the manager; the agent, the
//! perf output and the remote readers.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module's layer.
const LAYERS: &[(&str, u32)] = &[
    // Words and maps, and the plain pieces everything uses.
    ("sync", 0),
    ("arch", 0),
    ("defect", 0),
    ("hex", 0),
    ("test_rng", 0),
    ("mapping", 0),
    ("map_words", 0),
    ("change_seq", 0),
    ("nibble", 0),
    ("info", 0),
    ("end_words", 0),
    // Grace periods, and the values readers borrow under them.
    ("epoch", 1),
    ("swap", 1),
    // Unwinding: rules, rows and their evaluation.
    ("unwind", 2),
    // Heaps, images, the range map, and what a heap emits.
    ("heap", 3),
    ("image", 3),
    ("range", 3),
    ("events", 3),
    ("gdb", 3),
    ("call", 3),
    // The manager (with the descriptor that describes what it holds).
    ("manager", 4),
    // Consumers.
    ("agent", 5),
    ("counters", 5),
    ("perf", 5),
    ("remote", 5),
];

fn layer(module: &str) -> u32 {
    LAYERS
        .iter()
        .find(|(m, _)| *m == module)
        .unwrap_or_else(|| panic!("module `{module}` has no layer in tests/layering.rs"))
        .1
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The names `lib.rs` re-exports at the crate root, with their modules.
fn root_names(lib: &str) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    let text = lib.replace('\n', " ");
    for item in text.split(';') {
        let Some(rest) = item.trim().strip_prefix("pub use ") else {
            continue;
        };
        let Some((module, list)) = rest.split_once("::") else {
            continue;
        };
        let list = list.trim().trim_start_matches('{').trim_end_matches('}');
        for name in list.split(',') {
            let name = name.trim().rsplit("::").next().unwrap_or_default();
            if !name.is_empty() {
                names.insert(name.to_owned(), module.trim().to_owned());
            }
        }
    }
    names
}

/// The top-level modules a file's code names through `crate::`.
fn imports(text: &str, roots: &BTreeMap<String, String>) -> BTreeSet<String> {
    let code: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut found = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().last();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue; // `$crate::`, `jitmap_crate::`
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let head = item.trim().split("::").next().unwrap_or_default().trim();
                if let Some(name) = resolve(head, roots) {
                    found.insert(name);
                }
            }
            continue;
        }
        let head: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if let Some(name) = resolve(&head, roots) {
            found.insert(name);
        }
    }
    found
}

/// A path's first segment as a top-level module: a module's own name, or a
/// root re-export's module.
fn resolve(head: &str, roots: &BTreeMap<String, String>) -> Option<String> {
    if head.is_empty() || head == "self" {
        return None;
    }
    if head.chars().next().is_some_and(|c| c.is_lowercase()) {
        return Some(head.to_owned());
    }
    roots.get(head).cloned()
}

#[test]
fn no_import_runs_up_a_layer_and_no_circle_spans_modules() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let roots = root_names(&std::fs::read_to_string(src.join("lib.rs")).unwrap());
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut up = Vec::new();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let relative = file.strip_prefix(&src).unwrap();
        let module = relative
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_owned();
        if module == "lib" {
            continue;
        }
        // `heap/end_words.rs` is built alone as `end_words` under loom.
        let module = if relative.ends_with("end_words.rs") {
            "heap".to_owned()
        } else {
            module
        };
        let text = std::fs::read_to_string(file).unwrap();
        for target in imports(&text, &roots) {
            if target == module {
                continue;
            }
            if layer(&target) > layer(&module) {
                up.push(format!("{} imports {target}", relative.display()));
            }
            graph.entry(module.clone()).or_default().insert(target);
        }
    }
    assert!(
        up.is_empty(),
        "imports that run up a layer:\n{}",
        up.join("\n")
    );
    // No circle: every module's imports reach back to it through none.
    for start in graph.keys() {
        let mut seen = BTreeSet::new();
        let mut stack: Vec<&String> = graph[start].iter().collect();
        while let Some(m) = stack.pop() {
            assert_ne!(m, start, "an import circle through `{start}`: {graph:?}");
            if seen.insert(m.clone()) {
                stack.extend(graph.get(m).into_iter().flatten());
            }
        }
    }
    // The check sees the edges it should (so it can fail).
    assert!(graph["heap"].contains("unwind") && graph["agent"].contains("manager"));
    println!(
        "{} files; modules and what they import: {graph:#?}",
        files.len()
    );
}
