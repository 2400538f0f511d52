//! `driver/src` read as a graph: its modules (one per file, and the inline ones) and the
//! edges between them (one per path a module names), each with where it is written.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::blank::{drop_test_items, strip};
use crate::scan::{inline_modules, named_paths};

/// A module path from the crate root (`["nvme", "qpair"]`); empty for the root.
pub type ModPath = Vec<String>;

/// One import of a module by another, with where it is written.
#[derive(Clone, Debug)]
pub struct Edge {
    pub from: ModPath,
    pub to: ModPath,
    /// The path as written (resolved from `crate`).
    pub named: ModPath,
    pub file: PathBuf,
    pub line: usize,
    pub text: String,
}

/// The modules of `driver/src` and every import between them.
pub struct Crate {
    pub modules: BTreeSet<ModPath>,
    pub edges: Vec<Edge>,
}

/// Reads every source file under `src` (test files left out) into modules and edges.
pub fn read_crate(src: &Path) -> Crate {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut modules = BTreeSet::new();
    let mut parsed = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(src).expect("under src");
        let here = module_of(rel);
        // Test files (a `tests.rs`, or anything under a `tests/` folder) may import anything.
        if here.iter().any(|m| m == "tests") {
            continue;
        }
        let text =
            std::fs::read_to_string(f).unwrap_or_else(|e| panic!("reading {}: {e}", f.display()));
        let code = drop_test_items(&strip(&text));
        modules.insert(here.clone());
        inline_modules(&code, &here, &mut modules);
        parsed.push((f.clone(), here, code, text));
    }
    let mut edges = Vec::new();
    for (file, here, code, text) in &parsed {
        let lines: Vec<&str> = text.lines().collect();
        for (line, path) in named_paths(code, here) {
            edges.push(Edge {
                from: here.clone(),
                to: resolve(&path, &modules),
                named: path,
                file: file.clone(),
                line,
                text: lines.get(line - 1).map_or("", |l| l.trim()).to_string(),
            });
        }
    }
    Crate { modules, edges }
}

/// Every `.rs` file under `dir`, in sorted order.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The module path of a source file, relative to `src`.
fn module_of(rel: &Path) -> ModPath {
    let mut parts: ModPath = rel
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_string());
    }
    parts
}

/// The deepest known module a path names (`crate::nvme::qpair::IoQpair` names
/// `nvme::qpair`).
fn resolve(path: &ModPath, modules: &BTreeSet<ModPath>) -> ModPath {
    (0..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|p| modules.contains(p))
        .unwrap_or_default()
}

/// `a::b` as a module path.
pub fn parse_path(s: &str) -> ModPath {
    s.split("::").map(str::to_string).collect()
}

/// A module path as written (`a::b`), the root by name.
pub fn show(p: &[String]) -> String {
    if p.is_empty() {
        "the crate root".to_string()
    } else {
        p.join("::")
    }
}

/// Whether `a` is `b` or one of the modules containing it.
pub fn is_ancestor(a: &[String], b: &[String]) -> bool {
    a.len() <= b.len() && b[..a.len()] == *a
}

/// Where an import is written, as `file:line: text`.
pub fn where_(e: &Edge) -> String {
    // Relative to the workspace, as a reader finds it.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or(Path::new("/"));
    let f = e.file.strip_prefix(root).unwrap_or(&e.file);
    format!("{}:{}: {}", f.display(), e.line, e.text)
}
