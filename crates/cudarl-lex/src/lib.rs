//! The project's two lexers, each the one place its language is read below the token level:
//! [`c`] for C, C++ and CUDA source (candidate kernels, extension sources, the task kernels) and
//! [`python`] for Python source (KernelBench modules, `ModelNew` files). Both blank what a rule
//! must not match inside (comments, string and character literals) with spaces, keeping every
//! newline and byte offset, so a match in the blanked text points into the original.
//!
//! Hand-written: what they must do is small (about 80 lines each), and the maintained
//! alternatives (tree-sitter grammars for CUDA and Python) build a full parser in C into every
//! cold build to answer the same question (docs/architecture.md, "Crates").

pub mod c {
    //! C, C++ and CUDA: comments, string and character literals, preprocessor lines, C++14
    //! digit separators; delimiter matching and identifiers.

    use std::sync::LazyLock;

    use regex::Regex;

    /// A C identifier (or keyword), as a whole word.
    pub static IDENT: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"\b[A-Za-z_]\w*\b").expect("static regex"));

    /// The byte index of the `}` that closes the `{` at byte `open` of `stripped`, or `None` when
    /// it is not closed. Braces in comments and literals count: blank them first
    /// ([`strip_comments_and_strings`]) where that matters.
    pub fn matching_brace(stripped: &str, open: usize) -> Option<usize> {
        matching(stripped, open, ('{', '}'))
    }

    /// The byte index of the `)` that closes the `(` at byte `open`, as [`matching_brace`].
    pub fn matching_paren(stripped: &str, open: usize) -> Option<usize> {
        matching(stripped, open, ('(', ')'))
    }

    fn matching(stripped: &str, open: usize, (o, c): (char, char)) -> Option<usize> {
        let mut depth = 0i64;
        for (i, ch) in stripped[open..].char_indices() {
            if ch == o {
                depth += 1;
            } else if ch == c {
                depth -= 1;
                if depth == 0 {
                    return Some(open + i);
                }
            }
        }
        None
    }

    /// Blanks out `//` and `/* */` comments and string/char literals (keeping newlines and
    /// offsets), so rules do not match inside them. `#include` lines are kept whole.
    pub fn strip_comments_and_strings(src: &str) -> String {
        strip(src, true)
    }

    /// Blanks out comments only (string literals kept).
    pub fn strip_comments(src: &str) -> String {
        strip(src, false)
    }

    fn strip(src: &str, strings: bool) -> String {
        let b = src.as_bytes();
        let mut out = Vec::with_capacity(b.len());
        let mut i = 0;
        let mut line_start = true;
        while i < b.len() {
            let c = b[i];
            if line_start && c == b'#' {
                // preprocessor line: copy verbatim (include names are quoted)
                while i < b.len() && b[i] != b'\n' {
                    out.push(b[i]);
                    i += 1;
                }
                continue;
            }
            if !c.is_ascii_whitespace() {
                line_start = false;
            }
            if c == b'\n' {
                line_start = true;
                out.push(c);
                i += 1;
            } else if c == b'/' && i + 1 < b.len() && b[i + 1] == b'/' {
                while i < b.len() && b[i] != b'\n' {
                    out.push(b' ');
                    i += 1;
                }
            } else if c == b'/' && i + 1 < b.len() && b[i + 1] == b'*' {
                out.extend([b' ', b' ']);
                i += 2;
                while i < b.len() && !(b[i] == b'*' && i + 1 < b.len() && b[i + 1] == b'/') {
                    out.push(if b[i] == b'\n' { b'\n' } else { b' ' });
                    i += 1;
                }
                if i < b.len() {
                    out.extend([b' ', b' ']);
                    i += 2;
                }
            } else if c == b'\'' && digit_separator(b, i) {
                // C++14 digit separator (`1'000`, `0xFF'FF`): part of a number, not a literal.
                out.push(c);
                i += 1;
            } else if strings && (c == b'"' || c == b'\'') {
                out.push(b' ');
                i += 1;
                while i < b.len() && b[i] != c && b[i] != b'\n' {
                    if b[i] == b'\\' && i + 1 < b.len() {
                        out.push(b' ');
                        i += 1;
                    }
                    out.push(b' ');
                    i += 1;
                }
                if i < b.len() && b[i] == c {
                    out.push(b' ');
                    i += 1;
                }
            } else {
                out.push(c);
                i += 1;
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    /// Whether the `'` at `i` separates digits of a number (C++14): the token it follows is a
    /// pp-number (starts with a digit, or `.` and a digit) and a hex digit follows. `u8'a'` and
    /// `L'a'` are character literals (their token starts with a letter).
    fn digit_separator(b: &[u8], i: usize) -> bool {
        if i == 0 || i + 1 >= b.len() || !b[i + 1].is_ascii_hexdigit() {
            return false;
        }
        let mut j = i;
        while j > 0
            && (b[j - 1].is_ascii_alphanumeric()
                || b[j - 1] == b'_'
                || b[j - 1] == b'.'
                || b[j - 1] == b'\'')
        {
            j -= 1;
        }
        j < i && (b[j].is_ascii_digit() || (b[j] == b'.' && j + 1 < i && b[j + 1].is_ascii_digit()))
    }
}

pub mod python {
    //! Python: `#` comments, single-, double- and triple-quoted string literals with escapes.

    /// Replaces comments and string literals (including triple-quoted docstrings) by spaces,
    /// keeping line structure and byte offsets.
    pub fn strip_comments_and_strings(src: &str) -> String {
        let b = src.as_bytes();
        let mut out = Vec::with_capacity(b.len());
        let mut i = 0;
        while i < b.len() {
            let c = b[i];
            if c == b'#' {
                while i < b.len() && b[i] != b'\n' {
                    out.push(b' ');
                    i += 1;
                }
            } else if c == b'\'' || c == b'"' {
                let triple = i + 2 < b.len() && b[i + 1] == c && b[i + 2] == c;
                let qlen = if triple { 3 } else { 1 };
                out.extend(std::iter::repeat_n(b' ', qlen));
                i += qlen;
                while i < b.len() {
                    if b[i] == b'\\' && i + 1 < b.len() {
                        out.extend([b' ', if b[i + 1] == b'\n' { b'\n' } else { b' ' }]);
                        i += 2;
                        continue;
                    }
                    if triple && i + 2 < b.len() && b[i] == c && b[i + 1] == c && b[i + 2] == c {
                        out.extend([b' ', b' ', b' ']);
                        i += 3;
                        break;
                    }
                    if !triple && (b[i] == c || b[i] == b'\n') {
                        out.push(if b[i] == b'\n' { b'\n' } else { b' ' });
                        i += 1;
                        break;
                    }
                    out.push(if b[i] == b'\n' { b'\n' } else { b' ' });
                    i += 1;
                }
            } else {
                out.push(c);
                i += 1;
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::{c, python};

    #[test]
    fn c_blanks_comments_and_literals_and_keeps_offsets() {
        let src = "int a = 1'000; // x{\nconst char* s = \"}{\\\"\"; /* {\n} */ char q = '{';\n#include \"k.h\"\n";
        let out = c::strip_comments_and_strings(src);
        assert_eq!(out.len(), src.len());
        assert_eq!(out.matches('\n').count(), src.matches('\n').count());
        assert!(
            out.contains("1'000"),
            "a digit separator is part of its number: {out}"
        );
        assert!(!out.contains('{') && !out.contains('}'), "{out}");
        assert!(
            out.contains("#include \"k.h\""),
            "preprocessor lines stay whole: {out}"
        );
        let comments_only = c::strip_comments(src);
        assert!(comments_only.contains("\"}{\\\"\""), "{comments_only}");
        assert!(!comments_only.contains("x{"), "{comments_only}");
    }

    #[test]
    fn c_matches_delimiters_and_finds_identifiers() {
        let s = "f(a, (b)) { if (x) { y(); } }";
        assert_eq!(c::matching_paren(s, 1), Some(8));
        assert_eq!(c::matching_brace(s, 10), Some(s.len() - 1));
        assert_eq!(c::matching_brace("{ {", 0), None);
        let ids: Vec<&str> = c::IDENT
            .find_iter("launch(in0, _n2)")
            .map(|m| m.as_str())
            .collect();
        assert_eq!(ids, ["launch", "in0", "_n2"]);
    }

    #[test]
    fn python_blanks_comments_and_every_string_form() {
        let src = "x = 'a#b'  # torch.relu(\ny = \"\"\"doc\ntorch.exp(\"\"\" + \"q\\\"r\"\nz = torch.tanh(x)\n";
        let out = python::strip_comments_and_strings(src);
        assert_eq!(out.len(), src.len());
        assert_eq!(out.matches('\n').count(), src.matches('\n').count());
        assert!(
            !out.contains("relu") && !out.contains("exp") && !out.contains("doc"),
            "{out}"
        );
        assert!(out.contains("z = torch.tanh(x)"), "{out}");
    }
}
