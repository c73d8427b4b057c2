//! Size-name renaming of an SFT example: the launcher's size parameters (`int64_t batch_size`,
//! `int64_t dim`, ...) given other names, the same way in the task's module, its launcher
//! declaration, its example shapes and the answer's kernel, so a model fine-tuned on them has
//! to copy the names the prompt states instead of recalling the ones a memorized kernel used
//! (a KernelBench problem names its sizes after its own module constants).
//!
//! A renaming is a pure alpha-renaming of whole identifiers: in C and CUDA every occurrence
//! except a member after `.` or `->` and a qualified name after `::`; in Python every occurrence except an attribute after `.`
//! (but `self.NAME`, the module's own) and a keyword argument (`dim=` inside parentheses). A new
//! name is never a word of any of the example's texts, so nothing is captured.
//! `crates/cudarl-torch/tests/task_modules.rs` checks on every operator family that the renamed
//! module still derives the renamed launcher and computes the same outputs.

use std::collections::BTreeMap;

use std::sync::LazyLock;

use cudarl_lex::c::IDENT;
use regex::Regex;

/// Text that ends where a Python `def`'s parameter list opens.
static DEF: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\bdef\s+\w+\s*$").expect("static regex"));

/// The names sizes are renamed to: the generic ones KernelBench's modules use for their sizes.
pub const NAMES: [&str; 14] = [
    "dim", "dim1", "dim2", "dim3", "dim4", "N", "M", "K", "L", "D", "size", "length", "features",
    "seq_len",
];

/// Old size name -> new name. The new names keep the old ones' order: the `i`-th size of the
/// launcher gets the `i`-th smallest new name.
#[derive(Debug, Clone, PartialEq)]
pub struct Renaming {
    map: BTreeMap<String, String>,
}

/// The size parameters of a launcher declaration, in order: its `int64_t` parameters.
pub fn size_names(signature: &str) -> Vec<String> {
    let Some(open) = signature.find('(') else {
        return vec![];
    };
    let body = &signature[open + 1..signature.rfind(')').unwrap_or(signature.len())];
    body.split(',')
        .filter_map(|p| {
            let p = p.trim();
            let name = p.strip_prefix("int64_t ")?.trim();
            IDENT.is_match(name).then(|| name.to_string())
        })
        .collect()
}

/// Whether `name` is used in `text` where a renaming would leave a use and change its
/// declaration: in C, as a member or qualified name (`.name`, `->name`, `::name`) or pasted by
/// the preprocessor (`name##`, `##name`); in Python (a text that imports torch, where an
/// attribute other than `self.name` is torch's), as a keyword argument (`name=` inside
/// parentheses) while it is also a parameter of the module's own function.
fn unsafe_use(text: &str, name: &str) -> bool {
    let word = Regex::new(&format!(r"\b{}\b", regex::escape(name))).expect("escaped");
    let python = text.contains("import torch");
    let mut keyword = false;
    for m in word.find_iter(text) {
        let (before, after) = (&text[..m.start()], &text[m.end()..]);
        if !python
            && (before.ends_with('.')
                || before.ends_with("->")
                || before.ends_with("::")
                || before.trim_end().ends_with("##")
                || after.trim_start().starts_with("##"))
        {
            return true;
        }
        let rest = after.trim_start_matches([' ', '\t']);
        let open = before
            .rfind('(')
            .filter(|&o| before[o..].matches(')').count() == 0);
        keyword |= open.is_some_and(|o| !DEF.is_match(&before[..o]))
            && rest.starts_with('=')
            && !rest.starts_with("==");
    }
    // A parameter of the module's own function (not `__init__` or `forward`, which the
    // harness calls by position).
    let param = Regex::new(&format!(
        r"\bdef\s+(\w+)\s*\([^)]*\b{}\b",
        regex::escape(name)
    ))
    .expect("escaped");
    keyword
        && param
            .captures_iter(text)
            .any(|c| !["__init__", "forward"].contains(&&c[1]))
}

/// What every renaming of one example draws from: its sizes and the names no text of it uses,
/// read once ([`Namer::new`]), then drawn per seed ([`Namer::draw`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Namer {
    sizes: Vec<String>,
    free: Vec<&'static str>,
}

impl Namer {
    /// The sizes of `signature` and the names of [`NAMES`] that no text of `texts` (and not
    /// the declaration) uses; `None` when the launcher has no sizes, a size has a use a
    /// renaming would miss ([`unsafe_use`]), or the names run out.
    pub fn new(signature: &str, texts: &[&str]) -> Option<Namer> {
        let sizes = size_names(signature);
        if sizes.is_empty() || sizes.iter().any(|s| texts.iter().any(|t| unsafe_use(t, s))) {
            return None;
        }
        let taken: std::collections::BTreeSet<&str> = texts
            .iter()
            .chain(std::iter::once(&signature))
            .flat_map(|t| IDENT.find_iter(t).map(|m| m.as_str()))
            .collect();
        let free: Vec<&'static str> = NAMES
            .iter()
            .copied()
            .filter(|n| !taken.contains(n))
            .collect();
        (free.len() >= sizes.len()).then_some(Namer { sizes, free })
    }

    /// The renaming of seed `seed`.
    pub fn draw(&self, seed: u64) -> Renaming {
        let mut free = self.free.clone();
        let mut picked: Vec<&str> = (0..self.sizes.len())
            .map(|i| {
                let h = blake3::hash(format!("{seed}/{i}").as_bytes());
                let k = u64::from_le_bytes(h.as_bytes()[..8].try_into().expect("8 bytes"));
                free.remove((k % free.len() as u64) as usize)
            })
            .collect();
        // In the sizes' order: `kb-specs` lists a module's sizes sorted by name, so a launcher
        // it derived stays the one it derives after the renaming.
        picked.sort_unstable();
        let map = self
            .sizes
            .iter()
            .cloned()
            .zip(picked)
            .map(|(s, n)| (s, n.to_string()))
            .collect();
        Renaming { map }
    }
}

impl Renaming {
    /// A renaming of every size of `signature` to a name of [`NAMES`] drawn by `seed`, none of
    /// them a word of any of `texts` (the example's module, kernels and declaration); `None`
    /// where [`Namer::new`] has none. Several draws of one example: [`Namer`].
    pub fn draw(signature: &str, texts: &[&str], seed: u64) -> Option<Renaming> {
        Namer::new(signature, texts).map(|n| n.draw(seed))
    }

    /// Old name -> new name, in the order of the old names.
    pub fn pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.map.iter().map(|(a, b)| (a.as_str(), b.as_str()))
    }

    /// The new name of `old`, or `old` itself.
    pub fn name<'a>(&'a self, old: &'a str) -> &'a str {
        self.map.get(old).map_or(old, String::as_str)
    }

    /// `code` (C, C++ or CUDA, or a launcher declaration) renamed: every whole identifier that
    /// is a size, except a member after `.` or `->` and a qualified name after `::`.
    pub fn c(&self, code: &str) -> String {
        self.replace(code, |before, _after, _depth| {
            !(before.ends_with('.') || before.ends_with("->") || before.ends_with("::"))
        })
    }

    /// `code` (Python, or prose with a Python block) renamed: every whole identifier that is a
    /// size, except an attribute after `.` that is not `self.NAME` and a keyword argument
    /// (`NAME=` inside parentheses).
    pub fn python(&self, code: &str) -> String {
        self.replace(code, |before, after, open| {
            let attribute = before.ends_with('.') && !before.ends_with("self.");
            let rest = after.trim_start_matches([' ', '\t']);
            // Inside a call's parentheses `NAME=` is a keyword; inside a `def`'s, a parameter
            // with its default.
            let keyword = open.is_some_and(|o| !DEF.is_match(&before[..o]))
                && rest.starts_with('=')
                && !rest.starts_with("==");
            !(attribute || keyword)
        })
    }

    /// A JSON object of sizes (`{"batch_size": 16, ...}`) with its keys renamed; other text as
    /// it is.
    pub fn shapes_json(&self, json: &str) -> String {
        self.replace(json, |before, after, _| {
            before.ends_with('"') && after.starts_with('"')
        })
    }

    /// `text` with every whole identifier that is a size replaced where `rename(text before
    /// it, text after it, byte index of the innermost parenthesis open there)` says so.
    fn replace(&self, text: &str, rename: impl Fn(&str, &str, Option<usize>) -> bool) -> String {
        let mut out = String::with_capacity(text.len() + 16);
        let mut last = 0;
        for m in IDENT.find_iter(text) {
            let Some(new) = self.map.get(m.as_str()) else {
                continue;
            };
            let before = &text[..m.start()];
            let mut open = Vec::new();
            for (i, b) in before.bytes().enumerate() {
                match b {
                    b'(' => open.push(i),
                    b')' => {
                        open.pop();
                    }
                    _ => {}
                }
            }
            if rename(before, &text[m.end()..], open.last().copied()) {
                out.push_str(&text[last..m.start()]);
                out.push_str(new);
                last = m.end();
            }
        }
        out.push_str(&text[last..]);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIG: &str = "extern \"C\" void launch(const float* in0, float* out, int64_t batch_size, int64_t dim, cudaStream_t stream)";

    #[test]
    fn the_sizes_of_a_launcher_are_its_int64_parameters() {
        assert_eq!(size_names(SIG), ["batch_size", "dim"]);
        assert!(
            size_names("extern \"C\" void launch(const float* x, float* out, cudaStream_t stream)")
                .is_empty()
        );
    }

    #[test]
    fn a_renaming_avoids_every_word_of_the_texts_and_is_seeded() {
        let kernel = "__global__ void k(const float* x, int64_t N) { int K = 0; }";
        for seed in 0..50 {
            let r = Renaming::draw(SIG, &[kernel], seed).expect("names left");
            let new: Vec<&str> = r.pairs().map(|p| p.1).collect();
            assert_eq!(new.len(), 2);
            // `dim` is a size itself, `N` and `K` are words of the kernel.
            for n in &new {
                assert!(!["dim", "N", "K", "batch_size"].contains(n), "{n}");
            }
            assert!(new[0] < new[1], "{new:?}: the sizes' order");
            assert_eq!(Some(r.clone()), Renaming::draw(SIG, &[kernel], seed));
        }
        let drawn: std::collections::BTreeSet<String> = (0..50)
            .map(|s| {
                Renaming::draw(SIG, &[kernel], s)
                    .unwrap()
                    .name("dim")
                    .to_string()
            })
            .collect();
        assert!(drawn.len() > 3, "{drawn:?}");
    }

    #[test]
    fn no_renaming_where_a_use_would_keep_the_old_name() {
        for text in [
            "struct P { int64_t dim; }; int64_t f(P p) { return p.dim; }",
            "int64_t g(const S* s) { return s->dim; }",
            "auto v = cfg::dim;",
            "#define CAT(a) a##dim",
            "import torch\ndef helper(x, dim):\n    return x\n\ny = helper(x, dim=dim)\n",
        ] {
            assert_eq!(Renaming::draw(SIG, &[text], 0), None, "{text}");
        }
        // A keyword of a torch call, with `dim` a parameter of `__init__`: renamed.
        let module = "import torch\nclass Model(nn.Module):\n    def __init__(self, dim):\n        self.dim = dim\n    def forward(self, x):\n        return torch.sum(x, dim=self.dim)\n";
        assert!(Renaming::draw(SIG, &[module], 0).is_some());
        // torch's attribute named like a size: renamed around it.
        let module = "import torch\nx = torch.rand(batch_size, dim)\nk = x.dim()\n";
        assert!(Renaming::draw(SIG, &[module], 0).is_some());
    }

    #[test]
    fn c_keeps_members_and_python_keeps_keywords_and_foreign_attributes() {
        let r = Renaming {
            map: [("dim", "L"), ("batch_size", "N")]
                .into_iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
        };
        assert_eq!(
            r.c("int64_t dim; s.dim = p->dim + dim_x + dim; // dim rows\nk<<<1,1>>>(batch_size, dim);"),
            "int64_t L; s.dim = p->dim + dim_x + L; // L rows\nk<<<1,1>>>(N, L);"
        );
        let py = "batch_size = 16\ndim = 8\n\nclass Model(nn.Module):\n    def __init__(self, dim=2):\n        super().__init__()\n        self.dim = dim\n\n    def forward(self, x):\n        return torch.sum(x, dim=self.dim, keepdim=x.dim() == dim)\n\ndef get_inputs():\n    return [torch.rand(batch_size, dim)]\n\ndef get_init_inputs():\n    return [dim]\n";
        assert_eq!(
            r.python(py),
            "N = 16\nL = 8\n\nclass Model(nn.Module):\n    def __init__(self, L=2):\n        super().__init__()\n        self.L = L\n\n    def forward(self, x):\n        return torch.sum(x, dim=self.L, keepdim=x.dim() == L)\n\ndef get_inputs():\n    return [torch.rand(N, L)]\n\ndef get_init_inputs():\n    return [L]\n"
        );
        assert_eq!(
            r.shapes_json("{\"batch_size\":16,\"dim\":8}"),
            "{\"N\":16,\"L\":8}"
        );
    }
}
