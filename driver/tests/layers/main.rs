//! The layer check: the folders of `driver/src` are the layers of `docs/architecture.md`,
//! and this test keeps them so. It reads every source file, takes each `crate::` and
//! `super::` path outside test code, and fails on:
//!
//! - an **upward import**: a top-level module naming one of the same or a higher rank in
//!   [`LAYERS`], or the crate root (`crate::Error`, the re-exports in `lib.rs`);
//! - a **crossing of the seam**: a module above `hw` naming a concrete transport (`emu`,
//!   `hw::vfio`, `hw::pci`) without being one of the [`OPENERS`] that turn target strings
//!   into transports; the driver sees a controller only through `hw::{transport,mmio,dma}`;
//! - a **module cycle**: at every level of the tree, the imports between sibling modules
//!   (files and folders of one folder) must form no cycle;
//! - a top-level module missing from [`LAYERS`] (a new folder takes its place in the table).
//!
//! A parent module and its own children may name each other (that is containment, not a
//! dependency between peers). Doc comments and strings are ignored; `#[cfg(test)]` items
//! and `tests.rs` files may import anything. Known exceptions, each owned by work under
//! way, are in [`ALLOWED`]; an entry that no longer matches anything is an error too, so
//! the table says what the tree is.
//!
//! Run alone with `cargo test --release -p kestrel --test layers`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The top-level modules of `driver/src`, bottom up, with their rank: a module may import
/// only modules of a strictly lower rank. Equal ranks are siblings that must not import
/// each other.
const LAYERS: &[(&str, u32, &str)] = &[
    ("spec", 0, "NVMe wire formats: pure data"),
    (
        "parse",
        0,
        "the grammars people type (sizes, durations, core lists, BDFs, target strings): pure functions",
    ),
    (
        "hw",
        1,
        "the seam (mmio, dma, transport) and the real hardware (vfio, pci)",
    ),
    (
        "emu",
        2,
        "the software controller, a sibling of the real hardware below the seam",
    ),
    ("io", 2, "the request/completion types every queue speaks"),
    (
        "nvme",
        3,
        "rings, PRPs, bring-up, the admin queue, I/O queue pairs",
    ),
    (
        "target",
        4,
        "the Target/TargetQueue traits, the NVMe namespace and file targets",
    ),
    (
        "aio",
        5,
        "contexts, iocbs, events; the wire format, SPSC rings, wake-ups and the reactor",
    ),
    ("target_spec", 6, "target strings, parsed and opened"),
    ("capi", 7, "the C ABI"),
];

/// Modules that may name a concrete transport: they turn a target string into one.
const OPENERS: &[&str] = &["target_spec", "capi"];

/// Concrete transports (path prefixes): only `hw` itself and the [`OPENERS`] name them.
const CONCRETE: &[&[&str]] = &[&["emu"], &["hw", "vfio"], &["hw", "pci"]];

/// The flat paths kept as aliases in `lib.rs` for code outside the crate; inside it they
/// hide the layer, so they are refused with the path to use instead.
const ALIASES: &[(&str, &str)] = &[
    ("dma", "hw::dma"),
    ("limits", "hw::limits"),
    ("mmio", "hw::mmio"),
    ("pci", "hw::pci"),
    ("transport", "hw::transport"),
    ("vfio", "hw::vfio"),
    ("ctrlr", "nvme::ctrlr"),
    ("format", "nvme::format"),
    ("prp", "nvme::prp"),
    ("qpair", "nvme::qpair"),
    ("ring", "nvme::ring"),
    ("file", "target::file"),
];

/// Known exceptions: (importing module, imported module, why it is allowed for now).
/// Each is owned by work under way; delete the entry when the import is gone.
const ALLOWED: &[(&str, &str, &str)] = &[];

type ModPath = Vec<String>;

/// One import of a module by another, with where it is written.
#[derive(Clone, Debug)]
struct Edge {
    from: ModPath,
    to: ModPath,
    /// The path as written (resolved from `crate`).
    named: ModPath,
    file: PathBuf,
    line: usize,
    text: String,
}

fn show(p: &[String]) -> String {
    if p.is_empty() {
        "the crate root".to_string()
    } else {
        p.join("::")
    }
}

fn parse_path(s: &str) -> ModPath {
    s.split("::").map(str::to_string).collect()
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

/// Blanks comments, string and character literals (keeping line breaks), so only code is
/// left to scan.
fn strip(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let blank = |out: &mut Vec<u8>, c: u8| out.push(if c == b'\n' { b'\n' } else { b' ' });
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                out.push(b' ');
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
        } else if c == b'r'
            && (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#'))
            && (i == 0 || !is_ident(b[i - 1]) || b[i - 1] == b'b' && (i < 2 || !is_ident(b[i - 2])))
        {
            // Raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push(c);
                i += 1;
                continue;
            }
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            let end = b[j + 1..]
                .windows(close.len())
                .position(|w| w == close.as_slice())
                .map_or(b.len(), |p| j + 1 + p + close.len());
            for &x in &b[i..end] {
                blank(&mut out, x);
            }
            i = end;
        } else if c == b'"' {
            out.push(b' ');
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    blank(&mut out, b[i]);
                    i += 1;
                }
                if i < b.len() {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
            out.push(b' ');
            i += 1;
        } else if c == b'\'' {
            // A character literal ('x', '\n', '\u{..}'), not a lifetime ('a).
            let lit_end = if b.get(i + 1) == Some(&b'\\') {
                b[i + 3..]
                    .iter()
                    .position(|&x| x == b'\'')
                    .map(|p| i + 3 + p)
            } else if b.get(i + 2) == Some(&b'\'') {
                Some(i + 2)
            } else {
                None
            };
            match lit_end {
                Some(e) => {
                    out.extend(std::iter::repeat_n(b' ', e + 1 - i));
                    i = e + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    String::from_utf8(out).expect("blanking keeps utf-8")
}

/// Blanks every item marked `#[cfg(test)]` (a test module, a test-only function).
fn drop_test_items(code: &str) -> String {
    let mut b = code.as_bytes().to_vec();
    let pat = b"#[cfg(test)]";
    let mut from = 0;
    while let Some(p) = b[from..].windows(pat.len()).position(|w| w == pat) {
        let start = from + p;
        let mut i = start + pat.len();
        let mut depth = 0isize;
        // The item ends at the `;` or the `}` closing its first block, at depth 0.
        while i < b.len() {
            match b[i] {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        i += 1;
                        break;
                    }
                }
                b';' if depth == 0 => {
                    i += 1;
                    break;
                }
                _ => {}
            }
            i += 1;
        }
        for x in &mut b[start..i.min(code.len())] {
            if *x != b'\n' {
                *x = b' ';
            }
        }
        from = i.min(code.len());
    }
    String::from_utf8(b).expect("blanking keeps utf-8")
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Reads one path tree after `::` at `*i` (`a::b`, `a::{b, c::d}`, `a::*`), pushing every
/// full path into `out`.
fn path_tree(b: &[u8], i: &mut usize, prefix: &ModPath, out: &mut Vec<ModPath>) {
    let skip_ws = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    let mut path = prefix.clone();
    loop {
        skip_ws(i);
        if *i < b.len() && b[*i] == b'{' {
            *i += 1;
            loop {
                skip_ws(i);
                if *i >= b.len() || b[*i] == b'}' {
                    *i += 1;
                    return;
                }
                path_tree(b, i, &path, out);
                skip_ws(i);
                if *i < b.len() && b[*i] == b',' {
                    *i += 1;
                }
            }
        }
        let s = *i;
        while *i < b.len() && is_ident(b[*i]) {
            *i += 1;
        }
        if s == *i {
            // `*`, or something that is not a path: the path so far.
            out.push(path);
            return;
        }
        let seg = std::str::from_utf8(&b[s..*i]).expect("ascii").to_string();
        if seg != "self" {
            path.push(seg);
        }
        skip_ws(i);
        if b[*i..].starts_with(b"::") {
            *i += 2;
        } else {
            out.push(path);
            return;
        }
    }
}

/// Every module path named in `code` (already stripped), with its line, resolved from the
/// module `here`.
fn named_paths(code: &str, here: &ModPath) -> Vec<(usize, ModPath)> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let word_start = i == 0 || !is_ident(b[i - 1]) && b[i - 1] != b'$';
        let (kw_crate, kw_super) = (b[i..].starts_with(b"crate"), b[i..].starts_with(b"super"));
        if !(word_start && (kw_crate || kw_super)) {
            i += 1;
            continue;
        }
        let line = code[..i].matches('\n').count() + 1;
        let mut base: ModPath = if kw_crate { Vec::new() } else { here.clone() };
        let mut j = i + 5;
        if kw_super {
            base.pop();
        }
        if j < b.len() && is_ident(b[j]) {
            i = j;
            continue;
        }
        // More `super::` hops.
        loop {
            let mut k = j;
            while k < b.len() && b[k].is_ascii_whitespace() {
                k += 1;
            }
            if !b[k..].starts_with(b"::") {
                break;
            }
            let mut m = k + 2;
            while m < b.len() && b[m].is_ascii_whitespace() {
                m += 1;
            }
            if b[m..].starts_with(b"super") && !is_ident(*b.get(m + 5).unwrap_or(&b' ')) {
                base.pop();
                j = m + 5;
            } else {
                break;
            }
        }
        let mut k = j;
        while k < b.len() && b[k].is_ascii_whitespace() {
            k += 1;
        }
        if b[k..].starts_with(b"::") {
            k += 2;
            let mut paths = Vec::new();
            path_tree(b, &mut k, &base, &mut paths);
            out.extend(paths.into_iter().map(|p| (line, p)));
            i = k;
        } else {
            i = j;
        }
    }
    out
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

/// Inline `mod name {` blocks (outside test code), as modules of the file's module.
fn inline_modules(code: &str, here: &ModPath, out: &mut BTreeSet<ModPath>) {
    let b = code.as_bytes();
    let mut i = 0;
    while let Some(p) = code[i..].find("mod ") {
        let s = i + p;
        i = s + 4;
        if s > 0 && is_ident(b[s - 1]) {
            continue;
        }
        let name: String = code[i..]
            .trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let rest = code[i..].trim_start()[name.len()..].trim_start();
        if !name.is_empty() && rest.starts_with('{') {
            let mut m = here.clone();
            m.push(name);
            out.insert(m);
        }
    }
}

struct Crate {
    modules: BTreeSet<ModPath>,
    edges: Vec<Edge>,
}

fn read_crate(src: &Path) -> Crate {
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

/// For a path through an alias of `lib.rs`, the path to write instead.
fn path_hint(named: &[String]) -> Option<String> {
    let first = named.first()?;
    ALIASES.iter().find(|(alias, _)| alias == first).map(|(alias, real)| {
        format!("`crate::{alias}` is an alias kept for code outside the crate; write `crate::{real}`")
    })
}

fn rank(m: &str) -> Option<u32> {
    LAYERS.iter().find(|(n, _, _)| *n == m).map(|(_, r, _)| *r)
}

fn is_ancestor(a: &[String], b: &[String]) -> bool {
    a.len() <= b.len() && b[..a.len()] == *a
}

fn allowed(e: &Edge) -> Option<usize> {
    ALLOWED.iter().position(|(from, to, _)| {
        is_ancestor(&parse_path(from), &e.from) && is_ancestor(&parse_path(to), &e.to)
    })
}

fn where_(e: &Edge) -> String {
    // Relative to the workspace, as a reader finds it.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or(Path::new("/"));
    let f = e.file.strip_prefix(root).unwrap_or(&e.file);
    format!("{}:{}: {}", f.display(), e.line, e.text)
}

/// Upward imports, crossings of the seam, modules missing from the table.
fn layer_violations(c: &Crate, used: &mut BTreeSet<usize>) -> Vec<String> {
    let mut errs = Vec::new();
    for m in &c.modules {
        if m.len() == 1 && rank(&m[0]).is_none() {
            errs.push(format!(
                "driver/src: module `{}` is not in the layer table; give it a rank in LAYERS \
                 (driver/tests/layers.rs), or move it into the layer it belongs to",
                m[0]
            ));
        }
    }
    for e in &c.edges {
        if is_ancestor(&e.from, &e.to) || is_ancestor(&e.to, &e.from) && !e.to.is_empty() {
            continue;
        }
        if e.from.is_empty() {
            continue; // lib.rs is the top: it may name every layer.
        }
        if let Some(k) = allowed(e) {
            used.insert(k);
            continue;
        }
        if e.to.is_empty() {
            let hint = path_hint(&e.named).unwrap_or_else(|| {
                "the root (`crate::Error`, the re-exports) is above every layer; name the item \
                 by its module path, and use this layer's own error type"
                    .to_string()
            });
            errs.push(format!(
                "{}\n    rule: `{}` names the crate root: {hint}",
                where_(e),
                show(&e.from)
            ));
            continue;
        }
        let (f, t) = (&e.from[0], &e.to[0]);
        if f != t {
            match (rank(f), rank(t)) {
                (Some(rf), Some(rt)) if rt >= rf => errs.push(format!(
                    "{}\n    rule: a layer imports only layers below it; `{f}` (rank {rf}) may not \
                     import `{}` (`{t}`, rank {rt}). Move the shared item down, or invert the \
                     dependency (the ranks are listed below)",
                    where_(e),
                    show(&e.to)
                )),
                _ => {}
            }
        }
        let concrete = CONCRETE.iter().any(|c| {
            let c: Vec<String> = c.iter().map(|s| s.to_string()).collect();
            is_ancestor(&c, &e.to) && !is_ancestor(&c[..1], &e.from)
        });
        let above_hw = rank(f).is_some_and(|r| r > rank("hw").unwrap_or(0));
        if concrete && above_hw && !OPENERS.contains(&f.as_str()) {
            errs.push(format!(
                "{}\n    rule: the seam: above `hw`, only {OPENERS:?} name a concrete transport \
                 (`emu`, `hw::vfio`, `hw::pci`); `{}` must reach a controller through \
                 `hw::transport`, `hw::mmio` and `hw::dma`",
                where_(e),
                show(&e.from)
            ));
        }
    }
    errs
}

/// Cycles among the siblings of every folder.
fn cycles(c: &Crate, used: &mut BTreeSet<usize>) -> Vec<String> {
    // Sibling graph: for an edge a::b::x -> a::c::y, the edge b -> c under a.
    let mut graph: BTreeMap<ModPath, BTreeMap<ModPath, Vec<&Edge>>> = BTreeMap::new();
    for e in &c.edges {
        if is_ancestor(&e.from, &e.to) || is_ancestor(&e.to, &e.from) {
            continue;
        }
        if let Some(k) = allowed(e) {
            used.insert(k);
            continue;
        }
        let k = e.from.iter().zip(&e.to).take_while(|(a, b)| a == b).count();
        graph
            .entry(e.from[..=k].to_vec())
            .or_default()
            .entry(e.to[..=k].to_vec())
            .or_default()
            .push(e);
    }
    // Tarjan's strongly connected components.
    struct T<'a> {
        g: &'a BTreeMap<ModPath, BTreeMap<ModPath, Vec<&'a Edge>>>,
        index: BTreeMap<ModPath, usize>,
        low: BTreeMap<ModPath, usize>,
        stack: Vec<ModPath>,
        on: BTreeSet<ModPath>,
        sccs: Vec<Vec<ModPath>>,
    }
    fn visit(t: &mut T<'_>, v: &ModPath) {
        let n = t.index.len();
        t.index.insert(v.clone(), n);
        t.low.insert(v.clone(), n);
        t.stack.push(v.clone());
        t.on.insert(v.clone());
        let succ: Vec<ModPath> =
            t.g.get(v)
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default();
        for w in succ {
            if !t.index.contains_key(&w) {
                visit(t, &w);
                let lw = t.low[&w];
                let lv = t.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if t.on.contains(&w) {
                let iw = t.index[&w];
                let lv = t.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(&w);
                let done = w == *v;
                scc.push(w);
                if done {
                    break;
                }
            }
            t.sccs.push(scc);
        }
    }
    let mut t = T {
        g: &graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        sccs: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v) {
            visit(&mut t, v);
        }
    }
    let mut errs = Vec::new();
    for scc in t.sccs.iter().filter(|s| s.len() > 1) {
        let set: BTreeSet<&ModPath> = scc.iter().collect();
        // One shortest cycle through the SCC's first module, by breadth-first search.
        let start = &scc[0];
        let mut prev: BTreeMap<&ModPath, &ModPath> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start]);
        let mut closing = None;
        while let Some(a) = queue.pop_front() {
            for b in graph[a].keys().filter(|b| set.contains(b)) {
                if b == start {
                    closing = Some(a);
                    break;
                }
                if !prev.contains_key(b) {
                    prev.insert(b, a);
                    queue.push_back(b);
                }
            }
            if closing.is_some() {
                break;
            }
        }
        let mut path = vec![start];
        let mut at = closing.expect("a strongly connected component has a cycle");
        while at != start {
            path.push(at);
            at = prev[at];
        }
        path[1..].reverse();
        path.push(start);
        let mut msg = format!(
            "module cycle: {}",
            path.iter()
                .map(|m| show(m))
                .collect::<Vec<_>>()
                .join(" -> ")
        );
        for w in path.windows(2) {
            let e = graph[w[0]][w[1]][0];
            let _ = write!(msg, "\n    {} -> {}: {}", show(w[0]), show(w[1]), where_(e));
        }
        msg.push_str(
            "\n    rule: siblings must not import each other both ways; give the shared items a \
             home of their own that both import",
        );
        errs.push(msg);
    }
    errs
}

#[test]
fn layers_import_only_downward_and_without_cycles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let c = read_crate(&src);
    assert!(
        c.edges.len() > 50,
        "the scan found only {} imports in {}: the parser is broken",
        c.edges.len(),
        src.display()
    );
    let mut used = BTreeSet::new();
    let mut errs = layer_violations(&c, &mut used);
    errs.extend(cycles(&c, &mut used));
    for (k, (from, to, _)) in ALLOWED.iter().enumerate() {
        if !used.contains(&k) {
            errs.push(format!(
                "driver/tests/layers.rs: the ALLOWED entry {from} -> {to} matches no import any \
                 more\n    rule: an exception that no longer applies is deleted, so the table \
                 says what the tree is"
            ));
        }
    }
    let table = LAYERS
        .iter()
        .map(|(n, r, what)| format!("    {r} {n}: {what}"))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        errs.is_empty(),
        "{} layering error(s) in driver/src (rules in driver/tests/layers.rs):\n\n{}\n\n\
         layers by rank (a module imports only lower ranks):\n{table}\n",
        errs.len(),
        errs.join("\n\n")
    );
}

/// The checker itself: it must see the kinds of import it claims to check.
#[test]
fn the_scanner_sees_what_it_checks() {
    let here = parse_path("nvme::qpair::split");
    let code = strip(
        "use crate::{hw::dma::DmaBuf, io::{IoRequest, IoError}};\n\
         // use crate::target::Target;\n\
         let s = \"crate::aio\";\n\
         use super::super::ring::SqRing;\n\
         fn f() -> crate::spec::Sqe { todo!() }\n\
         pub(crate) fn g() {}\n\
         #[cfg(test)]\nmod tests { use crate::capi::X; }\n",
    );
    let code = drop_test_items(&code);
    let got: Vec<(usize, String)> = named_paths(&code, &here)
        .into_iter()
        .map(|(l, p)| (l, p.join("::")))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, "hw::dma::DmaBuf".to_string()),
            (1, "io::IoRequest".to_string()),
            (1, "io::IoError".to_string()),
            (4, "nvme::ring::SqRing".to_string()),
            (5, "spec::Sqe".to_string()),
        ]
    );
    // An upward import and a cycle, on a made-up crate.
    let modules: BTreeSet<ModPath> = [
        "", "spec", "nvme", "nvme::a", "nvme::b", "target", "aio", "capi",
    ]
    .iter()
    .map(|s| {
        if s.is_empty() {
            Vec::new()
        } else {
            parse_path(s)
        }
    })
    .collect();
    let edge = |from: &str, to: &str| Edge {
        from: parse_path(from),
        to: parse_path(to),
        file: PathBuf::from("x.rs"),
        line: 1,
        named: parse_path(to),
        text: format!("use crate::{to};"),
    };
    let c = Crate {
        modules,
        edges: vec![
            edge("nvme::a", "target"),
            edge("nvme::a", "nvme::b"),
            edge("nvme::b", "nvme::a"),
            edge("nvme::a", "spec"),
            edge("capi", "aio"),
        ],
    };
    let mut used = BTreeSet::new();
    let up = layer_violations(&c, &mut used);
    assert_eq!(up.len(), 1, "{up:#?}");
    assert!(
        up[0].contains("`nvme` (rank 3) may not import `target`"),
        "{}",
        up[0]
    );
    let cyc = cycles(&c, &mut used);
    assert_eq!(cyc.len(), 1, "{cyc:#?}");
    assert!(
        cyc[0].contains("module cycle: nvme::a -> nvme::b -> nvme::a")
            || cyc[0].contains("module cycle: nvme::b -> nvme::a -> nvme::b"),
        "{}",
        cyc[0]
    );
}
