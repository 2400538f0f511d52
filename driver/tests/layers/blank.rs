//! What is not code, blanked: comments, string and character literals, and the items
//! marked `#[cfg(test)]`. Blanking keeps every line break, so a line number found in the
//! result is the line of the source.

use crate::scan::is_ident;

/// Blanks comments, string and character literals (keeping line breaks), so only code is
/// left to scan.
pub fn strip(src: &str) -> String {
    let mut s = Stripper {
        b: src.as_bytes(),
        out: Vec::with_capacity(src.len()),
        i: 0,
    };
    while s.i < s.b.len() {
        let c = s.b[s.i];
        if s.at(b"//") {
            s.line_comment();
        } else if s.at(b"/*") {
            s.block_comment();
        } else if (s.at(b"r\"") || s.at(b"r#")) && s.raw_prefix_starts_here() {
            s.raw_string();
        } else if c == b'"' {
            s.string();
        } else if c == b'\'' {
            s.char_literal();
        } else {
            s.keep();
        }
    }
    String::from_utf8(s.out).expect("blanking keeps utf-8")
}

/// The source being blanked (`b`), what is kept of it so far (`out`) and where the scan is
/// (`i`): each step reads one token from `i` on and writes as many bytes as it read.
struct Stripper<'a> {
    b: &'a [u8],
    out: Vec<u8>,
    i: usize,
}

/// A space for `c`, or the line break it is.
fn blank(out: &mut Vec<u8>, c: u8) {
    out.push(if c == b'\n' { b'\n' } else { b' ' });
}

impl Stripper<'_> {
    fn at(&self, s: &[u8]) -> bool {
        self.b[self.i..].starts_with(s)
    }

    /// Code: kept as it is.
    fn keep(&mut self) {
        self.out.push(self.b[self.i]);
        self.i += 1;
    }

    fn blank_next(&mut self) {
        blank(&mut self.out, self.b[self.i]);
        self.i += 1;
    }

    /// `// ...`, up to its line break (kept: it is code's).
    fn line_comment(&mut self) {
        while self.i < self.b.len() && self.b[self.i] != b'\n' {
            self.out.push(b' ');
            self.i += 1;
        }
    }

    /// `/* ... */`, the nested ones inside it included.
    fn block_comment(&mut self) {
        let mut depth = 0;
        while self.i < self.b.len() {
            if self.at(b"/*") {
                depth += 1;
                self.out.extend_from_slice(b"  ");
                self.i += 2;
            } else if self.at(b"*/") {
                depth -= 1;
                self.out.extend_from_slice(b"  ");
                self.i += 2;
                if depth == 0 {
                    break;
                }
            } else {
                self.blank_next();
            }
        }
    }

    /// Whether the `r` at `i` starts a word (`r"`), or follows a `b` that does (`br"`):
    /// not the end of an identifier such as `for`.
    fn raw_prefix_starts_here(&self) -> bool {
        let (b, i) = (self.b, self.i);
        i == 0 || !is_ident(b[i - 1]) || b[i - 1] == b'b' && (i < 2 || !is_ident(b[i - 2]))
    }

    /// Raw string: `r"..."` or `r#"..."#`. An `r` followed by `#`s and no quote starts
    /// none: it is kept as code.
    fn raw_string(&mut self) {
        let (b, i) = (self.b, self.i);
        let mut j = i + 1;
        let mut hashes = 0;
        while b.get(j) == Some(&b'#') {
            hashes += 1;
            j += 1;
        }
        if b.get(j) != Some(&b'"') {
            self.keep();
            return;
        }
        let close: Vec<u8> = std::iter::once(b'"')
            .chain(std::iter::repeat_n(b'#', hashes))
            .collect();
        let end = b[j + 1..]
            .windows(close.len())
            .position(|w| w == close.as_slice())
            .map_or(b.len(), |p| j + 1 + p + close.len());
        for &x in &b[i..end] {
            blank(&mut self.out, x);
        }
        self.i = end;
    }

    /// `"..."`, its escapes (`\"`) included.
    fn string(&mut self) {
        self.out.push(b' ');
        self.i += 1;
        while self.i < self.b.len() && self.b[self.i] != b'"' {
            if self.b[self.i] == b'\\' {
                self.blank_next();
            }
            if self.i < self.b.len() {
                self.blank_next();
            }
        }
        self.out.push(b' ');
        self.i += 1;
    }

    /// A character literal (`'x'`, `'\n'`, `'\u{..}'`); a lifetime (`'a`) is kept as code.
    fn char_literal(&mut self) {
        let (b, i) = (self.b, self.i);
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
                self.out.extend(std::iter::repeat_n(b' ', e + 1 - i));
                self.i = e + 1;
            }
            None => self.keep(),
        }
    }
}

/// Blanks every item marked `#[cfg(test)]` (a test module, a test-only function).
pub fn drop_test_items(code: &str) -> String {
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
