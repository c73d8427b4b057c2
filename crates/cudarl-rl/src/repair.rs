//! Broken variants of correct kernels, for the optimizer's repair examples in `sft-data`.
//!
//! In a multi-turn episode the optimizer also revises kernels that failed: the generator's
//! answer did not compile, or had no code block. Its SFT data otherwise holds only (correct,
//! slower) -> faster pairs, so after SFT it copies a broken kernel instead of fixing it and
//! a second turn adds nothing over the first (H100, 2026-11-22: multi-turn pass rate 0.241,
//! single-turn 0.241, `benchmarks/results/rl_warmup_h100_2026-11-22.json`). A repair example shows
//! the optimizer a kernel broken the way a small model breaks one (a dropped `;`, a misspelled
//! variable, a missing `}`), the tester's real feedback on it (nvcc's diagnostics through the same
//! [`crate::episode::feedback`] RL and eval print), and the correct kernel as the answer.

/// What was broken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Breakage {
    /// A statement's `;` removed.
    MissingSemicolon,
    /// A local variable declared under one name and used under another (`identifier ... is
    /// undefined`).
    UndeclaredIdentifier,
    /// The first kernel's closing `}` removed.
    MissingBrace,
}

impl Breakage {
    /// Every kind, in the order [`break_kernel`]'s `variant` picks them.
    pub const ALL: [Breakage; 3] = [
        Breakage::MissingSemicolon,
        Breakage::UndeclaredIdentifier,
        Breakage::MissingBrace,
    ];

    /// Its name in the `sft_optimizer` table's `kind` column (`repair:<name>`).
    pub fn name(self) -> &'static str {
        match self {
            Breakage::MissingSemicolon => "missing_semicolon",
            Breakage::UndeclaredIdentifier => "undeclared_identifier",
            Breakage::MissingBrace => "missing_brace",
        }
    }
}

/// The byte range of the body of the first `__global__` function (from its `{` to the
/// matching `}`, both included), or `None`.
fn first_kernel_body(code: &str) -> Option<(usize, usize)> {
    let g = code.find("__global__")?;
    let open = g + code[g..].find('{')?;
    cudarl_lex::c::matching_brace(code, open).map(|close| (open, close))
}

/// `code` broken in the way `Breakage::ALL[variant % 3]` says, choosing among candidate
/// places by `pick` (any number: a seed); `None` when the kernel has no such place (then try
/// another variant). Only the first `__global__` function's body is touched, so the error
/// is in device code as a model's would be.
pub fn break_kernel(code: &str, variant: usize, pick: u64) -> Option<(String, Breakage)> {
    let kind = Breakage::ALL[variant % Breakage::ALL.len()];
    let (open, close) = first_kernel_body(code)?;
    let body = &code[open..=close];
    let out = match kind {
        Breakage::MissingSemicolon => {
            // Statement ends: a `;` at the end of a line (not inside a `for (...)` header).
            let ends: Vec<usize> = body
                .match_indices(";\n")
                .map(|(i, _)| i)
                .filter(|&i| {
                    let line_start = body[..i].rfind('\n').map_or(0, |s| s + 1);
                    !body[line_start..i].trim_start().starts_with("for")
                })
                .collect();
            if ends.is_empty() {
                return None;
            }
            let at = open + ends[(pick % ends.len() as u64) as usize];
            format!("{}{}", &code[..at], &code[at + 1..])
        }
        Breakage::UndeclaredIdentifier => {
            // `<type> name = ...;` declarations whose name is used again later in the body.
            let types = [
                "int ",
                "const int ",
                "int64_t ",
                "const int64_t ",
                "float ",
                "size_t ",
            ];
            let mut decls: Vec<(usize, String)> = Vec::new();
            for line_start in std::iter::once(0).chain(body.match_indices('\n').map(|(i, _)| i + 1))
            {
                let line = &body[line_start..];
                let line = &line[..line.find('\n').unwrap_or(line.len())];
                let t = line.trim_start();
                let indent = line.len() - t.len();
                for ty in types {
                    let Some(rest) = t.strip_prefix(ty) else {
                        continue;
                    };
                    let name: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    let after = rest[name.len()..].trim_start();
                    if name.is_empty() || !after.starts_with('=') {
                        continue;
                    }
                    let decl_end = line_start + line.len();
                    let used_later = body[decl_end..]
                        .match_indices(name.as_str())
                        .any(|(j, _)| is_word(&body[decl_end..], j, name.len()));
                    if used_later {
                        decls.push((line_start + indent + ty.len(), name));
                    }
                    break;
                }
            }
            if decls.is_empty() {
                return None;
            }
            let (at, name) = &decls[(pick % decls.len() as u64) as usize];
            // The declaration gets a different name; the uses keep the old one.
            let renamed = format!("{name}_val");
            let at = open + at;
            format!("{}{}{}", &code[..at], renamed, &code[at + name.len()..])
        }
        Breakage::MissingBrace => format!("{}{}", &code[..close], &code[close + 1..]),
    };
    (out != code).then_some((out, kind))
}

/// Whether `s[j..j + len]` is a whole identifier (no identifier character either side).
fn is_word(s: &str, j: usize, len: usize) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let before = s[..j].chars().next_back().is_none_or(|c| !ident(c));
    let after = s[j + len..].chars().next().is_none_or(|c| !ident(c));
    before && after
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: &str = "#include <cuda_runtime.h>\n__global__ void relu(const float* x, float* y, int64_t n) {\n    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;\n    if (i < n) {\n        y[i] = fmaxf(x[i], 0.0f);\n    }\n}\nextern \"C\" void launch(const float* x, float* y, int64_t n, cudaStream_t s) {\n    relu<<<(n + 255) / 256, 256, 0, s>>>(x, y, n);\n}\n";

    #[test]
    fn each_breakage_changes_only_the_kernel_body() {
        let (semi, k) = break_kernel(K, 0, 0).unwrap();
        assert_eq!(k, Breakage::MissingSemicolon);
        assert_eq!(semi.len(), K.len() - 1);
        assert!(semi.contains("threadIdx.x\n"), "{semi}");
        let (undecl, k) = break_kernel(K, 1, 0).unwrap();
        assert_eq!(k, Breakage::UndeclaredIdentifier);
        assert!(undecl.contains("int64_t i_val = blockIdx.x"), "{undecl}");
        assert!(undecl.contains("if (i < n)"), "uses keep the old name");
        let (brace, k) = break_kernel(K, 2, 0).unwrap();
        assert_eq!(k, Breakage::MissingBrace);
        assert!(brace.contains("    }\n\nextern"), "{brace}");
        // The launcher is never touched.
        for b in [&semi, &undecl, &brace] {
            assert!(b.ends_with("relu<<<(n + 255) / 256, 256, 0, s>>>(x, y, n);\n}\n"));
        }
        // `for` headers keep their `;`s; a kernel without a __global__ has nothing to break.
        assert!(break_kernel("int main() { return 0; }\n", 0, 0).is_none());
    }
}
