//! Source rules about `unsafe`, checked over every Rust file of the workspace (CI runs this
//! with `cargo test --workspace`; alone: `cargo test --release -p kestrel --test
//! source_rules`). docs/architecture.md states the rules and points here.
//!
//! 1. Every `unsafe { .. }` block and `unsafe impl` has a `// SAFETY:` comment directly
//!    above it: on the lines right before it (attributes may come between), before the
//!    statement it is part of, or as the first line inside a block that starts a line.
//! 2. `unsafe` appears, outside test code, only in the modules of
//!    [`rules::UNSAFE_MODULES`], which is also the table in docs/architecture.md.
//! 3. A `SAFETY:` comment names an invariant: with the phrases that only point elsewhere
//!    ([`rules::VAGUE`]: "the caller's contract", "see above", ...) removed, it keeps at
//!    least [`rules::MIN_WORDS`] words. "As above" is allowed for the item right after the
//!    one it refers to, and "as in `f`" when `f` is a function of the same file. A comment
//!    that relies on "the caller" sits in an `unsafe fn` whose doc has a `# Safety`
//!    section: the contract is written on the function.
//! 4. No `get_unchecked` outside [`rules::GET_UNCHECKED_ALLOWED`].
//! 5. In the files that reach BAR0 or device-written memory
//!    ([`rules::DEVICE_MEMORY_FILES`]), nothing makes a Rust reference to that memory.
//!
//! Comments, strings and character literals are blanked before code is read (`lex`), so
//! "unsafe" in prose or a message is not code.

mod lex;
mod rules;

use std::path::{Path, PathBuf};

use lex::{drop_test_items, find_word, lines, next_token, Line};
use rules::*;

/// One Rust file: its path from the workspace root (with `/`) and its lines.
struct Source {
    path: String,
    lines: Vec<Line>,
}

impl Source {
    fn new(path: &str, text: &str) -> Source {
        Source {
            path: path.to_string(),
            lines: lines(text),
        }
    }

    /// Test code as a whole file: tests (the loom model tests, `loom_tests.rs`, built only
    /// under `--cfg loom`, among them), benches, examples, build scripts.
    fn is_test_file(&self) -> bool {
        let parts: Vec<&str> = self.path.split('/').collect();
        parts[..parts.len() - 1]
            .iter()
            .any(|p| matches!(*p, "tests" | "benches" | "examples" | "fuzz_targets"))
            || matches!(
                *parts.last().unwrap(),
                "tests.rs" | "loom_tests.rs" | "build.rs"
            )
    }

    fn at(&self, line: usize) -> String {
        format!("{}:{}", self.path, line + 1)
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the driver is a member of the workspace")
        .to_path_buf()
}

/// Every `.rs` file below `dir`, but in build output and hidden folders.
fn walk(root: &Path, dir: &Path, out: &mut Vec<Source>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if p.is_dir() {
            // Build output (`target/`, `fuzz/target/`) is marked by its CACHEDIR.TAG;
            // `driver/src/target/` is source.
            if !name.starts_with('.') && !p.join("CACHEDIR.TAG").exists() {
                walk(root, &p, out);
            }
        } else if name.ends_with(".rs") {
            let text = std::fs::read_to_string(&p)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()));
            let rel = p
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            out.push(Source::new(&rel, &text));
        }
    }
}

fn workspace_sources() -> Vec<Source> {
    let root = workspace_root();
    let mut out = Vec::new();
    walk(&root, &root, &mut out);
    assert!(
        out.len() > 200 && out.iter().any(|s| s.path == "driver/src/hw/mmio.rs"),
        "found only {} Rust files below {}: the walk is broken",
        out.len(),
        root.display()
    );
    out
}

fn report(errs: Vec<String>, rule: &str) {
    assert!(
        errs.is_empty(),
        "{} violation(s) of: {rule}\n(rules: driver/tests/source_rules/main.rs; tables: rules.rs)\n\n{}\n",
        errs.len(),
        errs.join("\n")
    );
}

// ---- rule 1: a SAFETY comment on every unsafe block and impl ----

/// Whether the comment lines right above line `k` (attributes skipped) hold a `SAFETY:`.
/// `None` when there are no comment lines right above it.
fn comment_above_has_safety(lines: &[Line], k: usize) -> Option<bool> {
    let mut j = k;
    let mut seen = false;
    while j > 0 {
        let l = &lines[j - 1];
        let code = l.code.trim();
        if l.comment.is_some() && code.is_empty() {
            seen = true;
            if l.comment.as_deref().is_some_and(|c| c.contains("SAFETY:")) {
                return Some(true);
            }
        } else if !(code.starts_with("#[") && code.ends_with(']')) {
            break;
        }
        j -= 1;
    }
    seen.then_some(false)
}

/// Whether the `unsafe` at (line, col) has its `SAFETY:` comment in one of the usual places.
fn documented(lines: &[Line], line: usize, col: usize, block: bool) -> bool {
    // Inside the block, first thing: `unsafe {` ends its line, the comment comes next.
    if block && lines[line].code[col..].trim_end().ends_with('{') {
        if let Some(c) = lines.get(line + 1).and_then(|l| l.comment.as_deref()) {
            if c.contains("SAFETY:") {
                return true;
            }
        }
    }
    // Above the line, or above the statement the line continues (at most 4 lines up).
    let mut k = line;
    for _ in 0..5 {
        match comment_above_has_safety(lines, k) {
            Some(found) => return found,
            None if k > 0 => {
                let prev = lines[k - 1].code.trim_end();
                let continues = !prev.trim().is_empty()
                    && !prev.ends_with(';')
                    && !prev.ends_with('{')
                    && !prev.ends_with('}');
                if !continues {
                    return false;
                }
                k -= 1;
            }
            None => return false,
        }
    }
    false
}

fn undocumented_unsafe(s: &Source) -> Vec<String> {
    let mut errs = Vec::new();
    for (line, col) in find_word(&s.lines, "unsafe") {
        let kind = next_token(&s.lines, line, col + "unsafe".len());
        let block = kind == "{";
        if (block || kind == "impl") && !documented(&s.lines, line, col, block) {
            errs.push(format!(
                "{}: `unsafe {}` without a `// SAFETY:` comment directly above it",
                s.at(line),
                if block { "{ .. }" } else { "impl" }
            ));
        }
    }
    errs
}

#[test]
fn every_unsafe_block_and_impl_has_a_safety_comment() {
    let errs = workspace_sources()
        .iter()
        .flat_map(undocumented_unsafe)
        .collect();
    report(
        errs,
        "rule 1: every unsafe block and unsafe impl has a // SAFETY: comment",
    );
}

// ---- rule 2: unsafe only in the named modules ----

/// The entry of [`UNSAFE_MODULES`] that covers `path`.
fn unsafe_entry(path: &str) -> Option<usize> {
    UNSAFE_MODULES.iter().position(|(m, _)| {
        if m.ends_with('/') {
            path.starts_with(m)
        } else {
            path == *m
        }
    })
}

/// The first `unsafe` of the file's code outside test items (line index).
fn first_unsafe_outside_tests(s: &Source) -> Option<usize> {
    if s.is_test_file() {
        return None;
    }
    let mut lines = s.lines.clone();
    drop_test_items(&mut lines);
    find_word(&lines, "unsafe").first().map(|&(l, _)| l)
}

fn unsafe_outside_the_list(sources: &[Source], doc: &str) -> Vec<String> {
    let mut used = vec![false; UNSAFE_MODULES.len()];
    let mut errs = Vec::new();
    for s in sources {
        let Some(line) = first_unsafe_outside_tests(s) else {
            continue;
        };
        match unsafe_entry(&s.path) {
            Some(k) => used[k] = true,
            None => errs.push(format!(
                "{}: `unsafe` in a module not in UNSAFE_MODULES (driver/tests/source_rules/rules.rs); \
                 move it into one of them, or add the module there and to the table in docs/architecture.md",
                s.at(line)
            )),
        }
    }
    for (k, (m, _)) in UNSAFE_MODULES.iter().enumerate() {
        if !used[k] {
            errs.push(format!(
                "UNSAFE_MODULES entry {m} holds no `unsafe` any more: delete it there and in docs/architecture.md"
            ));
        }
        if !doc.contains(&format!("`{m}`")) {
            errs.push(format!(
                "docs/architecture.md does not name `{m}` in its table of where `unsafe` lives"
            ));
        }
    }
    errs
}

#[test]
fn unsafe_lives_only_in_the_named_modules() {
    let doc = std::fs::read_to_string(workspace_root().join("docs/architecture.md"))
        .expect("docs/architecture.md");
    let errs = unsafe_outside_the_list(&workspace_sources(), &doc);
    report(errs, "rule 2: unsafe only in the modules of UNSAFE_MODULES");
}

// ---- rule 3: a SAFETY comment names its invariant ----

/// A `SAFETY:` comment: the line it starts on, the line it ends on, its text.
struct SafetyComment {
    start: usize,
    end: usize,
    text: String,
}

fn safety_comments(lines: &[Line]) -> Vec<SafetyComment> {
    let mut out = Vec::new();
    let mut k = 0;
    while k < lines.len() {
        let Some(c) = lines[k].comment.as_deref() else {
            k += 1;
            continue;
        };
        let Some(p) = c.find("SAFETY:") else {
            k += 1;
            continue;
        };
        let mut text = c[p + "SAFETY:".len()..].trim().to_string();
        let start = k;
        k += 1;
        while let Some(l) = lines.get(k) {
            match l.comment.as_deref() {
                Some(c) if l.code.trim().is_empty() && !c.contains("SAFETY:") => {
                    text.push(' ');
                    text.push_str(c.trim());
                    k += 1;
                }
                _ => break,
            }
        }
        out.push(SafetyComment {
            start,
            end: k - 1,
            text,
        });
    }
    out
}

/// Lower case, backticks and punctuation (but `'` and `_`) turned into spaces, one space
/// between words.
fn normalize(text: &str) -> String {
    let t: String = text
        .to_lowercase()
        .chars()
        .map(|c| {
            if c.is_alphanumeric() || matches!(c, '\'' | '_' | '-') {
                c
            } else {
                ' '
            }
        })
        .collect();
    t.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The words left once the [`VAGUE`] phrases are taken out.
fn substance(text: &str) -> usize {
    let mut t = format!(" {} ", normalize(text));
    for v in VAGUE {
        t = t.replace(&format!(" {} ", normalize(v)), " ");
    }
    t.split_whitespace()
        .filter(|w| w.chars().any(|c| c.is_alphanumeric()))
        .count()
}

/// Whether a comment of no substance is an allowed back-reference: "as above" for the
/// item right after the one referred to, "as in `f`" for a function `f` of this file.
fn allowed_reference(s: &Source, c: &SafetyComment, prev_end: Option<usize>) -> bool {
    let t = normalize(&c.text);
    if matches!(t.as_str(), "as above" | "see above" | "same as above") {
        return prev_end.is_some_and(|e| c.start - e <= AS_ABOVE_REACH);
    }
    let Some(name) = t.strip_prefix("as in ") else {
        return false;
    };
    !name.contains(' ')
        && s.lines.iter().any(|l| {
            find_word(std::slice::from_ref(l), name)
                .iter()
                .any(|&(_, col)| l.code[..col].trim_end().ends_with("fn"))
        })
}

/// The line of the `fn` a comment at `line` is inside: the nearest `fn` above it that is
/// indented less.
fn enclosing_fn(lines: &[Line], line: usize) -> Option<usize> {
    let indent = |l: &Line| l.raw.len() - l.raw.trim_start().len();
    let mine = indent(&lines[line]);
    (0..line).rev().find(|&k| {
        let l = &lines[k];
        !l.code.trim().is_empty()
            && indent(l) < mine
            && find_word(std::slice::from_ref(l), "fn")
                .iter()
                .any(|&(_, c)| next_token(std::slice::from_ref(l), 0, c + 2) != "(")
    })
}

/// Whether the `fn` at `line` is `unsafe` and its doc comment has a `# Safety` section.
fn has_safety_section(lines: &[Line], line: usize) -> bool {
    let sig_unsafe = find_word(std::slice::from_ref(&lines[line]), "unsafe").len() == 1;
    let mut k = line;
    while k > 0 {
        let raw = lines[k - 1].raw.trim();
        if raw.starts_with("///") {
            if raw.trim_start_matches('/').trim() == "# Safety" {
                return sig_unsafe;
            }
        } else if !raw.starts_with("#[") {
            break;
        }
        k -= 1;
    }
    false
}

/// The name of the `fn` declared on `line`.
fn fn_name(line: &Line) -> String {
    find_word(std::slice::from_ref(line), "fn")
        .first()
        .map(|&(_, c)| next_token(std::slice::from_ref(line), 0, c + 2))
        .unwrap_or_default()
}

/// An error when comment `c` relies on its caller ([`RELIES_ON_CALLER`]) but sits in no
/// `unsafe fn` whose doc states that contract in a `# Safety` section. Marks the
/// [`CALLER_CONTRACT_PENDING`] entry it matches in `used`.
fn caller_contract_unwritten(s: &Source, c: &SafetyComment, used: &mut [bool]) -> Option<String> {
    let t = format!(" {} ", normalize(&c.text));
    if !RELIES_ON_CALLER
        .iter()
        .any(|p| t.contains(&format!(" {} ", normalize(p))))
    {
        return None;
    }
    let f = enclosing_fn(&s.lines, c.start);
    if f.is_some_and(|f| has_safety_section(&s.lines, f)) {
        return None;
    }
    let name = f.map(|f| fn_name(&s.lines[f])).unwrap_or_default();
    if let Some(k) = CALLER_CONTRACT_PENDING
        .iter()
        .position(|(p, n, _)| *p == s.path && *n == name)
    {
        used[k] = true;
        return None;
    }
    Some(format!(
        "{}: this SAFETY comment relies on its caller, but `{name}` is not an `unsafe fn` whose \
         doc has a `# Safety` section stating that contract: write the contract there, or say \
         what establishes the invariant",
        s.at(c.start)
    ))
}

fn vague_safety_comments(s: &Source, used: &mut [bool]) -> Vec<String> {
    let mut errs = Vec::new();
    let mut prev_end = None;
    for c in safety_comments(&s.lines) {
        if substance(&c.text) < MIN_WORDS && !allowed_reference(s, &c, prev_end) {
            errs.push(format!(
                "{}: `SAFETY: {}` names no invariant: say what makes the block sound and where \
                 that is established",
                s.at(c.start),
                c.text
            ));
        }
        if let Some(e) = caller_contract_unwritten(s, &c, used) {
            errs.push(e);
        }
        prev_end = Some(c.end);
    }
    errs
}

#[test]
fn every_safety_comment_names_its_invariant() {
    let mut used = vec![false; CALLER_CONTRACT_PENDING.len()];
    let mut errs: Vec<String> = workspace_sources()
        .iter()
        .flat_map(|s| vague_safety_comments(s, &mut used))
        .collect();
    for (k, (p, n, _)) in CALLER_CONTRACT_PENDING.iter().enumerate() {
        if !used[k] {
            errs.push(format!(
                "CALLER_CONTRACT_PENDING entry {p} `{n}` matches nothing any more: delete it"
            ));
        }
    }
    report(
        errs,
        "rule 3: a SAFETY comment names the invariant, not only the caller",
    );
}

// ---- rules 4 and 5: no unchecked indexing, no references into device memory ----

fn unchecked_indexing(s: &Source) -> Vec<String> {
    if GET_UNCHECKED_ALLOWED.contains(&s.path.as_str()) {
        return Vec::new();
    }
    ["get_unchecked", "get_unchecked_mut"]
        .iter()
        .flat_map(|w| find_word(&s.lines, w))
        .map(|(l, _)| {
            format!(
                "{}: get_unchecked: index with a checked `get` (an index a device, file or peer \
                 supplies is checked), or add the file to GET_UNCHECKED_ALLOWED with its reason",
                s.at(l)
            )
        })
        .collect()
}

#[test]
fn no_unchecked_indexing() {
    let errs = workspace_sources()
        .iter()
        .flat_map(unchecked_indexing)
        .collect();
    report(
        errs,
        "rule 4: no get_unchecked outside GET_UNCHECKED_ALLOWED",
    );
}

fn device_memory_references(s: &Source) -> Vec<String> {
    if !DEVICE_MEMORY_FILES.contains(&s.path.as_str()) {
        return Vec::new();
    }
    let mut lines = s.lines.clone();
    drop_test_items(&mut lines);
    let mut errs = Vec::new();
    for (k, l) in lines.iter().enumerate() {
        for (pat, why) in DEVICE_MEMORY_FORBIDDEN {
            if l.code.contains(pat) {
                errs.push(format!("{}: `{pat}`: {why}; use volatile access", s.at(k)));
            }
        }
    }
    errs
}

#[test]
fn no_reference_into_device_memory() {
    let sources = workspace_sources();
    for f in DEVICE_MEMORY_FILES {
        assert!(
            sources.iter().any(|s| s.path == *f),
            "{f} is gone: update DEVICE_MEMORY_FILES"
        );
    }
    let errs = sources.iter().flat_map(device_memory_references).collect();
    report(
        errs,
        "rule 5: no Rust reference into BAR or device-written memory",
    );
}

mod checker;
