//! Evaluation of reference expressions ([`cudarl_cuda::expr`]) with tch (libtorch), with the
//! tolerance magnitude described there.

use std::cell::Cell;
use std::collections::BTreeMap;

use cudarl_cuda::expr::Expr;
use tch::{Kind, Tensor};

/// Values bound to names during evaluation, and the longest contraction evaluated with them.
pub struct Env<'a> {
    /// Buffer arguments, shaped.
    pub tensors: BTreeMap<String, &'a Tensor>,
    /// Scalar arguments.
    pub scalars: BTreeMap<String, f64>,
    contraction: Cell<i64>,
}

impl<'a> Env<'a> {
    /// An environment of `tensors` and `scalars`.
    pub fn new(tensors: BTreeMap<String, &'a Tensor>, scalars: BTreeMap<String, f64>) -> Self {
        Env {
            tensors,
            scalars,
            contraction: Cell::new(0),
        }
    }

    /// The longest contraction (terms of one output element's sum of products) of any `matmul`
    /// or convolution evaluated in this environment so far: the `K` of a matmul's inner
    /// dimension, `C_in / groups` times the kernel's elements for a convolution; 0 when none ran.
    /// The judge derives an f32 task's tolerance from it
    /// ([`cudarl_cuda::task::TaskSpec::rtol_for`]).
    pub fn contraction(&self) -> i64 {
        self.contraction.get()
    }

    fn contracted(&self, k: i64) {
        self.contraction.set(self.contraction.get().max(k));
    }
}

/// A value and (optionally) its magnitude; numbers stay scalars until combined with a tensor.
enum Val {
    Num(f64),
    T(Tensor, Option<Tensor>),
}

type R<T> = Result<T, tch::TchError>;

fn err(m: impl Into<String>) -> tch::TchError {
    tch::TchError::Kind(m.into())
}

fn int_arg(e: &Expr, f: &str) -> R<i64> {
    match e {
        Expr::Num(v) if v.fract() == 0.0 => Ok(*v as i64),
        Expr::Neg(inner) => Ok(-int_arg(inner, f)?),
        _ => Err(err(format!(
            "`{f}`: the dimension must be an integer literal"
        ))),
    }
}

/// The largest error `|out - ref|` each element of `task`'s output may have: `atol + rtol * m`,
/// `m` the reference's magnitude (as [`eval`] returns it) and `rtol` the one
/// [`cudarl_cuda::task::TaskSpec::rtol_for`] gives for the output's longest contraction
/// (`contraction`, [`Env::contraction`]). Same shape and dtype as `m`.
///
/// # Errors
/// libtorch errors.
pub fn tolerance(task: &cudarl_cuda::task::TaskSpec, m: &Tensor, contraction: i64) -> R<Tensor> {
    let (rtol, atol) = tolerance_terms(task, contraction);
    m.f_mul_scalar(rtol)?.f_add_scalar(atol)
}

/// `(rtol, atol)` of [`tolerance`] for an output whose longest contraction is `contraction`.
pub fn tolerance_terms(task: &cudarl_cuda::task::TaskSpec, contraction: i64) -> (f64, f64) {
    (task.rtol_for(contraction), task.atol)
}

/// Evaluates `e`. With `with_magnitude`, also returns the tolerance magnitude (see the module
/// docs); tensors keep the dtype of the inputs (callers pass float64 for references and the
/// task's dtype to time torch's own kernels).
///
/// # Errors
/// Unknown names, shape mismatches, libtorch errors (with libtorch's message).
pub fn eval(e: &Expr, env: &Env<'_>, with_magnitude: bool) -> R<(Tensor, Option<Tensor>)> {
    match eval_val(e, env, with_magnitude)? {
        Val::T(v, m) => Ok((v, m)),
        Val::Num(_) => Err(err("the expression is a constant; it must read an input")),
    }
}

fn eval_val(e: &Expr, env: &Env<'_>, mag: bool) -> R<Val> {
    Ok(match e {
        Expr::Num(v) => Val::Num(*v),
        Expr::Var(n) => {
            if let Some(t) = env.tensors.get(n) {
                let m = if mag { Some(t.f_abs()?) } else { None };
                Val::T(t.shallow_clone(), m)
            } else if let Some(v) = env.scalars.get(n) {
                Val::Num(*v)
            } else {
                return Err(err(format!("unknown name `{n}`")));
            }
        }
        Expr::Neg(a) => match eval_val(a, env, mag)? {
            Val::Num(v) => Val::Num(-v),
            Val::T(t, m) => Val::T(t.f_neg()?, m),
        },
        Expr::Bin(op, a, b) => binary(*op, eval_val(a, env, mag)?, eval_val(b, env, mag)?)?,
        Expr::Call(f, args) => call(f, args, env, mag)?,
    })
}

fn binary(op: char, a: Val, b: Val) -> R<Val> {
    use Val::*;
    Ok(match (a, b) {
        (Num(x), Num(y)) => Num(match op {
            '+' => x + y,
            '-' => x - y,
            '*' => x * y,
            _ => x / y,
        }),
        (T(t, m), Num(y)) => match op {
            '+' | '-' => {
                let v = if op == '+' {
                    t.f_add_scalar(y)?
                } else {
                    t.f_sub_scalar(y)?
                };
                T(v, m.map(|m| m.f_add_scalar(y.abs())).transpose()?)
            }
            '*' => T(
                t.f_mul_scalar(y)?,
                m.map(|m| m.f_mul_scalar(y.abs())).transpose()?,
            ),
            _ => T(
                t.f_div_scalar(y)?,
                m.map(|m| m.f_div_scalar(y.abs())).transpose()?,
            ),
        },
        (Num(x), T(t, m)) => match op {
            '+' => T(
                t.f_add_scalar(x)?,
                m.map(|m| m.f_add_scalar(x.abs())).transpose()?,
            ),
            '-' => T(
                t.f_neg()?.f_add_scalar(x)?,
                m.map(|m| m.f_add_scalar(x.abs())).transpose()?,
            ),
            '*' => T(
                t.f_mul_scalar(x)?,
                m.map(|m| m.f_mul_scalar(x.abs())).transpose()?,
            ),
            _ => {
                let v = t.f_reciprocal()?.f_mul_scalar(x)?;
                let m = m
                    .map(|m| -> R<Tensor> { m.f_div(&t.f_square()?)?.f_mul_scalar(x.abs()) })
                    .transpose()?;
                T(v, m)
            }
        },
        (T(t, mt), T(u, mu)) => {
            let v = match op {
                '+' => t.f_add(&u)?,
                '-' => t.f_sub(&u)?,
                '*' => t.f_mul(&u)?,
                _ => t.f_div(&u)?,
            };
            let m = match (mt, mu) {
                (Some(a), Some(b)) => Some(match op {
                    '+' | '-' => a.f_add(&b)?,
                    '*' => a.f_mul(&b)?,
                    // |a/b| error: (m_a + |a/b| m_b) / |b|.
                    _ => a.f_add(&v.f_abs()?.f_mul(&b)?)?.f_div(&u.f_abs()?)?,
                }),
                _ => None,
            };
            T(v, m)
        }
    })
}

fn tensor_arg(e: &Expr, env: &Env<'_>, mag: bool, f: &str) -> R<(Tensor, Option<Tensor>)> {
    match eval_val(e, env, mag)? {
        Val::T(t, m) => Ok((t, m)),
        Val::Num(_) => Err(err(format!("`{f}` needs a tensor argument"))),
    }
}

/// `maximum(a, b)` / `minimum(a, b)` where either operand may be a number: value elementwise,
/// magnitude the larger operand magnitude (`|c|` for a number `c`).
fn extremum(f: &str, args: &[Expr], env: &Env<'_>, mag: bool) -> R<Val> {
    let hi = f == "maximum";
    let pick = |a: f64, b: f64| if hi { a.max(b) } else { a.min(b) };
    let (a, b) = (eval_val(&args[0], env, mag)?, eval_val(&args[1], env, mag)?);
    Ok(match (a, b) {
        (Val::Num(x), Val::Num(y)) => Val::Num(pick(x, y)),
        (Val::T(t, m), Val::Num(c)) | (Val::Num(c), Val::T(t, m)) => {
            let v = if hi {
                t.f_clamp_min(c)?
            } else {
                t.f_clamp_max(c)?
            };
            Val::T(v, m.map(|m| m.f_clamp_min(c.abs())).transpose()?)
        }
        (Val::T(x, mx), Val::T(y, my)) => {
            let v = if hi {
                x.f_maximum(&y)?
            } else {
                x.f_minimum(&y)?
            };
            let m = match (mx, my) {
                (Some(a), Some(b)) => Some(a.f_maximum(&b)?),
                _ => None,
            };
            Val::T(v, m)
        }
    })
}

fn call(f: &str, args: &[Expr], env: &Env<'_>, mag: bool) -> R<Val> {
    if f == "maximum" || f == "minimum" {
        return extremum(f, args, env, mag);
    }
    let (x, mx) = tensor_arg(&args[0], env, mag, f)?;
    let c = Call { f, args, env, mag };
    let families: [Family; 5] = [pointwise, reduction, softmax, linear, normalization];
    for family in families {
        if let Some(v) = family(&c, &x, mx.as_ref())? {
            return Ok(v);
        }
    }
    Err(err(format!("unknown function `{f}`")))
}

/// One call of a named function: its name, its argument expressions, the environment they
/// are evaluated in and whether magnitudes are wanted.
struct Call<'a, 'e> {
    f: &'a str,
    args: &'a [Expr],
    env: &'a Env<'e>,
    mag: bool,
}

impl Call<'_, '_> {
    /// Argument `i` (0-based), which must evaluate to a number.
    fn num_arg(&self, i: usize) -> R<f64> {
        match eval_val(&self.args[i], self.env, false)? {
            Val::Num(v) => Ok(v),
            Val::T(..) => Err(err(format!(
                "`{}`: argument {} must be a number",
                self.f,
                i + 1
            ))),
        }
    }

    /// Argument `i` (0-based) as a tensor with its magnitude.
    fn tensor_arg(&self, i: usize) -> R<(Tensor, Option<Tensor>)> {
        tensor_arg(&self.args[i], self.env, self.mag, self.f)
    }

    /// Whether a reduction keeps the dimension: a third argument of 1 (`keepdim=True`).
    fn keep(&self) -> R<bool> {
        Ok(self
            .args
            .get(2)
            .map(|k| int_arg(k, self.f))
            .transpose()?
            .unwrap_or(0)
            == 1)
    }
}

/// A group of functions: the value (and magnitude) of a call of one of them on the first
/// argument `x` (magnitude `mx`), `None` for a function outside the group.
type Family = fn(&Call<'_, '_>, &Tensor, Option<&Tensor>) -> R<Option<Val>>;

/// A Lipschitz unary's result: value `v`, magnitude `max(|v|, m(x))`.
fn lip(v: Tensor, mx: Option<&Tensor>) -> R<Val> {
    let m = match mx {
        Some(m) => Some(v.f_abs()?.f_maximum(m)?),
        None => None,
    };
    Ok(Val::T(v, m))
}

/// A Lipschitz unary's result with constant `l` > 1: value `v`, magnitude `max(|v|, l m(x))`.
fn lip_l(v: Tensor, mx: Option<&Tensor>, l: f64) -> R<Val> {
    match mx {
        Some(m) => lip(v, Some(&m.f_mul_scalar(l)?)),
        None => lip(v, None),
    }
}

/// Elementwise functions of `x`: activations, `abs`, `sqrt` and `exp`.
fn pointwise(c: &Call<'_, '_>, x: &Tensor, mx: Option<&Tensor>) -> R<Option<Val>> {
    Ok(Some(match c.f {
        "relu" => lip(x.f_relu()?, mx)?,
        "leaky_relu" => {
            let a = c.num_arg(1)?;
            // max(x, 0) + a min(x, 0): F.leaky_relu for any slope.
            let v = x
                .f_clamp_min(0.0)?
                .f_add(&x.f_clamp_max(0.0)?.f_mul_scalar(a)?)?;
            lip_l(v, mx, a.abs().max(1.0))?
        }
        "elu" => {
            let a = c.num_arg(1)?;
            // max(x, 0) + a (exp(min(x, 0)) - 1): F.elu.
            let neg = x.f_clamp_max(0.0)?.f_expm1()?.f_mul_scalar(a)?;
            lip_l(x.f_clamp_min(0.0)?.f_add(&neg)?, mx, a.abs().max(1.0))?
        }
        "selu" => lip_l(x.f_selu()?, mx, 1.7581)?,
        "softplus" => {
            // F.softplus (beta 1, threshold 20): x above 20, log1p(exp(x)) below.
            let soft = x.f_clamp_max(20.0)?.f_exp()?.f_log1p()?;
            lip(x.f_where_self(&x.f_gt(20.0)?, &soft)?, mx)?
        }
        "softsign" => lip(x.f_div(&x.f_abs()?.f_add_scalar(1.0)?)?, mx)?,
        "silu" => lip_l(x.f_silu()?, mx, 1.1)?,
        "mish" => lip_l(x.f_mish()?, mx, 1.1)?,
        "hardtanh" => lip(x.f_clamp(c.num_arg(1)?, c.num_arg(2)?)?, mx)?,
        "hardsigmoid" => lip(x.f_hardsigmoid()?, mx)?,
        "hardswish" => lip_l(x.f_hardswish()?, mx, 1.5)?,
        "sqrt" => {
            let v = x.f_sqrt()?;
            let m = match mx {
                Some(m) => Some(
                    v.f_abs()?
                        .f_maximum(&m.f_div(&v.f_abs()?.f_mul_scalar(2.0)?)?)?,
                ),
                None => None,
            };
            Val::T(v, m)
        }
        "sigmoid" => lip(x.f_sigmoid()?, mx)?,
        "tanh" => lip(x.f_tanh()?, mx)?,
        "abs" => lip(x.f_abs()?, mx)?,
        "gelu" => lip(x.f_gelu("none")?, mx)?,
        "gelu_tanh" => lip(x.f_gelu("tanh")?, mx)?,
        "exp" => {
            let v = x.f_exp()?;
            let m = match mx {
                Some(m) => Some(v.f_abs()?.f_mul(&m.f_add_scalar(1.0)?)?),
                None => None,
            };
            Val::T(v, m)
        }
        _ => return Ok(None),
    }))
}

/// Reductions and scans of `x`: `sum`, `max`, `min`, `mean` (over all of `x` or one
/// dimension), `cumsum`, `prod` and `cumprod`.
fn reduction(c: &Call<'_, '_>, x: &Tensor, mx: Option<&Tensor>) -> R<Option<Val>> {
    let (f, args) = (c.f, c.args);
    Ok(Some(match f {
        "cumsum" => {
            let d = int_arg(&args[1], f)?;
            let v = x.f_cumsum(d, None::<Kind>)?;
            let m = mx.map(|m| m.f_cumsum(d, None::<Kind>)).transpose()?;
            Val::T(v, m)
        }
        "sum" | "max" | "min" | "mean" => {
            let dim = args.get(1).map(|d| int_arg(d, f)).transpose()?;
            let keep = c.keep()?;
            let reduce = |t: &Tensor, kind: &str| -> R<Tensor> {
                match (kind, dim) {
                    ("sum", None) => t.f_sum(None::<Kind>)?.f_reshape([1]),
                    ("sum", Some(d)) => t.f_sum_dim_intlist([d].as_slice(), keep, None::<Kind>),
                    ("mean", None) => t.f_mean(None::<Kind>)?.f_reshape([1]),
                    ("mean", Some(d)) => t.f_mean_dim([d].as_slice(), keep, None::<Kind>),
                    ("max", None) => t.f_amax([0i64; 0].as_slice(), false)?.f_reshape([1]),
                    ("max", Some(d)) => t.f_amax([d].as_slice(), keep),
                    ("min", None) => t.f_amin([0i64; 0].as_slice(), false)?.f_reshape([1]),
                    (_, d) => t.f_amin([d.unwrap_or(0)].as_slice(), keep),
                }
            };
            let v = reduce(x, f)?;
            let m = match mx {
                // Sums: sum of |terms|; max/min: the largest operand magnitude.
                Some(m) => Some(if f == "sum" || f == "mean" {
                    reduce(m, f)?
                } else {
                    reduce(m, "max")?
                }),
                None => None,
            };
            Val::T(v, m)
        }
        "prod" | "cumprod" => {
            let d = int_arg(&args[1], f)?;
            let sizes = x.size();
            let at = if d < 0 { d + sizes.len() as i64 } else { d };
            let n = usize::try_from(at)
                .ok()
                .and_then(|i| sizes.get(i))
                .ok_or_else(|| err(format!("`{f}`: no dimension {d}")))?;
            let n = *n as f64;
            let op = |t: &Tensor| -> R<Tensor> {
                if f == "prod" {
                    t.f_prod_dim_int(d, c.keep()?, None::<Kind>)
                } else {
                    t.f_cumprod(d, None::<Kind>)
                }
            };
            let v = op(x)?;
            // n factors: relative error at most about n u of the product of magnitudes.
            let m = mx.map(|m| op(m)?.f_mul_scalar(n.max(1.0))).transpose()?;
            Val::T(v, m)
        }
        _ => return Ok(None),
    }))
}

/// `softmax`, `log_softmax` and `logsumexp` of `x` over one dimension.
fn softmax(c: &Call<'_, '_>, x: &Tensor, mx: Option<&Tensor>) -> R<Option<Val>> {
    let (f, args) = (c.f, c.args);
    Ok(Some(match f {
        "log_softmax" | "logsumexp" => {
            let d = int_arg(&args[1], f)?;
            let v = if f == "log_softmax" {
                x.f_log_softmax(d, None::<Kind>)?
            } else {
                x.f_logsumexp([d].as_slice(), c.keep()?)?
            };
            let m = match mx {
                Some(m) => Some(
                    v.f_abs()?.f_add(
                        &m.f_amax([d].as_slice(), f == "log_softmax" || c.keep()?)?
                            .f_mul_scalar(2.0)?,
                    )?,
                ),
                None => None,
            };
            Val::T(v, m)
        }
        "softmax" => {
            let d = int_arg(&args[1], f)?;
            let v = x.f_softmax(d, None::<Kind>)?;
            let m = match mx {
                Some(m) => Some(
                    v.f_mul(
                        &m.f_amax([d].as_slice(), true)?
                            .f_mul_scalar(2.0)?
                            .f_add_scalar(1.0)?,
                    )?,
                ),
                None => None,
            };
            Val::T(v, m)
        }
        _ => return Ok(None),
    }))
}

/// Linear and windowed operations on `x`: `matmul`, `transpose`, `conv1d`, `conv2d`, `conv3d`,
/// `conv_transpose2d` and the 1-d, 2-d and 3-d max and average pools.
fn linear(c: &Call<'_, '_>, x: &Tensor, mx: Option<&Tensor>) -> R<Option<Val>> {
    let (f, args, env) = (c.f, c.args, c.env);
    Ok(Some(match f {
        "matmul" => {
            let (y, my) = c.tensor_arg(1)?;
            env.contracted(*x.size().last().unwrap_or(&0));
            let v = x.f_matmul(&y)?;
            let m = match (mx, my) {
                (Some(a), Some(b)) => Some(a.f_matmul(&b)?),
                _ => None,
            };
            Val::T(v, m)
        }
        "transpose" => {
            let v = x.f_transpose(-2, -1)?.f_contiguous()?;
            let m = mx
                .map(|m| -> R<Tensor> { m.f_transpose(-2, -1)?.f_contiguous() })
                .transpose()?;
            Val::T(v, m)
        }
        "conv1d" | "conv2d" | "conv3d" | "conv_transpose2d" => {
            let (w, mw) = c.tensor_arg(1)?;
            // A bias is the third argument when it is no number; then stride, padding, groups
            // and an optional dilation.
            let (b, mb, at) = if cudarl_cuda::expr::conv_bias(args) {
                let (b, mb) = c.tensor_arg(2)?;
                (Some(b), mb, 3)
            } else {
                (None, None, 2)
            };
            if args.len() < at + 3 {
                return Err(err(format!(
                    "`{f}`: stride, padding and groups are required"
                )));
            }
            let (st, pad, groups) = (
                int_arg(&args[at], f)?,
                int_arg(&args[at + 1], f)?,
                int_arg(&args[at + 2], f)?,
            );
            let d = args
                .get(at + 3)
                .map(|a| int_arg(a, f))
                .transpose()?
                .unwrap_or(1);
            let conv = |x: &Tensor, w: &Tensor, b: Option<&Tensor>| -> R<Tensor> {
                match f {
                    "conv1d" => x.f_conv1d(w, b, [st], [pad], [d], groups),
                    "conv2d" => x.f_conv2d(w, b, [st, st], [pad, pad], [d, d], groups),
                    "conv3d" => x.f_conv3d(w, b, [st; 3], [pad; 3], [d; 3], groups),
                    _ => x.f_conv_transpose2d(w, b, [st, st], [pad, pad], [0, 0], groups, [d, d]),
                }
            };
            // A transposed convolution's weight is (C_in, C_out / groups, kh, kw): an output
            // element sums C_in / groups input channels times the taps of each dimension that
            // land on it, at most ceil(k / stride) of its k.
            let ws = w.size();
            env.contracted(if f == "conv_transpose2d" {
                let st = st.max(1);
                ws.first().copied().unwrap_or(0) / groups.max(1)
                    * ws.iter()
                        .skip(2)
                        .map(|k| (k + st - 1) / st)
                        .product::<i64>()
            } else {
                ws.iter().skip(1).product()
            });
            let v = conv(x, &w, b.as_ref())?;
            let m = match (mx, mw) {
                (Some(mx), Some(mw)) => Some(conv(mx, &mw, mb.as_ref())?),
                _ => None,
            };
            Val::T(v, m)
        }
        "max_pool1d" | "avg_pool1d" | "max_pool2d" | "avg_pool2d" | "max_pool3d" | "avg_pool3d" => {
            let (k, st) = (int_arg(&args[1], f)?, int_arg(&args[2], f)?);
            let p = args.get(3).map(|a| int_arg(a, f)).transpose()?.unwrap_or(0);
            let d = args.get(4).map(|a| int_arg(a, f)).transpose()?.unwrap_or(1);
            let pool = |t: &Tensor| -> R<Tensor> {
                match f {
                    "max_pool1d" => t.f_max_pool1d([k], [st], [p], [d], false),
                    "avg_pool1d" => t.f_avg_pool1d([k], [st], [p], false, true),
                    "max_pool2d" => t.f_max_pool2d([k; 2], [st; 2], [p; 2], [d; 2], false),
                    "avg_pool2d" => {
                        t.f_avg_pool2d([k; 2], [st; 2], [p; 2], false, true, None::<i64>)
                    }
                    "max_pool3d" => t.f_max_pool3d([k; 3], [st; 3], [p; 3], [d; 3], false),
                    _ => t.f_avg_pool3d([k; 3], [st; 3], [p; 3], false, true, None::<i64>),
                }
            };
            let v = pool(x)?;
            let m = mx.map(pool).transpose()?;
            Val::T(v, m)
        }
        _ => return Ok(None),
    }))
}

/// `layernorm` (over the last dimension) and `group_norm` of `x`, with a weight and a bias.
fn normalization(c: &Call<'_, '_>, x: &Tensor, _mx: Option<&Tensor>) -> R<Option<Val>> {
    let (f, args, env) = (c.f, c.args, c.env);
    Ok(Some(match f {
        "layernorm" => {
            let (w, mw) = c.tensor_arg(1)?;
            let (b, mb) = c.tensor_arg(2)?;
            let eps = match eval_val(&args[3], env, false)? {
                Val::Num(e) => e,
                Val::T(..) => return Err(err("`layernorm`: eps must be a number")),
            };
            let last = *x
                .size()
                .last()
                .ok_or_else(|| err("layernorm of a scalar"))?;
            let v = x.f_layer_norm([last].as_slice(), Some(&w), Some(&b), eps, false)?;
            let m = match (mw, mb) {
                (Some(mw), Some(mb)) => {
                    let yhat = x.f_layer_norm(
                        [last].as_slice(),
                        None::<Tensor>,
                        None::<Tensor>,
                        eps,
                        false,
                    )?;
                    Some(yhat.f_abs()?.f_add_scalar(1.0)?.f_mul(&mw)?.f_add(&mb)?)
                }
                _ => None,
            };
            Val::T(v, m)
        }
        "group_norm" => {
            let (w, mw) = c.tensor_arg(1)?;
            let (b, mb) = c.tensor_arg(2)?;
            let groups = int_arg(&args[3], f)?;
            let eps = c.num_arg(4)?;
            let v = x.f_group_norm(groups, Some(&w), Some(&b), eps, false)?;
            let m = match (mw, mb) {
                (Some(mw), Some(mb)) => {
                    // (|y_hat| + 1) m(w) + m(b), the per-channel affine of the normalized input.
                    let yhat =
                        x.f_group_norm(groups, None::<Tensor>, None::<Tensor>, eps, false)?;
                    let z = yhat.f_abs()?.f_add_scalar(1.0)?;
                    Some(affine(&z, &mw, &mb)?)
                }
                _ => None,
            };
            Val::T(v, m)
        }
        _ => return Ok(None),
    }))
}

/// `z * w + b` with the per-channel `w` and `b` (shape `(C,)`) over dimension 1 of `z`.
fn affine(z: &Tensor, w: &Tensor, b: &Tensor) -> R<Tensor> {
    let mut shape = vec![1i64; z.dim()];
    if shape.len() < 2 {
        return Err(err("`group_norm` needs a (N, C, ...) input"));
    }
    shape[1] = -1;
    z.f_mul(&w.f_reshape(shape.as_slice())?)?
        .f_add(&b.f_reshape(shape.as_slice())?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudarl_cuda::expr::parse;

    fn t(v: &[f64], shape: &[i64]) -> Tensor {
        Tensor::from_slice(v).reshape(shape)
    }
    fn vals(t: &Tensor) -> Vec<f64> {
        Vec::<f64>::try_from(t.reshape([-1])).unwrap()
    }
    fn run(
        src: &str,
        tensors: &[(&str, &Tensor)],
        scalars: &[(&str, f64)],
    ) -> (Vec<f64>, Vec<f64>) {
        let env = Env::new(
            tensors.iter().map(|(n, t)| (n.to_string(), *t)).collect(),
            scalars.iter().map(|(n, v)| (n.to_string(), *v)).collect(),
        );
        let (v, m) = eval(&parse(src).unwrap(), &env, true).unwrap();
        (vals(&v), vals(&m.unwrap()))
    }

    #[test]
    fn elementwise_values_and_magnitudes_by_hand() {
        let a = t(&[1.0, 2.0, -3.0], &[3]);
        let b = t(&[0.5, -2.0, 3.0], &[3]);
        let (v, m) = run("a + b", &[("a", &a), ("b", &b)], &[]);
        assert_eq!(v, vec![1.5, 0.0, 0.0]);
        assert_eq!(m, vec![1.5, 4.0, 6.0]);
        // axpy with a scalar: alpha * x + y.
        let (v, m) = run("alpha * a + b", &[("a", &a), ("b", &b)], &[("alpha", -2.0)]);
        assert_eq!(v, vec![-1.5, -6.0, 9.0]);
        assert_eq!(m, vec![2.5, 6.0, 9.0]);
        let (v, _) = run("relu(a)", &[("a", &a)], &[]);
        assert_eq!(v, vec![1.0, 2.0, 0.0]);
        // gelu(1) = 0.5 * (1 + erf(1 / sqrt 2)) = 0.841344746...
        let (v, _) = run("gelu(a)", &[("a", &a)], &[]);
        assert!((v[0] - 0.841_344_746_068_543).abs() < 1e-12, "{v:?}");
        // A number on either side of maximum / minimum (generated families draw them).
        let (v, m) = run("maximum(0.5, a)", &[("a", &a)], &[]);
        assert_eq!(v, vec![1.0, 2.0, 0.5]);
        assert_eq!(m, vec![1.0, 2.0, 3.0]);
        let (v, m) = run("minimum(a, -2.0)", &[("a", &a)], &[]);
        assert_eq!(v, vec![-2.0, -2.0, -3.0]);
        assert_eq!(m, vec![2.0, 2.0, 3.0]);
        let (v, _) = run("min(relu(minimum(0.5, a)), 0)", &[("a", &a)], &[]);
        assert_eq!(v, vec![0.0]);
        let (v, _) = run("a + maximum(2.0, 0.5)", &[("a", &a)], &[]);
        assert_eq!(v, vec![3.0, 4.0, -1.0]);
    }

    #[test]
    fn reductions_matmul_softmax_layernorm_transpose_by_hand() {
        let x = t(&[1.0, 2.0, 3.0, -1.0, -1.0, 0.25], &[2, 3]);
        let (v, m) = run("sum(x, 1)", &[("x", &x)], &[]);
        assert_eq!(v, vec![6.0, -1.75]);
        assert_eq!(m, vec![6.0, 2.25]);
        let (v, _) = run("sum(x)", &[("x", &x)], &[]);
        assert_eq!(v, vec![4.25]);
        let (v, m) = run("max(x, 1)", &[("x", &x)], &[]);
        assert_eq!((v, m), (vec![3.0, 0.25], vec![3.0, 1.0]));
        let (v, _) = run("max(x)", &[("x", &x)], &[]);
        assert_eq!(v, vec![3.0]);
        let (v, _) = run("transpose(x)", &[("x", &x)], &[]);
        assert_eq!(v, vec![1.0, -1.0, 2.0, -1.0, 3.0, 0.25]);
        let w = t(&[1.0, 0.0, -1.0, 2.0, 0.5, 0.5], &[3, 2]);
        // [1 2 3; -1 -1 0.25] x [1 0; -1 2; .5 .5] = [0.5 5.5; 0.125 -1.875]
        let (v, m) = run("matmul(x, w)", &[("x", &x), ("w", &w)], &[]);
        assert_eq!(v, vec![0.5, 5.5, 0.125, -1.875]);
        assert_eq!(m, vec![4.5, 5.5, 2.125, 2.125]);
        let z = t(&[0.0, f64::ln(3.0)], &[1, 2]);
        let (v, _) = run("softmax(z, 1)", &[("z", &z)], &[]);
        assert!(
            (v[0] - 0.25).abs() < 1e-15 && (v[1] - 0.75).abs() < 1e-15,
            "{v:?}"
        );
        // layernorm([1, 3]) with w = 1, b = 0, eps = 0: mean 2, var 1 -> [-1, 1].
        let y = t(&[1.0, 3.0], &[1, 2]);
        let ones = t(&[1.0, 1.0], &[2]);
        let zeros = t(&[0.0, 0.0], &[2]);
        let (v, m) = run(
            "layernorm(y, w, b, 0)",
            &[("y", &y), ("w", &ones), ("b", &zeros)],
            &[],
        );
        assert_eq!(v, vec![-1.0, 1.0]);
        assert_eq!(m, vec![2.0, 2.0]);
    }

    #[test]
    fn windows_products_and_groups_by_hand() {
        // conv1d of [1, 2, -3, 4] with [1, -1] (no padding, stride 1): [-1, 5, -7]; magnitude
        // the convolution of magnitudes.
        let x = t(&[1.0, 2.0, -3.0, 4.0], &[1, 1, 4]);
        let w = t(&[1.0, -1.0], &[1, 1, 2]);
        let (v, m) = run("conv1d(x, w, 1, 0, 1)", &[("x", &x), ("w", &w)], &[]);
        assert_eq!(v, vec![-1.0, 5.0, -7.0]);
        assert_eq!(m, vec![3.0, 5.0, 7.0]);
        // With a bias, stride 2, padding 1: windows [0, 1], [2, -3], [4, 0].
        let b = t(&[0.5], &[1]);
        let (v, m) = run(
            "conv1d(x, w, b, 2, 1, 1)",
            &[("x", &x), ("w", &w), ("b", &b)],
            &[],
        );
        assert_eq!(v, vec![-0.5, 5.5, 4.5]);
        assert_eq!(m, vec![1.5, 5.5, 4.5]);
        // Dilation 2: taps 2 apart, windows [1, -3] and [2, 4].
        let (v, _) = run("conv1d(x, w, 1, 0, 1, 2)", &[("x", &x), ("w", &w)], &[]);
        assert_eq!(v, vec![4.0, -2.0]);
        // 2 x 2 windows of a 2 x 4 plane, stride 2.
        let p = t(&[1.0, -5.0, 2.0, 3.0, 0.0, 4.0, -1.0, 7.0], &[1, 1, 2, 4]);
        let (v, m) = run("max_pool2d(p, 2, 2)", &[("p", &p)], &[]);
        assert_eq!((v, m), (vec![4.0, 7.0], vec![5.0, 7.0]));
        let (v, _) = run("avg_pool2d(p, 2, 2)", &[("p", &p)], &[]);
        assert_eq!(v, vec![0.0, 2.75]);
        let (v, _) = run("max_pool1d(x, 2, 1)", &[("x", &x)], &[]);
        assert_eq!(v, vec![2.0, 2.0, 4.0]);
        let (v, _) = run("avg_pool1d(x, 3, 1)", &[("x", &x)], &[]);
        assert_eq!(v, vec![0.0, 1.0]);
        // Padding 1 (-inf for max, counted zeros for average) and dilation 2: taps -1 and 1,
        // 0 and 2, 1 and 3, 2 and 4; magnitudes the windows' largest |x|.
        let (v, m) = run("max_pool1d(x, 2, 1, 1, 2)", &[("x", &x)], &[]);
        assert_eq!(
            (v, m),
            (vec![2.0, 1.0, 4.0, -3.0], vec![2.0, 3.0, 4.0, 3.0])
        );
        let (v, _) = run("avg_pool1d(x, 2, 2, 1)", &[("x", &x)], &[]);
        assert_eq!(v, vec![0.5, -0.5, 2.0]);
        // A 2 x 2 x 2 cube of 1..8: one full window; with padding 1 and stride 2, eight
        // windows each holding one element, averaged over 8 taps.
        let c = t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], &[1, 1, 2, 2, 2]);
        let (v, _) = run("max_pool3d(c, 2, 1)", &[("c", &c)], &[]);
        assert_eq!(v, vec![8.0]);
        let (v, _) = run("avg_pool3d(c, 2, 1)", &[("c", &c)], &[]);
        assert_eq!(v, vec![4.5]);
        let (v, _) = run("avg_pool3d(c, 2, 2, 1)", &[("c", &c)], &[]);
        assert_eq!(v, (1..=8).map(|i| i as f64 / 8.0).collect::<Vec<_>>());
        // Transposed: [1, 2] scatters [1, -1] from each position: [1, -1 + 2, -2]; magnitude
        // [1, 1 + 2, 2].
        let xt = t(&[1.0, 2.0], &[1, 1, 1, 2]);
        let wt = t(&[1.0, -1.0], &[1, 1, 1, 2]);
        let (v, m) = run(
            "conv_transpose2d(xt, wt, 1, 0, 1)",
            &[("xt", &xt), ("wt", &wt)],
            &[],
        );
        assert_eq!((v, m), (vec![1.0, 1.0, -2.0], vec![1.0, 3.0, 2.0]));
        // conv3d of a 2 x 2 x 2 cube of ones with a 2 x 2 x 2 filter of 0.5: one output, 4.
        let x3 = t(&[1.0; 8], &[1, 1, 2, 2, 2]);
        let w3 = t(&[0.5; 8], &[1, 1, 2, 2, 2]);
        let (v, _) = run("conv3d(x3, w3, 1, 0, 1)", &[("x3", &x3), ("w3", &w3)], &[]);
        assert_eq!(v, vec![4.0]);
        // Products: n |y| for n factors.
        let q = t(&[1.0, 2.0, -3.0, 0.5, 4.0, 2.0], &[2, 3]);
        let (v, m) = run("prod(q, 1)", &[("q", &q)], &[]);
        assert_eq!((v, m), (vec![-6.0, 4.0], vec![18.0, 12.0]));
        let (v, _) = run("prod(q, 0, 1)", &[("q", &q)], &[]);
        assert_eq!(v, vec![0.5, 8.0, -6.0]);
        let (v, _) = run("cumprod(q, 1)", &[("q", &q)], &[]);
        assert_eq!(v, vec![1.0, 2.0, -6.0, 0.5, 2.0, 4.0]);
        // group_norm with one group of [1, 3] over two channels, w = [2, 1], b = [0, 1],
        // eps 0: y_hat [-1, 1] -> [-2, 2]; magnitude (|y_hat| + 1) |w| + |b| = [4, 3].
        let g = t(&[1.0, 3.0], &[1, 2, 1]);
        let gw = t(&[2.0, 1.0], &[2]);
        let gb = t(&[0.0, 1.0], &[2]);
        let (v, m) = run(
            "group_norm(g, w, b, 1, 0)",
            &[("g", &g), ("w", &gw), ("b", &gb)],
            &[],
        );
        assert_eq!((v, m), (vec![-2.0, 2.0], vec![4.0, 3.0]));
    }

    #[test]
    fn the_longest_contraction_is_counted() {
        let k = |src: &str, tensors: &[(&str, &Tensor)]| {
            let env = Env::new(
                tensors.iter().map(|(n, t)| (n.to_string(), *t)).collect(),
                BTreeMap::new(),
            );
            let _ = eval(&parse(src).unwrap(), &env, true).unwrap();
            env.contraction()
        };
        let z = |d: &[i64]| Tensor::zeros(d, (Kind::Double, tch::Device::Cpu));
        let (a, b, v) = (z(&[2, 3]), z(&[3, 5]), z(&[3]));
        assert_eq!(k("relu(a) + 1", &[("a", &a)]), 0);
        assert_eq!(k("matmul(a, b)", &[("a", &a), ("b", &b)]), 3);
        // Matrix-vector, and a batched product whose inner dimension is 7.
        assert_eq!(k("matmul(a, v)", &[("a", &a), ("v", &v)]), 3);
        let (p, q) = (z(&[4, 2, 7]), z(&[4, 7, 2]));
        assert_eq!(k("matmul(p, q)", &[("p", &p), ("q", &q)]), 7);
        // The longest of several: inner size 3, then the (2 x 5) result times its transpose.
        assert_eq!(
            k(
                "matmul(matmul(a, b), transpose(matmul(a, b)))",
                &[("a", &a), ("b", &b)]
            ),
            5
        );
        // Convolutions: C_in / groups times the kernel's elements.
        let (x, w) = (z(&[1, 4, 8]), z(&[6, 2, 3]));
        assert_eq!(k("conv1d(x, w, 1, 0, 2)", &[("x", &x), ("w", &w)]), 6);
        let (x2, w2) = (z(&[1, 3, 8, 8]), z(&[5, 3, 3, 3]));
        assert_eq!(
            k("conv2d(x2, w2, 1, 1, 1)", &[("x2", &x2), ("w2", &w2)]),
            27
        );
        let (x3, w3) = (z(&[1, 2, 5, 5, 5]), z(&[4, 2, 3, 3, 3]));
        assert_eq!(
            k("conv3d(x3, w3, 1, 0, 1)", &[("x3", &x3), ("w3", &w3)]),
            54
        );
        // Transposed: the weight is (C_in, C_out, kh, kw); C_in times ceil(k / stride) taps
        // per dimension (stride 2 over a 2 x 2 kernel: one tap each; stride 1: all four).
        let (xt, wt) = (z(&[1, 3, 4, 4]), z(&[3, 5, 2, 2]));
        let kt = |st: i64| {
            k(
                &format!("conv_transpose2d(xt, wt, {st}, 0, 1)"),
                &[("xt", &xt), ("wt", &wt)],
            )
        };
        assert_eq!((kt(2), kt(1)), (3, 12));
    }

    #[test]
    fn unknown_names_are_errors() {
        let a = t(&[1.0], &[1]);
        let env = Env::new(BTreeMap::from([("a".to_string(), &a)]), BTreeMap::new());
        let e = eval(&parse("a + q").unwrap(), &env, false).unwrap_err();
        assert!(e.to_string().contains("unknown name `q`"), "{e}");
    }
}
