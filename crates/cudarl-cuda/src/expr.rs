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
//! | `relu(x)`, `sigmoid(x)`, `tanh(x)`, `exp(x)`, `abs(x)` | elementwise |
//! | `gelu(x)` / `gelu_tanh(x)` | `F.gelu(x)` / `F.gelu(x, approximate="tanh")` |
//! | `maximum(a, b)`, `minimum(a, b)` | elementwise, broadcasting; either may be a number |
//! | `sum(x)`, `max(x)`, `min(x)` | full reduction to one element |
//! | `sum(x, d)`, `max(x, d)`, `min(x, d)`, `mean(x, d)` | reduction over dimension `d` |
//! | `softmax(x, d)` | softmax over dimension `d` |
//! | `layernorm(x, w, b, eps)` | `F.layer_norm` over the last dimension |
//! | `matmul(a, b)` | matrix product |
//! | `transpose(x)` | swaps the last two dimensions |
//!
//! Besides the value, evaluation can produce a **magnitude** per element, the `m` of the
//! tolerance test `|out - ref| <= atol + rtol * m`. It bounds how large rounding in any correct
//! evaluation order can be: for sums of products it is the expression evaluated on absolute
//! values (`|a| + |b|`, `sum |x_i|`, `|A| |B|`), the quantities in the forward error bounds of
//! summation and dot products (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd
//! ed., eqs. 3.5 and 4.4). Lipschitz unary functions (relu, gelu, sigmoid, tanh, abs) keep the
//! operand's magnitude (`max(|f(x)|, m(x))`); `exp` scales it by its value (`|e^x| (1 + m)`);
//! max/min take the largest operand magnitude; softmax uses `p (1 + 2 max m)` (the derivative of
//! `p_i` is `p_i (delta_ij - p_j)`, so an input perturbation `e` moves `p_i` by at most
//! `2 p_i e`); layernorm uses `(|y_hat| + 1) m(w) + m(b)` with `y_hat` the normalized input.

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
    ("gelu", 1, 1),
    ("gelu_tanh", 1, 1),
    ("maximum", 2, 2),
    ("minimum", 2, 2),
    ("sum", 1, 2),
    ("max", 1, 2),
    ("min", 1, 2),
    ("mean", 2, 2),
    ("softmax", 2, 2),
    ("layernorm", 4, 4),
    ("matmul", 2, 2),
    ("transpose", 1, 1),
];

/// Parses an expression.
///
/// # Errors
/// A message with the byte offset of the first problem: unknown function, wrong argument
/// count, unbalanced parentheses, trailing input.
pub fn parse(src: &str) -> Result<Expr, String> {
    let toks = lex(src)?;
    let mut p = Parser { toks, pos: 0 };
    let e = p.expr()?;
    if p.pos < p.toks.len() {
        return Err(format!(
            "unexpected `{}` at offset {}",
            p.toks[p.pos].1, p.toks[p.pos].0
        ));
    }
    Ok(e)
}

fn lex(s: &str) -> Result<Vec<(usize, String)>, String> {
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
            return Err(format!("unexpected character `{c}` at offset {i}"));
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
    fn expect(&mut self, t: &str) -> Result<(), String> {
        if self.peek() == Some(t) {
            self.pos += 1;
            Ok(())
        } else {
            Err(match self.peek() {
                Some(x) => format!("expected `{t}`, found `{x}` at offset {}", self.offset()),
                None => format!("expected `{t}` at the end"),
            })
        }
    }
    fn expr(&mut self) -> Result<Expr, String> {
        let mut l = self.term()?;
        while let Some(op @ ("+" | "-")) = self.peek() {
            let op = op.chars().next().expect("one char");
            self.pos += 1;
            l = Expr::Bin(op, Box::new(l), Box::new(self.term()?));
        }
        Ok(l)
    }
    fn term(&mut self) -> Result<Expr, String> {
        let mut l = self.unary()?;
        while let Some(op @ ("*" | "/")) = self.peek() {
            let op = op.chars().next().expect("one char");
            self.pos += 1;
            l = Expr::Bin(op, Box::new(l), Box::new(self.unary()?));
        }
        Ok(l)
    }
    fn unary(&mut self) -> Result<Expr, String> {
        if self.peek() == Some("-") {
            self.pos += 1;
            return Ok(Expr::Neg(Box::new(self.unary()?)));
        }
        self.atom()
    }
    fn atom(&mut self) -> Result<Expr, String> {
        let off = self.offset();
        let Some(t) = self.peek().map(str::to_string) else {
            return Err("unexpected end of expression".into());
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
                .map_err(|_| format!("bad number `{t}` at offset {off}"));
        }
        if !t.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
            return Err(format!("unexpected `{t}` at offset {off}"));
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
            return Err(format!("unknown function `{t}` at offset {off}"));
        };
        if args.len() < lo || args.len() > hi {
            return Err(format!(
                "`{t}` takes {} arguments, got {} (offset {off})",
                if lo == hi {
                    lo.to_string()
                } else {
                    format!("{lo} or {hi}")
                },
                args.len()
            ));
        }
        Ok(Expr::Call(t, args))
    }
}

impl Expr {
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
        for (bad, want) in [
            ("foo(x)", "unknown function `foo`"),
            ("sum(x, 1, 2)", "takes 1 or 2 arguments"),
            ("(a + b", "expected `)`"),
            ("a b", "unexpected `b`"),
            ("a $ b", "unexpected character `$`"),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(want), "{bad}: {e}");
        }
    }
}
