//! Static extraction of the torch operations a KernelBench reference uses.
//!
//! The scanner removes comments and string literals, drops the input-generator functions
//! (`get_inputs`, `get_init_inputs`) and top-level statements, then finds call chains
//! (`torch.matmul(`, `F.gelu(`, `nn.Conv2d(`, `x.sum(`) and, inside `forward`, binary tensor
//! operators (`+ - * / @ **`). Features are normalized strings:
//!
//! | feature | from |
//! |---|---|
//! | `torch.<fn>` | `torch.<fn>(`, `torch.linalg.<fn>(`, `torch.special.<fn>(` |
//! | `F.<fn>` | `F.<fn>(`, `torch.nn.functional.<fn>(` |
//! | `nn.<Module>` | `nn.<Module>(`, `torch.nn.<Module>(` (container modules excluded) |
//! | `Tensor.<method>` | `<expr>.<method>(` for known tensor methods |
//! | `op.<name>` | binary operators in `forward`: add, sub, mul, div, matmul, pow |
//!
//! This is static and approximate (no type inference); it is the input of tier assignment,
//! which is rule-based data (`configs/curriculum/op_categories.toml`), and, one name per op
//! ([`op_names`]), of the op coverage `eval` splits KernelBench hold-out problems by
//! ([`OpCoverage`]).

use std::collections::BTreeSet;
use std::sync::LazyLock;

use regex::Regex;

/// Tensor methods recognized in `expr.method(` calls.
const TENSOR_METHODS: &[&str] = &[
    "abs",
    "add",
    "all",
    "amax",
    "amin",
    "any",
    "argmax",
    "argmin",
    "bmm",
    "cat",
    "chunk",
    "clamp",
    "clamp_min",
    "clamp_max",
    "clip",
    "contiguous",
    "cos",
    "cumprod",
    "cumsum",
    "div",
    "exp",
    "expand",
    "expand_as",
    "flatten",
    "flip",
    "gather",
    "log",
    "log_softmax",
    "logsumexp",
    "masked_fill",
    "matmul",
    "max",
    "mean",
    "min",
    "mm",
    "mul",
    "narrow",
    "neg",
    "norm",
    "permute",
    "pow",
    "prod",
    "reciprocal",
    "relu",
    "repeat",
    "reshape",
    "roll",
    "rsqrt",
    "scatter",
    "sigmoid",
    "sign",
    "sin",
    "softmax",
    "split",
    "sqrt",
    "square",
    "squeeze",
    "std",
    "sub",
    "sum",
    "t",
    "tanh",
    "transpose",
    "tril",
    "triu",
    "unfold",
    "unsqueeze",
    "var",
    "view",
    "view_as",
    "where",
    "index_select",
    "masked_select",
    "diag",
    "diagonal",
    "erf",
    "floor",
    "ceil",
    "round",
    "maximum",
    "minimum",
    "sort",
    "topk",
    "addmm",
    "baddbmm",
    "einsum",
];

/// `torch.X` calls that create or manage tensors rather than compute (ignored).
const TORCH_NON_OPS: &[&str] = &[
    "rand",
    "randn",
    "randint",
    "rand_like",
    "randn_like",
    "zeros",
    "ones",
    "empty",
    "full",
    "tensor",
    "as_tensor",
    "arange",
    "linspace",
    "zeros_like",
    "ones_like",
    "empty_like",
    "full_like",
    "manual_seed",
    "no_grad",
    "device",
    "is_tensor",
    "Size",
    "from_numpy",
    "set_default_dtype",
    "get_default_dtype",
    "inference_mode",
    "enable_grad",
    "jit",
    "compile",
    "finfo",
    "iinfo",
];

/// `nn.X` constructors that are containers or parameters (ignored).
const NN_NON_OPS: &[&str] = &[
    "Module",
    "Parameter",
    "Sequential",
    "ModuleList",
    "ModuleDict",
    "ParameterList",
    "ParameterDict",
    "Identity",
];

static CALL: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"([A-Za-z_][A-Za-z0-9_]*(?:\s*\.\s*[A-Za-z_][A-Za-z0-9_]*)*)\s*\(").expect("regex")
});
static BINOP: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"[A-Za-z0-9_\)\]]\s*(\*\*|[+\-*/@])=?\s*[A-Za-z0-9_\(\-\.]").expect("regex")
});

/// Splits cleaned source into (model part, forward bodies): the model part is everything
/// inside top-level `class` blocks; forward bodies are the `def forward` blocks in them.
fn model_parts(clean: &str) -> (String, String) {
    let mut model = String::new();
    let mut forward = String::new();
    let mut in_class = false;
    let mut fwd_indent: Option<usize> = None;
    for line in clean.lines() {
        let trimmed = line.trim_start();
        if trimmed.is_empty() {
            continue;
        }
        let indent = line.len() - trimmed.len();
        if indent == 0 {
            in_class = trimmed.starts_with("class ");
            fwd_indent = None;
            continue;
        }
        if !in_class {
            continue;
        }
        model.push_str(line);
        model.push('\n');
        if let Some(fi) = fwd_indent {
            if indent > fi {
                forward.push_str(line);
                forward.push('\n');
                continue;
            }
            fwd_indent = None;
        }
        if trimmed.starts_with("def forward") {
            fwd_indent = Some(indent);
        }
    }
    (model, forward)
}

fn classify_chain(chain: &str, preceded_by_dot: bool) -> Option<String> {
    let parts: Vec<&str> = chain.split('.').map(str::trim).collect();
    let last = *parts.last()?;
    let join = |p: &[&str]| p.join(".");
    if preceded_by_dot {
        return TENSOR_METHODS
            .contains(&parts[0])
            .then(|| format!("Tensor.{}", parts[0]));
    }
    match parts.as_slice() {
        ["torch", "nn", "functional", f] | ["F", f] | ["nn", "functional", f] => {
            Some(format!("F.{f}"))
        }
        ["torch", "nn", m] | ["nn", m]
            if m.chars().next().is_some_and(|c| c.is_ascii_uppercase()) =>
        {
            (!NN_NON_OPS.contains(m)).then(|| format!("nn.{m}"))
        }
        ["torch", f] => (!TORCH_NON_OPS.contains(f)).then(|| format!("torch.{f}")),
        ["torch", "linalg" | "special" | "fft", _] => Some(format!("torch.{}", join(&parts[1..]))),
        [_, .., _]
            if parts.len() >= 2
                && parts[0] != "torch"
                && parts[0] != "nn"
                && parts[0] != "self" =>
        {
            TENSOR_METHODS
                .contains(&last)
                .then(|| format!("Tensor.{last}"))
        }
        ["self", _, ..] if parts.len() >= 3 => TENSOR_METHODS
            .contains(&last)
            .then(|| format!("Tensor.{last}")),
        _ => None,
    }
}

/// Extracts op features from a KernelBench reference module (sorted, unique).
pub fn extract_op_features(code: &str) -> Vec<String> {
    let clean = cudarl_lex::python::strip_comments_and_strings(code);
    let (model, forward) = model_parts(&clean);
    let mut feats = BTreeSet::new();
    for m in CALL.captures_iter(&model) {
        let whole = m.get(1).expect("group");
        let chain: String = whole
            .as_str()
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        let before = model[..whole.start()].trim_end();
        let preceded_by_dot = before.ends_with('.');
        if let Some(f) = classify_chain(&chain, preceded_by_dot) {
            feats.insert(f);
        }
    }
    for m in BINOP.captures_iter(&forward) {
        let op = match &m[1] {
            "+" => "op.add",
            "-" => "op.sub",
            "*" => "op.mul",
            "/" => "op.div",
            "@" => "op.matmul",
            "**" => "op.pow",
            _ => continue,
        };
        // `*args` / `**kwargs` in a signature are not arithmetic.
        let after = &forward[m.get(1).expect("op").end()..];
        if (op == "op.mul" || op == "op.pow")
            && after.trim_start().starts_with(|c: char| c.is_alphabetic())
        {
            let before = forward[..m.get(0).expect("m").start() + 1].trim_end();
            if before.ends_with(',') || before.ends_with('(') {
                continue;
            }
        }
        feats.insert(op.to_string());
    }
    feats.into_iter().collect()
}

/// Base name of a feature for category lookup: the part after the prefix, lowercased, without
/// underscores (`nn.LayerNorm`, `F.layer_norm` and `Tensor.layer_norm` all give `layernorm`).
pub fn base_name(feature: &str) -> String {
    let name = feature.rsplit('.').next().unwrap_or(feature);
    name.chars()
        .filter(|&c| c != '_')
        .flat_map(char::to_lowercase)
        .collect()
}

/// Other PyTorch names of one operation, as [`base_name`]s, and the name [`op_names`] gives
/// them: PyTorch's documented aliases (`torch.clip` for `torch.clamp`, `torch.absolute` for
/// `torch.abs`, `torch.multiply`, `torch.divide`, `torch.true_divide`, `torch.subtract`,
/// `torch.negative`), and `mm` and `bmm`, the 2-D and batched products `torch.matmul`
/// dispatches to by rank.
const ALIASES: &[(&str, &str)] = &[
    ("clip", "clamp"),
    ("absolute", "abs"),
    ("multiply", "mul"),
    ("divide", "div"),
    ("truedivide", "div"),
    ("subtract", "sub"),
    ("negative", "neg"),
    ("mm", "matmul"),
    ("bmm", "matmul"),
];

/// Ops that only re-describe a tensor's shape (views and reshapes, and `contiguous`), as
/// [`base_name`]s: a kernel does them with index arithmetic, so [`op_names`] leaves them out.
/// Ops that move data (`transpose`, `permute`, `cat`, ...) stay.
const SHAPE_ONLY: &[&str] = &[
    "view",
    "viewas",
    "reshape",
    "flatten",
    "squeeze",
    "unsqueeze",
    "expand",
    "expandas",
    "contiguous",
];

/// The ops of a KernelBench-style module (a PyTorch `Model` and its `forward`) in one
/// vocabulary for KernelBench problems and task families alike: the [`base_name`]s of
/// [`extract_op_features`] (`nn.ReLU`, `F.relu`, `torch.relu` and `x.relu()` are all `relu`;
/// `x + y` and `torch.add` are `add`), aliases folded into one name (`ALIASES`: `clip` is
/// `clamp`, `mm` and `bmm` are `matmul`), shape-only ops left out (`SHAPE_ONLY`: `view`,
/// `reshape`, `flatten`, ...). Sorted, unique; empty when nothing is recognized.
pub fn op_names(code: &str) -> BTreeSet<String> {
    extract_op_features(code)
        .iter()
        .map(|f| {
            let b = base_name(f);
            ALIASES
                .iter()
                .find(|a| a.0 == b)
                .map_or(b, |a| a.1.to_string())
        })
        .filter(|b| !SHAPE_ONLY.contains(&b.as_str()))
        .collect()
}

/// The ops a set of training tasks covers, in the vocabulary of [`op_names`]: a problem is
/// covered when every op of it appears among the ops of some training task (op by op: a
/// covered problem may still combine its ops in a way no training task does), novel when at
/// least one op appears in none. A problem with no recognized op is covered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpCoverage {
    seen: BTreeSet<String>,
}

impl OpCoverage {
    /// The union of [`op_names`] over `modules`, the training tasks' KernelBench-style sources.
    pub fn of<'a>(modules: impl IntoIterator<Item = &'a str>) -> OpCoverage {
        OpCoverage {
            seen: modules.into_iter().flat_map(op_names).collect(),
        }
    }

    /// The ops of `code` that no training task uses (sorted; empty: covered).
    pub fn novel(&self, code: &str) -> Vec<String> {
        op_names(code)
            .into_iter()
            .filter(|o| !self.seen.contains(o))
            .collect()
    }

    /// The ops the training tasks use (sorted).
    pub fn seen(&self) -> &BTreeSet<String> {
        &self.seen
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RELU: &str = r#"import torch
import torch.nn as nn

class Model(nn.Module):
    """
    Simple model that performs a ReLU activation. torch.matmul(x) in a docstring.
    """
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # torch.sigmoid(x) in a comment
        return torch.relu(x)

batch_size = 4096
dim = 393216

def get_inputs():
    x = torch.rand(batch_size, dim)
    return [x]

def get_init_inputs():
    return []
"#;

    const FUSED: &str = r#"import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super(Model, self).__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        x = self.conv(x)
        x = torch.relu(x)
        x = x + self.bias
        x = torch.nn.functional.gelu(x).sum(dim=-1)
        return x * 2.0

def get_inputs():
    return [torch.rand(128, 64, 32, 32)]
"#;

    #[test]
    fn single_op() {
        assert_eq!(extract_op_features(RELU), vec!["torch.relu"]);
    }

    #[test]
    fn fused_ops_and_operators() {
        assert_eq!(
            extract_op_features(FUSED),
            vec![
                "F.gelu",
                "Tensor.sum",
                "nn.Conv2d",
                "op.add",
                "op.mul",
                "torch.relu"
            ]
        );
    }

    #[test]
    fn base_names() {
        assert_eq!(base_name("nn.LayerNorm"), "layernorm");
        assert_eq!(base_name("F.layer_norm"), "layernorm");
        assert_eq!(base_name("op.add"), "add");
        assert_eq!(base_name("torch.linalg.norm"), "norm");
    }

    #[test]
    fn signature_star_args_are_not_mul() {
        let code = "class Model(nn.Module):\n    def forward(self, *args, **kwargs):\n        return torch.cat(args, dim=-1)\n";
        assert_eq!(extract_op_features(code), vec!["torch.cat"]);
    }

    #[test]
    fn op_names_are_one_vocabulary_for_every_spelling() {
        assert_eq!(
            op_names(FUSED).into_iter().collect::<Vec<_>>(),
            ["add", "conv2d", "gelu", "mul", "relu", "sum"]
        );
        // Module, functional and method spellings, aliases and batched products are one op;
        // views are none.
        let code = "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.act = nn.ReLU()\n    def forward(self, a, b):\n        x = torch.bmm(a, b).view(-1)\n        x = F.relu(x.clip(0.0, 1.0)).reshape(4, -1)\n        return torch.clamp(x, max=2.0)\n";
        assert_eq!(
            op_names(code).into_iter().collect::<Vec<_>>(),
            ["clamp", "matmul", "relu"]
        );
        let seen = OpCoverage::of([RELU, code]);
        assert_eq!(seen.novel(FUSED), ["add", "conv2d", "gelu", "mul", "sum"]);
        assert!(seen.novel(RELU).is_empty());
        // Nothing recognized: covered.
        assert!(seen.novel("x = 1\n").is_empty());
    }
}
