//! Reading a Rust source file for the rules: its code with comments and literals blanked,
//! and its `//` comments, line by line. Blanking keeps every line break and every column,
//! so a line or column found in the code is the source's.

/// One line of a source file.
#[derive(Debug, Default, Clone)]
pub struct Line {
    /// The line as written.
    pub raw: String,
    /// The code of the line, with comments and string and character literals blanked.
    pub code: String,
    /// The text after `//` of a plain line comment on this line (not `///` or `//!`).
    pub comment: Option<String>,
}

/// The lines of `src`: code blanked of comments and literals, and each line's comment.
pub fn lines(src: &str) -> Vec<Line> {
    let b = src.as_bytes();
    let mut code = Vec::with_capacity(b.len());
    let mut comments: Vec<(usize, String)> = Vec::new();
    let (mut i, mut line) = (0usize, 0usize);
    while i < b.len() {
        let at = |s: &[u8]| b[i..].starts_with(s);
        let c = b[i];
        if at(b"//") {
            let end = b[i..]
                .iter()
                .position(|&x| x == b'\n')
                .map_or(b.len(), |p| i + p);
            let text = &src[i + 2..end];
            if !text.starts_with('/') && !text.starts_with('!') {
                comments.push((line, text.to_string()));
            }
            code.resize(code.len() + (end - i), b' ');
            i = end;
        } else if at(b"/*") {
            i = skip_block_comment(b, i, &mut code, &mut line);
        } else if (at(b"r\"") || at(b"r#") || at(b"br\"") || at(b"br#")) && word_starts(b, i) {
            i = skip_raw_string(b, i, &mut code, &mut line);
        } else if c == b'"' {
            i = skip_string(b, i, &mut code, &mut line);
        } else if c == b'\'' {
            i = skip_char(b, i, &mut code);
        } else {
            if c == b'\n' {
                line += 1;
            }
            code.push(c);
            i += 1;
        }
    }
    let code = String::from_utf8(code).expect("blanking keeps utf-8");
    let mut out: Vec<Line> = code
        .split('\n')
        .zip(src.split('\n'))
        .map(|(l, raw)| Line {
            raw: raw.to_string(),
            code: l.to_string(),
            comment: None,
        })
        .collect();
    for (l, text) in comments {
        out[l].comment = Some(text);
    }
    out
}

/// Whether an identifier character.
pub fn is_ident(c: u8) -> bool {
    c == b'_' || c.is_ascii_alphanumeric()
}

/// Whether `b[i]` starts a word (is not inside an identifier such as `for"`).
fn word_starts(b: &[u8], i: usize) -> bool {
    i == 0 || !is_ident(b[i - 1])
}

/// Blanks `b[from..to]` into `out`, keeping line breaks.
fn blank(b: &[u8], from: usize, to: usize, out: &mut Vec<u8>, line: &mut usize) {
    for &x in &b[from..to] {
        if x == b'\n' {
            *line += 1;
            out.push(b'\n');
        } else {
            out.push(b' ');
        }
    }
}

fn skip_block_comment(b: &[u8], i: usize, out: &mut Vec<u8>, line: &mut usize) -> usize {
    let (mut j, mut depth) = (i, 0);
    while j < b.len() {
        if b[j..].starts_with(b"/*") {
            depth += 1;
            j += 2;
        } else if b[j..].starts_with(b"*/") {
            depth -= 1;
            j += 2;
            if depth == 0 {
                break;
            }
        } else {
            j += 1;
        }
    }
    let j = j.min(b.len());
    blank(b, i, j, out, line);
    j
}

fn skip_raw_string(b: &[u8], i: usize, out: &mut Vec<u8>, line: &mut usize) -> usize {
    let mut j = i + if b[i] == b'b' { 2 } else { 1 };
    let mut hashes = 0;
    while b.get(j) == Some(&b'#') {
        hashes += 1;
        j += 1;
    }
    if b.get(j) != Some(&b'"') {
        // `r#ident` (a raw identifier) or an `r` that starts no literal: code.
        out.extend_from_slice(&b[i..j]);
        return j;
    }
    let close: Vec<u8> = std::iter::once(b'"')
        .chain(std::iter::repeat_n(b'#', hashes))
        .collect();
    let end = b[j + 1..]
        .windows(close.len())
        .position(|w| w == close.as_slice())
        .map_or(b.len(), |p| j + 1 + p + close.len());
    blank(b, i, end, out, line);
    end
}

fn skip_string(b: &[u8], i: usize, out: &mut Vec<u8>, line: &mut usize) -> usize {
    let mut j = i + 1;
    while j < b.len() && b[j] != b'"' {
        j += if b[j] == b'\\' { 2 } else { 1 };
    }
    let end = (j + 1).min(b.len());
    blank(b, i, end, out, line);
    end
}

/// A character literal (`'x'`, `'\n'`, `'\u{..}'`, `'é'`) is blanked; a lifetime or label
/// (`'a`) is kept as code.
fn skip_char(b: &[u8], i: usize, out: &mut Vec<u8>) -> usize {
    let end = if b.get(i + 1) == Some(&b'\\') {
        b[i + 2..]
            .iter()
            .position(|&x| x == b'\'')
            .map(|p| i + 2 + p + 1)
    } else {
        // One character (up to 4 bytes of UTF-8) and the closing quote.
        let n = match b.get(i + 1) {
            Some(&c) if c < 0x80 => 1,
            Some(&c) if c >= 0xf0 => 4,
            Some(&c) if c >= 0xe0 => 3,
            Some(_) => 2,
            None => 0,
        };
        (n > 0 && b.get(i + 1 + n) == Some(&b'\'')).then_some(i + 2 + n)
    };
    match end {
        Some(e) => {
            // A literal holds no line break: blanks of its length.
            out.resize(out.len() + (e - i), b' ');
            e
        }
        None => {
            out.push(b'\'');
            i + 1
        }
    }
}

/// The positions (line, column) of the word `w` in the code of `lines`.
pub fn find_word(lines: &[Line], w: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for (n, l) in lines.iter().enumerate() {
        let b = l.code.as_bytes();
        let mut from = 0;
        while let Some(p) = l.code[from..].find(w) {
            let at = from + p;
            let end = at + w.len();
            if (at == 0 || !is_ident(b[at - 1])) && (end == b.len() || !is_ident(b[end])) {
                out.push((n, at));
            }
            from = end;
        }
    }
    out
}

/// The code after (line, column) up to the next non-blank text: the next token's start.
pub fn next_token(lines: &[Line], line: usize, col: usize) -> String {
    let mut rest = lines[line].code[col..].to_string();
    let mut n = line;
    while rest.trim().is_empty() && n + 1 < lines.len() {
        n += 1;
        rest = lines[n].code.clone();
    }
    let t = rest.trim_start();
    let end = t
        .char_indices()
        .find(|&(k, c)| k > 0 && !(c == '_' || c.is_ascii_alphanumeric()))
        .map_or(t.len(), |(k, _)| k);
    t[..end.max(t.len().min(1))].to_string()
}

/// Blanks the code of every item marked `#[cfg(test)]` (a module, a function, an impl):
/// from the attribute to the end of the item's braces, or to its `;`.
pub fn drop_test_items(lines: &mut [Line]) {
    let mut k = 0;
    while k < lines.len() {
        let Some(col) = lines[k].code.find("#[cfg(test)]") else {
            k += 1;
            continue;
        };
        let (mut depth, mut started) = (0i32, false);
        let (mut n, mut c) = (k, col);
        'item: while n < lines.len() {
            let bytes: Vec<u8> = lines[n].code.bytes().collect();
            while c < bytes.len() {
                match bytes[c] {
                    b'{' => {
                        depth += 1;
                        started = true;
                    }
                    b'}' => depth -= 1,
                    b';' if !started => {
                        blank_range(lines, (k, col), (n, c + 1));
                        break 'item;
                    }
                    _ => {}
                }
                c += 1;
                if started && depth == 0 {
                    blank_range(lines, (k, col), (n, c));
                    break 'item;
                }
            }
            n += 1;
            c = 0;
        }
        k += 1;
    }
}

/// Blanks the code from `from` to `to` (line, column; `to` exclusive).
fn blank_range(lines: &mut [Line], from: (usize, usize), to: (usize, usize)) {
    for (n, l) in lines.iter_mut().enumerate().take(to.0 + 1).skip(from.0) {
        let start = if n == from.0 { from.1 } else { 0 };
        let end = if n == to.0 { to.1 } else { l.code.len() };
        let mut b = l.code.clone().into_bytes();
        let end = end.min(b.len());
        for x in &mut b[start..end] {
            *x = b' ';
        }
        l.code = String::from_utf8(b).expect("blanking keeps utf-8");
    }
}
