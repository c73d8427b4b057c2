//! The f32 tolerance of a task with a contraction (matmul, linear, convolution) is derived from
//! f32's rounding bound (`TaskSpec::rtol_for`): on every such task of the default pipeline (the
//! operator families and `datasets/tasks/`), at its first train shape and its first hold-out
//! shape and at the judge's input scales of 1 and above, the reference evaluated in f32 by
//! libtorch on the CPU (one honest evaluation order) is within it; the same evaluation with the
//! contractions' operands rounded to TF32 (what tensor-core TF32 math computes: 10 mantissa
//! bits, products summed in f32) is outside it on every task whose contraction reaches the
//! output through bias, scaling and piecewise-linear activations only and is at most 2,048
//! terms long.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use cudarl_cuda::expr::{Expr, parse};
use cudarl_cuda::task::{ArgKind, DEFAULT_INPUT_SCALES, TaskSpec, eval_formula};
use cudarl_torch::eval::{Env, eval, tolerance};
use tch::{Kind, Tensor};

const CONTRACTIONS: [&str; 5] = ["matmul", "conv1d", "conv2d", "conv3d", "conv_transpose2d"];

/// `x` rounded to TF32 (11 significant bits, ties to even), in float64.
fn tf32(x: &Tensor) -> Tensor {
    let e = x.abs().clamp_min(f64::MIN_POSITIVE).log2().floor();
    let scale = (e - 10.0).exp2();
    let r = (x / &scale).round() * scale;
    r.where_self(&x.ne(0.0), x)
}

/// The names read by the operands of `e`'s contractions (a convolution's bias excluded).
fn contracted_names(e: &Expr, out: &mut BTreeSet<String>) {
    match e {
        Expr::Num(_) | Expr::Var(_) => {}
        Expr::Neg(a) => contracted_names(a, out),
        Expr::Bin(_, a, b) => {
            contracted_names(a, out);
            contracted_names(b, out);
        }
        Expr::Call(f, args) => {
            if CONTRACTIONS.contains(&f.as_str()) {
                out.extend(args[0].vars());
                out.extend(args[1].vars());
            }
            args.iter().for_each(|a| contracted_names(a, out));
        }
    }
}

/// Whether every step between `e`'s inputs and its value is a contraction, a transpose, a sum
/// or difference, a product or quotient with a number, or a piecewise-linear activation.
fn linear(e: &Expr) -> bool {
    const PIECEWISE: [&str; 4] = ["relu", "leaky_relu", "hardtanh", "abs"];
    match e {
        Expr::Num(_) | Expr::Var(_) => true,
        Expr::Neg(a) => linear(a),
        Expr::Bin('+' | '-', a, b) => linear(a) && linear(b),
        Expr::Bin(_, a, b) => {
            (matches!(**a, Expr::Num(_)) || matches!(**b, Expr::Num(_))) && linear(a) && linear(b)
        }
        Expr::Call(f, args) => {
            let f = f.as_str();
            (CONTRACTIONS.contains(&f) || f == "transpose" || PIECEWISE.contains(&f))
                && args.iter().all(linear)
        }
    }
}

/// The largest `|got - ref|` over the judge's tolerance ([`tolerance`]): at most 1 is within.
fn worst(got: &Tensor, want: &Tensor, tol: &Tensor) -> f64 {
    ((got.to_kind(Kind::Double) - want).abs() / tol)
        .max()
        .double_value(&[])
}

#[derive(Debug)]
struct Outcome {
    id: String,
    k: i64,
    linear: bool,
    honest: f64,
    tf32: f64,
    tf32_task_rtol: f64,
}

/// Evaluates `spec`'s output reference at `sizes` on inputs uniform in `[-scale, scale)` (f32
/// values): `None` when it has no contraction, has more than 4M elements in an input, or its
/// float64 value is not finite.
fn outcome(spec: &TaskSpec, sizes: &BTreeMap<String, i64>, scale: f64) -> Option<Outcome> {
    let out = spec.args.iter().find(|a| a.kind == ArgKind::Output)?;
    let e = parse(&spec.reference[&out.name]).expect("reference parses");
    let mut rounded = BTreeSet::new();
    contracted_names(&e, &mut rounded);
    let mut inputs: Vec<(String, Tensor)> = Vec::new();
    for a in spec.args.iter().filter(|a| a.kind == ArgKind::Input) {
        let dims: Vec<i64> = a
            .shape
            .iter()
            .map(|d| eval_formula(d, sizes).expect("dim"))
            .collect();
        if dims.iter().product::<i64>() > 1 << 22 {
            return None;
        }
        let t =
            (Tensor::rand(dims.as_slice(), (Kind::Float, tch::Device::Cpu)) * 2.0 - 1.0) * scale;
        inputs.push((a.name.clone(), t.to_kind(Kind::Double)));
    }
    let scalars: BTreeMap<String, f64> = spec
        .scalars
        .iter()
        .map(|(k, v)| (k.clone(), v[0]))
        .collect();
    let run = |kind: Kind, round: bool| {
        let ts: Vec<(String, Tensor)> = inputs
            .iter()
            .map(|(n, t)| {
                let t = if round && rounded.contains(n) {
                    tf32(t)
                } else {
                    t.shallow_clone()
                };
                (n.clone(), t.to_kind(kind))
            })
            .collect();
        let env = Env::new(
            ts.iter().map(|(n, t)| (n.clone(), t)).collect(),
            scalars.clone(),
        );
        let (v, m) = eval(&e, &env, kind == Kind::Double).expect("evaluates");
        (v, m, env.contraction())
    };
    let (want, m, k) = run(Kind::Double, false);
    let m = m.expect("magnitude");
    if k == 0 || !bool::try_from(want.isfinite().all()).expect("bool") {
        return None;
    }
    // The judge's tolerance, and the task's own (the tolerance of an output with no contraction).
    let (tol, own) = (
        tolerance(spec, &m, k).expect("tolerance"),
        tolerance(spec, &m, 0).expect("tolerance"),
    );
    let (honest, _, _) = run(Kind::Float, false);
    let (tf, _, _) = run(Kind::Float, true);
    Some(Outcome {
        id: spec.id.clone(),
        k,
        linear: linear(&e),
        honest: worst(&honest, &want, &tol),
        tf32: worst(&tf, &want, &tol),
        tf32_task_rtol: worst(&tf, &want, &own),
    })
}

#[test]
fn f32_contractions_pass_in_f32_and_fail_in_tf32() {
    let specs: Vec<TaskSpec> = common::default_task_specs()
        .into_iter()
        .filter(|s| s.dtype == "f32")
        .collect();
    tch::manual_seed(0);
    let mut outcomes = Vec::new();
    for s in &specs {
        // The judge's scales of 1 and above: at 0.01 the tolerance is `atol` alone.
        let scales: Vec<f64> = (s.input_scales.clone())
            .unwrap_or(DEFAULT_INPUT_SCALES.to_vec())
            .into_iter()
            .filter(|v| *v >= 1.0)
            .collect();
        for sizes in [&s.train_shapes[0], &s.holdout_shapes[0]] {
            for scale in &scales {
                outcomes.extend(outcome(s, sizes, *scale));
            }
        }
    }
    let tasks: BTreeSet<&str> = outcomes.iter().map(|o| o.id.as_str()).collect();
    // The default draw has matmul, linear and convolution families of every tier from 2 up.
    assert!(
        tasks.len() >= 100,
        "{} tasks with a contraction",
        tasks.len()
    );
    assert!(
        tasks.contains("matmul_bias_relu"),
        "the hand-written matmul_bias_relu was left out"
    );
    let honest_out: Vec<&Outcome> = outcomes.iter().filter(|o| o.honest > 1.0).collect();
    assert!(
        honest_out.is_empty(),
        "f32 outside the derived tolerance: {honest_out:?}"
    );
    // A verdict fails when any test does: a task rejects TF32 when one of its cases does.
    let mut by_task: BTreeMap<&str, Vec<&Outcome>> = BTreeMap::new();
    for o in &outcomes {
        by_task.entry(o.id.as_str()).or_default().push(o);
    }
    let rejects =
        |cases: &[&Outcome], f: &dyn Fn(&Outcome) -> f64| cases.iter().any(|o| f(o) > 1.0);
    let linear_short: Vec<(&str, &Vec<&Outcome>)> = by_task
        .iter()
        .filter(|(_, c)| c.iter().all(|o| o.linear && o.k <= 2048))
        .map(|(id, c)| (*id, c))
        .collect();
    assert!(
        linear_short.len() >= 30,
        "{} linear tasks",
        linear_short.len()
    );
    let tf32_in: Vec<&&Vec<&Outcome>> = linear_short
        .iter()
        .map(|(_, c)| c)
        .filter(|c| !rejects(c, &|o| o.tf32))
        .collect();
    assert!(
        tf32_in.is_empty(),
        "TF32 within the derived tolerance: {tf32_in:?}"
    );
    // The derivation is what catches them: under the tasks' own rtol TF32 passes some.
    let before = linear_short
        .iter()
        .filter(|(_, c)| rejects(c, &|o| o.tf32_task_rtol))
        .count();
    assert!(
        before < linear_short.len(),
        "TF32 failed every linear task under the tasks' own rtol"
    );
    let short: Vec<&Vec<&Outcome>> = by_task
        .values()
        .filter(|c| c.iter().all(|o| o.k <= 2048))
        .collect();
    eprintln!(
        "{} tasks with a contraction ({} cases: shape x input scale), {} with K <= 2048 at both \
         shapes ({} linear up to the output): f32 uses at most {:.3} of the derived tolerance; \
         TF32 is rejected on {} of those {} (every linear one), under the tasks' own rtol on {} \
         ({} of the linear ones)",
        tasks.len(),
        outcomes.len(),
        short.len(),
        linear_short.len(),
        outcomes.iter().map(|o| o.honest).fold(0.0, f64::max),
        short.iter().filter(|c| rejects(c, &|o| o.tf32)).count(),
        short.len(),
        short
            .iter()
            .filter(|c| rejects(c, &|o| o.tf32_task_rtol))
            .count(),
        before,
    );
}
