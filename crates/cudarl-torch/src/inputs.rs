//! Input generation and element types of the native harness: fresh, seeded inputs drawn on the
//! GPU, the bit patterns outputs are poisoned with, and the scalar values of a seed.

use cudarl_cuda::task::{ArgKind, TaskSpec};
use tch::{Device, Kind, Tensor};

use crate::error::JudgeError;

/// How a task's element type is stored: its libtorch float kind and the same-width integer
/// kind the harness uses to fill and compare bit patterns.
#[derive(Clone, Copy)]
pub struct Elem {
    /// The float kind.
    pub float: Kind,
    /// The same-width integer kind (bit patterns).
    pub bits: Kind,
    /// Poison for outputs: a NaN payload no arithmetic produces (canonical NaNs are 0x7FC00000,
    /// 0x7E00 (f16) and 0x7FC0 (bf16)); 0x7FBA is a NaN in both 16-bit formats.
    pub poison: i64,
    /// Fill of the guard region after every buffer.
    pub guard: i64,
    /// Bytes per element.
    pub size: i64,
}

impl Elem {
    /// The element type of task dtype `dtype`.
    ///
    /// # Errors
    /// A dtype the native runner does not support.
    pub fn of(dtype: &str) -> Result<Elem, JudgeError> {
        Ok(match dtype {
            "f32" => Elem {
                float: Kind::Float,
                bits: Kind::Int,
                poison: 0x7FBA_DBAD,
                guard: 0x7FC0_FFEE,
                size: 4,
            },
            "f16" | "bf16" => Elem {
                float: if dtype == "f16" {
                    Kind::Half
                } else {
                    Kind::BFloat16
                },
                bits: Kind::Int16,
                poison: 0x7FBA,
                guard: 0x7FCE,
                size: 2,
            },
            d => {
                return Err(JudgeError::Task(format!(
                    "dtype `{d}` is not supported by the native runner"
                )));
            }
        })
    }
}

/// The SplitMix64 finalizer (Steele, Lea, Flood, "Fast splittable pseudorandom number
/// generators", OOPSLA 2014): mixes (seed, argument) into the generator seed of one buffer.
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One input buffer of `len` elements of `kind` for (`seed`, argument `arg_index`), drawn on
/// `dev` with libtorch's generator seeded by SplitMix64(seed, arg) (Philox on CUDA:
/// reproducible for one seed, GPU model and torch version): float32 uniform in `[-s, s)`,
/// `s = scale`, then rounded to `kind` (f16/bf16 tasks).
///
/// # Errors
/// libtorch errors (out of memory).
pub fn gen_input(
    len: i64,
    seed: u64,
    arg_index: usize,
    scale: f64,
    kind: Kind,
    dev: Device,
) -> Result<Tensor, JudgeError> {
    tch::manual_seed(mix64(seed ^ mix64(arg_index as u64 + 1)) as i64);
    let r = Tensor::f_rand([len], (Kind::Float, dev))
        .and_then(|t| t.f_mul_scalar(2.0 * scale))
        .and_then(|t| t.f_sub_scalar(scale))
        .and_then(|t| t.f_to_kind(kind))?;
    Ok(r)
}

/// The scalar arguments for `seed`: each scalar's value list from the task spec, indexed by
/// the seed, so hidden seeds may use values the prompt never showed.
pub fn scalar_values(task: &TaskSpec, seed: u64) -> Vec<(String, f64)> {
    task.args
        .iter()
        .filter(|a| a.kind == ArgKind::Scalar)
        .map(|a| {
            let vals = task.scalars.get(&a.name).map(Vec::as_slice).unwrap_or(&[]);
            let v = if vals.is_empty() {
                1.0
            } else {
                vals[(seed % vals.len() as u64) as usize]
            };
            (a.name.clone(), v)
        })
        .collect()
}
