//! Host references in float64 for the built-in task families, computed after the candidate ran.
//!
//! These are exact by construction (f64 accumulation of f32 inputs). Issue 4 replaces them by
//! tch references for every family; the contract (inputs in argument order, outputs in argument
//! order) stays the same.

use std::collections::BTreeMap;

use rayon::prelude::*;

use crate::task::TaskSpec;

/// One reference output: exact values and, per element, the magnitude `m` the tolerance scales
/// with: `|out - value| <= atol + rtol * m`.
///
/// For elementwise ops `m = sum of |operands|`; for reductions `m = sum of |terms|`, the
/// quantity in the forward error bound of recursive summation, `|s_hat - s| <= gamma_(n-1) *
/// sum |x_i|` (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., eq. 4.4), so
/// any summation order a correct kernel picks stays within tolerance while a wrong sum does not.
#[derive(Debug, Clone, PartialEq)]
pub struct RefOutput {
    /// Exact values (f64).
    pub values: Vec<f64>,
    /// Tolerance magnitudes.
    pub magnitudes: Vec<f64>,
}

/// Computes the outputs of `task` for `inputs` (in argument order).
///
/// # Errors
/// A task with no host reference.
pub fn compute(
    task: &TaskSpec,
    sizes: &BTreeMap<String, i64>,
    inputs: &[&[f32]],
) -> Result<Vec<RefOutput>, String> {
    match task.id.as_str() {
        "vector_add" => Ok(vec![RefOutput {
            values: inputs[0]
                .par_iter()
                .zip(inputs[1])
                .map(|(a, b)| *a as f64 + *b as f64)
                .collect(),
            magnitudes: inputs[0]
                .par_iter()
                .zip(inputs[1])
                .map(|(a, b)| (*a as f64).abs() + (*b as f64).abs())
                .collect(),
        }]),
        "row_sum" => {
            let (rows, cols) = (sizes["rows"] as usize, sizes["cols"] as usize);
            let row = |r: usize| &inputs[0][r * cols..(r + 1) * cols];
            Ok(vec![RefOutput {
                values: (0..rows)
                    .into_par_iter()
                    .map(|r| row(r).iter().map(|v| *v as f64).sum())
                    .collect(),
                magnitudes: (0..rows)
                    .into_par_iter()
                    .map(|r| row(r).iter().map(|v| (*v as f64).abs()).sum())
                    .collect(),
            }])
        }
        other => Err(format!("no host reference for task `{other}`")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_computed_cases() {
        let spec_va = TaskSpec {
            id: "vector_add".into(),
            ..crate::task::tests_support::dummy()
        };
        let out = compute(
            &spec_va,
            &BTreeMap::from([("n".into(), 3)]),
            &[&[1.0, 2.0, -3.0], &[0.5, -2.0, 3.0]],
        )
        .unwrap();
        assert_eq!(out[0].values, vec![1.5, 0.0, 0.0]);
        assert_eq!(out[0].magnitudes, vec![1.5, 4.0, 6.0]);
        let spec_rs = TaskSpec {
            id: "row_sum".into(),
            ..crate::task::tests_support::dummy()
        };
        let out = compute(
            &spec_rs,
            &BTreeMap::from([("rows".into(), 2), ("cols".into(), 3)]),
            &[&[1.0, 2.0, 3.0, -1.0, -1.0, 0.25]],
        )
        .unwrap();
        assert_eq!(out[0].values, vec![6.0, -1.75]);
        assert_eq!(out[0].magnitudes, vec![6.0, 2.25]);
    }
}
