//! The scanner: in code already blanked (see `blank`), the module paths each `crate::`
//! and `super::` path names, and the inline modules a file declares.

use std::collections::BTreeSet;

use crate::tree::ModPath;

/// Whether `c` may be part of an identifier.
pub fn is_ident(c: u8) -> bool {
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
pub fn named_paths(code: &str, here: &ModPath) -> Vec<(usize, ModPath)> {
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

/// Inline `mod name {` blocks (outside test code), as modules of the file's module.
pub fn inline_modules(code: &str, here: &ModPath, out: &mut BTreeSet<ModPath>) {
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
