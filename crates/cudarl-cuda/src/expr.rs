//! Reference expressions: a task's reference is data (`[reference] out = "sum(x, 1)"` in its
//! `task.toml`), parsed here and evaluated with tch (libtorch) by `cudarl-torch`'s `eval`, so task
//! families are TOML plus kernel sources, never code branches.
//!
//! Grammar (precedence climbing; `+ -` below `* /`, unary minus binds tightest):
//!
//! ```text
//! expr   := term (('+' | '-') term)*
//! term   := unary (('*' | '/') unary)*
//! unary  := '-' unary | atom
//! atom   := number | name | name '(' expr (',' expr)* ')' | '(' expr ')'
//! ```
//!
//! Names are the task's buffer arguments (tensors shaped by their `shape` lists, e.g. `x` of
//! `["rows", "cols"]` is a `rows x cols` tensor) and scalar arguments (f64 values). Functions:
//!
//! | function | meaning (torch) |
//! |---|---|
//! | `relu(x)`, `sigmoid(x)`, `tanh(x)`, `exp(x)`, `abs(x)`, `sqrt(x)` | elementwise |
//! | `gelu(x)` / `gelu_tanh(x)` | `F.gelu(x)` / `F.gelu(x, approximate="tanh")` |
//! | `leaky_relu(x, a)`, `elu(x, a)`, `hardtanh(x, lo, hi)` | `F.leaky_relu(x, a)`, `F.elu(x, a)`, `F.hardtanh(x, lo, hi)` |
//! | `selu(x)`, `softplus(x)`, `softsign(x)`, `silu(x)`, `mish(x)`, `hardsigmoid(x)`, `hardswish(x)` | the `torch.nn.functional` activations of those names (softplus: beta 1, threshold 20) |
//! | `maximum(a, b)`, `minimum(a, b)` | elementwise, broadcasting; either may be a number |
//! | `sum(x)`, `max(x)`, `min(x)`, `mean(x)` | full reduction to one element |
//! | `sum(x, d)`, `max(x, d)`, `min(x, d)`, `mean(x, d)` | reduction over dimension `d`; a third argument `1` keeps it (`keepdim=True`) |
//! | `logsumexp(x, d)` | `torch.logsumexp(x, d)`; a third argument `1` keeps the dimension |
//! | `softmax(x, d)`, `log_softmax(x, d)` | softmax / log-softmax over dimension `d` |
//! | `cumsum(x, d)` | inclusive prefix sum over dimension `d` |
//! | `layernorm(x, w, b, eps)` | `F.layer_norm` over the last dimension |
//! | `matmul(a, b)` | matrix product |
//! | `transpose(x)` | swaps the last two dimensions |
//! | `prod(x, d)` | product over dimension `d`; a third argument `1` keeps it |
//! | `cumprod(x, d)` | inclusive prefix product over dimension `d` |
//! | `conv1d(x, w, s, p, g)`, `conv2d(x, w, s, p, g)`, `conv3d(x, w, s, p, g)` | `F.conv1d` / `F.conv2d` / `F.conv3d` with stride `s`, padding `p`, `g` groups (integer literals); a bias `b` after `w` (`conv2d(x, w, b, s, p, g)`); a dilation `d` last (`conv2d(x, w, s, p, g, d)`, default 1) |
//! | `conv_transpose2d(x, w, s, p, g)` | `F.conv_transpose2d` (no output padding), the same arguments; `w` of shape `(C_in, C_out / g, kh, kw)` |
//! | `max_pool1d(x, k, s, p, d)`, `max_pool2d(...)`, `max_pool3d(...)` | `F.max_pool1d` ... with window `k`, stride `s`, padding `p` (default 0) and dilation `d` (default 1), integer literals; square and cubic windows |
//! | `avg_pool1d(x, k, s, p)`, `avg_pool2d(...)`, `avg_pool3d(...)` | `F.avg_pool1d` ... with window `k`, stride `s` and padding `p` (default 0; padded zeros count, `count_include_pad=True`) |
//! | `group_norm(x, w, b, g, eps)` | `F.group_norm(x, g, w, b, eps)` |
//!
//! Besides the value, evaluation can produce a **magnitude** per element, the `m` of the
//! tolerance test `|out - ref| <= atol + rtol * m`. It bounds how large rounding in any correct
//! evaluation order can be: for sums of products it is the expression evaluated on absolute
//! values (`|a| + |b|`, `sum |x_i|`, `|A| |B|`), the quantities in the forward error bounds of
//! summation and dot products (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd
//! ed., eqs. 3.5 and 4.4). Lipschitz unary functions (relu, gelu, sigmoid, tanh, abs) keep the
//! operand's magnitude (`max(|f(x)|, L m(x))`, `L` the function's Lipschitz constant where it
//! exceeds 1: hardswish 1.5, selu 1.7581, mish 1.1, elu `max(1, a)`); `sqrt` takes
//! `max(|y|, m / (2 |y|))` (its derivative); `exp` scales it by its value (`|e^x| (1 + m)`);
//! `cumsum` sums magnitudes like `sum`; `log_softmax` and `logsumexp` use `|y| + 2 max m` (a
//! perturbation `e` of the inputs moves them by at most `e`, their float evaluation by `|y| u`);
//! max/min take the largest operand magnitude; softmax uses `p (1 + 2 max m)` (the derivative of
//! `p_i` is `p_i (delta_ij - p_j)`, so an input perturbation `e` moves `p_i` by at most
//! `2 p_i e`); layernorm and group_norm use `(|y_hat| + 1) m(w) + m(b)` with `y_hat` the
//! normalized input. A convolution is a sum of products, so its magnitude is the convolution of
//! the magnitudes (`conv(m(x), m(w)) + m(b)`); max pooling takes the window's largest magnitude,
//! average pooling averages them; `prod` and `cumprod` take `n |y|` for `n` factors (the
//! relative error bound of a product of `n` floats, Higham eq. 3.4, to first order).
//! For an f32 output with a matmul or convolution, the judge's `rtol` is at most f32's rounding
//! bound for the longest contraction (`TaskSpec::rtol_for`).

/// A parsed reference expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// A literal.
    Num(f64),
    /// A buffer or scalar argument.
    Var(String),
    /// `-e`.
    Neg(Box<Expr>),
    /// `a op b` with op one of `+ - * /`.
    Bin(char, Box<Expr>, Box<Expr>),
    /// `name(args)`.
    Call(String, Vec<Expr>),
}

/// Functions, with their argument counts (min, max).
pub const FUNCTIONS: &[(&str, usize, usize)] = &[
    ("relu", 1, 1),
    ("sigmoid", 1, 1),
    ("tanh", 1, 1),
    ("exp", 1, 1),
    ("abs", 1, 1),
    ("sqrt", 1, 1),
    ("gelu", 1, 1),
    ("gelu_tanh", 1, 1),
    ("leaky_relu", 2, 2),
    ("elu", 2, 2),
    ("selu", 1, 1),
    ("softplus", 1, 1),
    ("softsign", 1, 1),
    ("silu", 1, 1),
    ("mish", 1, 1),
    ("hardtanh", 3, 3),
    ("hardsigmoid", 1, 1),
    ("hardswish", 1, 1),
    ("maximum", 2, 2),
    ("minimum", 2, 2),
    ("sum", 1, 3),
    ("max", 1, 3),
    ("min", 1, 3),
    ("mean", 1, 3),
    ("logsumexp", 2, 3),
    ("softmax", 2, 2),
    ("log_softmax", 2, 2),
    ("cumsum", 2, 2),
    ("layernorm", 4, 4),
    ("matmul", 2, 2),
    ("transpose", 1, 1),
    ("prod", 2, 3),
    ("cumprod", 2, 2),
    ("conv1d", 5, 7),
    ("conv2d", 5, 7),
    ("conv3d", 5, 7),
    ("conv_transpose2d", 5, 7),
    ("max_pool1d", 3, 5),
    ("avg_pool1d", 3, 4),
    ("max_pool2d", 3, 5),
    ("avg_pool2d", 3, 4),
    ("max_pool3d", 3, 5),
    ("avg_pool3d", 3, 4),
    ("group_norm", 5, 5),
];

/// Why a reference expression does not parse ([`parse`]): the offending token or character
/// and its byte offset, or an unknown function, or wrong arity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParseError(pub String);

/// Parses an expression.
///
/// # Errors
/// A message with the byte offset of the first problem: unknown function, wrong argument
/// count, unbalanced parentheses, trailing input.
pub fn parse(src: &str) -> Result<Expr, ParseError> {
    let toks = lex(src)?;
    let mut p = Parser { toks, pos: 0 };
    let e = p.expr()?;
    if p.pos < p.toks.len() {
        return Err(ParseError(format!(
            "unexpected `{}` at offset {}",
            p.toks[p.pos].1, p.toks[p.pos].0
        )));
    }
    Ok(e)
}

fn lex(s: &str) -> Result<Vec<(usize, String)>, ParseError> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i] as char;
        if c.is_ascii_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() || c == '.' {
            let st = i;
            while i < b.len()
                && ((b[i] as char).is_ascii_alphanumeric()
                    || b[i] == b'.'
                    || ((b[i] == b'-' || b[i] == b'+') && matches!(b[i - 1], b'e' | b'E')))
            {
                i += 1;
            }
            out.push((st, s[st..i].to_string()));
        } else if c.is_ascii_alphabetic() || c == '_' {
            let st = i;
            while i < b.len() && ((b[i] as char).is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push((st, s[st..i].to_string()));
        } else if "+-*/(),".contains(c) {
            out.push((i, c.to_string()));
            i += 1;
        } else {
            return Err(ParseError(format!(
                "unexpected character `{c}` at offset {i}"
            )));
        }
    }
    Ok(out)
}

struct Parser {
    toks: Vec<(usize, String)>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> Option<&str> {
        self.toks.get(self.pos).map(|t| t.1.as_str())
    }
    fn offset(&self) -> usize {
        self.toks.get(self.pos).map(|t| t.0).unwrap_or(usize::MAX)
    }
    fn expect(&mut self, t: &str) -> Result<(), ParseError> {
        if self.peek() == Some(t) {
            self.pos += 1;
            Ok(())
        } else {
            Err(ParseError(match self.peek() {
                Some(x) => format!("expected `{t}`, found `{x}` at offset {}", self.offset()),
                None => format!("expected `{t}` at the end"),
            }))
        }
    }
    fn expr(&mut self) -> Result<Expr, ParseError> {
        let mut l = self.term()?;
        while let Some(op @ ("+" | "-")) = self.peek() {
            let op = op.chars().next().expect("one char");
            self.pos += 1;
            l = Expr::Bin(op, Box::new(l), Box::new(self.term()?));
        }
        Ok(l)
    }
    fn term(&mut self) -> Result<Expr, ParseError> {
        let mut l = self.unary()?;
        while let Some(op @ ("*" | "/")) = self.peek() {
            let op = op.chars().next().expect("one char");
            self.pos += 1;
            l = Expr::Bin(op, Box::new(l), Box::new(self.unary()?));
        }
        Ok(l)
    }
    fn unary(&mut self) -> Result<Expr, ParseError> {
        if self.peek() == Some("-") {
            self.pos += 1;
            return Ok(Expr::Neg(Box::new(self.unary()?)));
        }
        self.atom()
    }
    fn atom(&mut self) -> Result<Expr, ParseError> {
        let off = self.offset();
        let Some(t) = self.peek().map(str::to_string) else {
            return Err(ParseError("unexpected end of expression".into()));
        };
        self.pos += 1;
        if t == "(" {
            let e = self.expr()?;
            self.expect(")")?;
            return Ok(e);
        }
        if t.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
            return t
                .parse::<f64>()
                .map(Expr::Num)
                .map_err(|_| ParseError(format!("bad number `{t}` at offset {off}")));
        }
        if !t.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
            return Err(ParseError(format!("unexpected `{t}` at offset {off}")));
        }
        if self.peek() != Some("(") {
            return Ok(Expr::Var(t));
        }
        self.pos += 1;
        let mut args = vec![self.expr()?];
        while self.peek() == Some(",") {
            self.pos += 1;
            args.push(self.expr()?);
        }
        self.expect(")")?;
        let Some(&(_, lo, hi)) = FUNCTIONS.iter().find(|f| f.0 == t) else {
            return Err(ParseError(format!(
                "unknown function `{t}` at offset {off}"
            )));
        };
        if args.len() < lo || args.len() > hi {
            return Err(ParseError(format!(
                "`{t}` takes {} arguments, got {} (offset {off})",
                if lo == hi {
                    lo.to_string()
                } else if hi == lo + 1 {
                    format!("{lo} or {hi}")
                } else {
                    format!("{lo} to {hi}")
                },
                args.len()
            )));
        }
        // A convolution's bias, when there is one, is its third argument, and no number; then
        // stride, padding and groups, and optionally a dilation.
        if t.starts_with("conv") {
            let bias = conv_bias(&args);
            let settings = args.len() - 2 - usize::from(bias);
            if !(3..=4).contains(&settings) {
                return Err(ParseError(format!(
                    "`{t}` takes stride, padding, groups and an optional dilation after {}, \
                     got {settings} (offset {off})",
                    if bias { "its bias" } else { "the weight" }
                )));
            }
        }
        Ok(Expr::Call(t, args))
    }
}

impl Expr {
    /// The expression in PyTorch (`torch.relu(x) + y`, `torch.sum(x, dim=1)`): what a task's
    /// rendered `Model.forward` returns ([`crate::task::TaskSpec::problem_source`]).
    pub fn to_torch(&self) -> String {
        let f = "torch.nn.functional";
        let num = literal;
        let lit = |v: f64| {
            if v.fract() == 0.0 && v.abs() < 1e15 {
                format!("{v:.1}")
            } else {
                format!("{v}")
            }
        };
        let dim = |e: &Expr| num(e).map(|v| format!("{}", v as i64)).unwrap_or_default();
        match self {
            Expr::Num(v) => lit(*v),
            Expr::Var(n) => n.clone(),
            Expr::Neg(a) => format!("-({})", a.to_torch()),
            Expr::Bin(op, a, b) => format!("({} {op} {})", a.to_torch(), b.to_torch()),
            Expr::Call(name, args) => {
                let a: Vec<String> = args.iter().map(Expr::to_torch).collect();
                let keep = |i: usize| {
                    if args.get(i).and_then(num) == Some(1.0) {
                        ", keepdim=True"
                    } else {
                        ""
                    }
                };
                match name.as_str() {
                    "relu" | "sigmoid" | "tanh" | "exp" | "abs" | "sqrt" | "selu" => {
                        format!("torch.{name}({})", a[0])
                    }
                    "gelu" | "softplus" | "softsign" | "silu" | "mish" | "hardsigmoid"
                    | "hardswish" => format!("{f}.{name}({})", a[0]),
                    "gelu_tanh" => format!("{f}.gelu({}, approximate=\"tanh\")", a[0]),
                    "leaky_relu" => format!("{f}.leaky_relu({}, negative_slope={})", a[0], a[1]),
                    "elu" => format!("{f}.elu({}, alpha={})", a[0], a[1]),
                    "hardtanh" => {
                        format!("{f}.hardtanh({}, min_val={}, max_val={})", a[0], a[1], a[2])
                    }
                    "maximum" | "minimum" => {
                        let bound = if name == "maximum" { "min" } else { "max" };
                        match (num(&args[0]), num(&args[1])) {
                            (_, Some(c)) => format!("torch.clamp({}, {bound}={})", a[0], lit(c)),
                            (Some(c), _) => format!("torch.clamp({}, {bound}={})", a[1], lit(c)),
                            _ => format!("torch.{name}({}, {})", a[0], a[1]),
                        }
                    }
                    "sum" | "mean" | "max" | "min" if args.len() == 1 => {
                        let t = match name.as_str() {
                            "max" => "amax",
                            "min" => "amin",
                            n => n,
                        };
                        format!("torch.{t}({}).reshape(1)", a[0])
                    }
                    "sum" | "mean" | "max" | "min" | "logsumexp" | "prod" => {
                        let t = match name.as_str() {
                            "max" => "amax",
                            "min" => "amin",
                            n => n,
                        };
                        format!("torch.{t}({}, dim={}{})", a[0], dim(&args[1]), keep(2))
                    }
                    "softmax" | "log_softmax" | "cumsum" | "cumprod" => {
                        format!("torch.{name}({}, dim={})", a[0], dim(&args[1]))
                    }
                    "layernorm" => format!(
                        "{f}.layer_norm({x}, ({x}.shape[-1],), {}, {}, {})",
                        a[1],
                        a[2],
                        a[3],
                        x = a[0]
                    ),
                    "matmul" => format!("torch.matmul({}, {})", a[0], a[1]),
                    "transpose" => format!("{}.transpose(-2, -1)", a[0]),
                    "conv1d" | "conv2d" | "conv3d" | "conv_transpose2d" | "max_pool1d"
                    | "avg_pool1d" | "max_pool2d" | "avg_pool2d" | "max_pool3d" | "avg_pool3d" => {
                        windowed_torch(name, args, &a)
                    }
                    "group_norm" => format!(
                        "{f}.group_norm({}, {}, {}, {}, {})",
                        a[0],
                        dim(&args[3]),
                        a[1],
                        a[2],
                        a[4]
                    ),
                    other => format!("{other}({})", a.join(", ")),
                }
            }
        }
    }

    /// Names the expression reads.
    pub fn vars(&self) -> Vec<String> {
        let mut v = Vec::new();
        self.collect_vars(&mut v);
        v.sort();
        v.dedup();
        v
    }
    fn collect_vars(&self, out: &mut Vec<String>) {
        match self {
            Expr::Num(_) => {}
            Expr::Var(n) => out.push(n.clone()),
            Expr::Neg(e) => e.collect_vars(out),
            Expr::Bin(_, a, b) => {
                a.collect_vars(out);
                b.collect_vars(out);
            }
            Expr::Call(_, args) => args.iter().for_each(|a| a.collect_vars(out)),
        }
    }
}

/// A number literal (`2`, `-0.5`), or `None`.
fn literal(e: &Expr) -> Option<f64> {
    match e {
        Expr::Num(v) => Some(*v),
        Expr::Neg(a) => match **a {
            Expr::Num(v) => Some(-v),
            _ => None,
        },
        _ => None,
    }
}

/// Whether a convolution call's third argument is its bias: any argument but a number literal
/// (`conv2d(x, w, b, 1, 0, 1)`); its stride, padding, groups and optional dilation follow.
/// `args` holds at least three arguments, as the parser guarantees for every convolution.
pub fn conv_bias(args: &[Expr]) -> bool {
    literal(&args[2]).is_none()
}

/// A convolution or pooling call `name(args)` in PyTorch (`a`: the arguments rendered), its
/// settings as keyword arguments: `F.conv2d(x, w, None, stride=1, padding=0, groups=1,
/// dilation=2)`, `F.max_pool2d(x, kernel_size=3, stride=2, padding=1, dilation=1)`.
fn windowed_torch(name: &str, args: &[Expr], a: &[String]) -> String {
    let f = "torch.nn.functional";
    let dim = |e: &Expr| {
        literal(e)
            .map(|v| format!("{}", v as i64))
            .unwrap_or_default()
    };
    if name.starts_with("conv") {
        let (bias, at) = if conv_bias(args) {
            (a[2].as_str(), 3)
        } else {
            ("None", 2)
        };
        let mut s = format!(
            "{f}.{name}({}, {}, {bias}, stride={}, padding={}, groups={}",
            a[0],
            a[1],
            dim(&args[at]),
            dim(&args[at + 1]),
            args.get(at + 2).map(dim).unwrap_or_default()
        );
        if let Some(d) = args.get(at + 3) {
            s.push_str(&format!(", dilation={}", dim(d)));
        }
        return s + ")";
    }
    let mut s = format!(
        "{f}.{name}({}, kernel_size={}, stride={}",
        a[0],
        dim(&args[1]),
        dim(&args[2])
    );
    for (arg, key) in args.iter().skip(3).zip(["padding", "dilation"]) {
        s.push_str(&format!(", {key}={}", dim(arg)));
    }
    s + ")"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_precedence_and_rejects_bad_input() {
        assert_eq!(
            parse("a + b * -c").unwrap(),
            Expr::Bin(
                '+',
                Box::new(Expr::Var("a".into())),
                Box::new(Expr::Bin(
                    '*',
                    Box::new(Expr::Var("b".into())),
                    Box::new(Expr::Neg(Box::new(Expr::Var("c".into()))))
                ))
            )
        );
        assert_eq!(parse("sum(x, 1)").unwrap().vars(), vec!["x".to_string()]);
        assert_eq!(parse("1e-5").unwrap(), Expr::Num(1e-5));
        // Pooling's padding and dilation, a convolution's bias and dilation, are keyword
        // arguments when given.
        for (e, want) in [
            (
                "conv2d(x, w, 1, 2, 1, 3)",
                "conv2d(x, w, None, stride=1, padding=2, groups=1, dilation=3)",
            ),
            (
                "conv1d(x, w, b, 2, 0, 1)",
                "conv1d(x, w, b, stride=2, padding=0, groups=1)",
            ),
            (
                "avg_pool1d(x, 4, 2)",
                "avg_pool1d(x, kernel_size=4, stride=2)",
            ),
            (
                "max_pool3d(x, 3, 2, 1, 3)",
                "max_pool3d(x, kernel_size=3, stride=2, padding=1, dilation=3)",
            ),
        ] {
            let got = parse(e).unwrap().to_torch();
            assert_eq!(got, format!("torch.nn.functional.{want}"), "{e}");
        }
        for (bad, want) in [
            ("foo(x)", "unknown function `foo`"),
            ("sum(x, 1, 2, 3)", "takes 1 to 3 arguments"),
            ("avg_pool2d(x, 2, 2, 0, 1)", "takes 3 or 4 arguments, got 5"),
            ("conv2d(x, w, b, 1, 0)", "after its bias, got 2"),
            ("conv2d(x, w, 1, 0, 1, 2, 9)", "after the weight, got 5"),
            ("(a + b", "expected `)`"),
            ("a b", "unexpected `b`"),
            ("a $ b", "unexpected character `$`"),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.0.contains(want), "{bad}: {e}");
        }
    }
}
