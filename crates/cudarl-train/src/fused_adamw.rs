//! The fused AdamW step of a bf16 parameter with float32 or bf16 moments and stochastic
//! rounding, of a bf16 parameter with float32 moments and a Kahan buffer, or of a float32
//! parameter with float32 moments (`csrc/adamw.cu`, compiled by build.rs with nvcc into a
//! fatbin this crate embeds): one kernel reads the gradient, the parameter and both moments
//! once and writes the parameter and the moments once, 22 bytes of memory traffic a parameter
//! (14 with bf16 moments, 26 with the Kahan buffer, 28 in float32) against about 150 (108 in
//! float32) for the same arithmetic as libtorch ops ([`crate::adamw::AdamW`]'s fallback). Launched with the CUDA
//! driver API (cudarc) on libtorch's current stream, so it stays in order with libtorch's work.
//! Measured effect: `benchmarks/results/model_scale_h200_2026-11-30.json` (`fused_adamw`; for
//! float32, `grpo_update.fused_float32_adamw`: a GRPO update at Qwen2.5-Coder 1.5B, full mode,
//! 1.24 to 1.12 s; for SFT and Kahan, `sft_fused_optimizer`).

use std::ffi::c_void;
use std::sync::Mutex;

use tch::{Device, Kind, Tensor};

unsafe extern "C" {
    fn cudarl_current_stream(device: i32) -> *mut c_void;
    fn cudarl_tensor_bump_version(t: *const c_void);
}

#[cfg(cudarl_fused_adamw)]
static FATBIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/adamw.fatbin"));
#[cfg(not(cudarl_fused_adamw))]
static FATBIN: &[u8] = &[];

/// The kernels: bf16 parameters with float32 moments, with bf16 moments; float32 throughout;
/// bf16 parameters with float32 moments and a Kahan buffer.
const KERNELS: [&str; 4] = [
    "cudarl_adamw_bf16_stochastic",
    "cudarl_adamw_bf16_stochastic_bf16_moments",
    "cudarl_adamw_f32",
    "cudarl_adamw_bf16_kahan",
];

/// One step's scalars, as the kernel takes them (float32; `adamw.rs`'s formula).
#[derive(Debug, Clone, Copy)]
pub struct StepScalars {
    /// `1 - beta1`.
    pub one_minus_b1: f32,
    /// `beta2`.
    pub b2: f32,
    /// `1 - beta2`.
    pub one_minus_b2: f32,
    /// `sqrt(1 - beta2^t)`.
    pub bc2_sqrt: f32,
    /// Added to the denominator.
    pub eps: f32,
    /// `-(1 - beta1^t) / lr`.
    pub neg_bc1_over_lr: f32,
    /// `1 - lr * weight_decay`.
    pub decay: f32,
    /// The stochastic rounding's seed (the kernel's bits are a function of it and the index).
    pub seed: u64,
}

impl StepScalars {
    /// The scalars of step `t` (counted from 1) at learning rate `lr` of AdamW with `cfg`'s
    /// betas, epsilon and decoupled weight decay, rounding with `seed`.
    pub fn new(cfg: &crate::adamw::AdamWConfig, lr: f64, t: i64, seed: u64) -> StepScalars {
        let bc1 = 1.0 - cfg.beta1.powi(t as i32);
        let bc2 = 1.0 - cfg.beta2.powi(t as i32);
        StepScalars {
            one_minus_b1: (1.0 - cfg.beta1) as f32,
            b2: cfg.beta2 as f32,
            one_minus_b2: (1.0 - cfg.beta2) as f32,
            bc2_sqrt: bc2.sqrt() as f32,
            eps: cfg.eps as f32,
            neg_bc1_over_lr: (-bc1 / lr) as f32,
            decay: (1.0 - lr * cfg.weight_decay) as f32,
            seed,
        }
    }
}

/// The loaded kernels per device ordinal ([`KERNELS`]' `CUfunction`s and the primary
/// `CUcontext` as addresses), or why they cannot run there.
type Loaded = Result<([usize; 4], usize), String>;
static FUNCTIONS: Mutex<Vec<(i32, Loaded)>> = Mutex::new(Vec::new());

/// Whether this build embeds the kernel (nvcc was found at build time, and the CUDA shim
/// was built: [`crate::cuda_graph::available`]).
pub fn available() -> bool {
    !FATBIN.is_empty() && crate::cuda_graph::available()
}

fn load(ordinal: i32) -> Loaded {
    cudarl_cuda::gpu::load_embedded_kernels(FATBIN, ordinal, &KERNELS)
}

/// Runs one AdamW step of `param` (bf16, contiguous, on a CUDA device) with its gradient
/// `grad` (bf16, same shape) and moments `exp_avg`, `exp_avg_sq` (both float32 or both bf16,
/// rounded stochastically; contiguous, same shape), or of a float32 `param` with a float32
/// gradient and moments (no rounding; `s.seed` unused), or, with `kahan`, of a bf16 `param`
/// with float32 moments rounded to nearest, what the rounding lost kept in `kahan` (bf16, same
/// shape; [`crate::adamw::Rounding::Kahan`]), all updated in place, and bumps `param`'s version
/// counter (a decoder's copy sees the change). Returns `false`, having changed nothing, when the tensors do not qualify or
/// the kernel cannot run on this build or device (the caller then takes the libtorch path);
/// the first such kernel failure is printed to stderr.
pub fn step(
    param: &Tensor,
    grad: &Tensor,
    exp_avg: &Tensor,
    exp_avg_sq: &Tensor,
    kahan: Option<&Tensor>,
    s: &StepScalars,
) -> bool {
    let Device::Cuda(ordinal) = param.device() else {
        return false;
    };
    let Some(kernel) = kernel_for(param, grad, exp_avg, exp_avg_sq, kahan) else {
        return false;
    };
    let ordinal = ordinal as i32;
    let Some((fs, ctx)) = functions(ordinal) else {
        return false;
    };
    let f = fs[kernel];
    let n = param.numel() as i64;
    if n == 0 {
        return true;
    }
    // SAFETY: `f` and `ctx` are `functions`' for this device, `f` the kernel `kernel_for`
    // picked for these tensors, which qualified.
    let launched = unsafe {
        launch(
            (f, ctx, ordinal),
            [param, grad, exp_avg, exp_avg_sq],
            kahan,
            n,
            s,
        )
    };
    match launched {
        Ok(()) => {
            // SAFETY: `as_ptr` is a live `at::Tensor*` for as long as `param`.
            unsafe { cudarl_tensor_bump_version(param.as_ptr().cast()) };
            true
        }
        Err(e) => {
            eprintln!("fused AdamW launch failed on cuda:{ordinal}: {e:?}; libtorch ops instead");
            let mut fns = FUNCTIONS.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(slot) = fns.iter_mut().find(|(o, _)| *o == ordinal) {
                slot.1 = Err(format!("{e:?}"));
            }
            false
        }
    }
}

/// The index in [`KERNELS`] of the kernel for these tensors' dtypes, or `None` when they do
/// not qualify (other dtypes, devices, shapes or strides than [`step`] takes, or no kernel in
/// this build).
fn kernel_for(
    param: &Tensor,
    grad: &Tensor,
    exp_avg: &Tensor,
    exp_avg_sq: &Tensor,
    kahan: Option<&Tensor>,
) -> Option<usize> {
    let kinds = match (
        param.kind(),
        grad.kind(),
        exp_avg.kind(),
        kahan.map(Tensor::kind),
    ) {
        (Kind::BFloat16, Kind::BFloat16, Kind::Float, None) => Some(0),
        (Kind::BFloat16, Kind::BFloat16, Kind::BFloat16, None) => Some(1),
        (Kind::Float, Kind::Float, Kind::Float, None) => Some(2),
        (Kind::BFloat16, Kind::BFloat16, Kind::Float, Some(Kind::BFloat16)) => Some(3),
        _ => None,
    };
    let mut tensors = vec![grad, exp_avg, exp_avg_sq];
    tensors.extend(kahan);
    let qualifies = available()
        && kinds.is_some()
        && exp_avg_sq.kind() == exp_avg.kind()
        && tensors
            .iter()
            .all(|t| t.device() == param.device() && t.size() == param.size())
        && param.is_contiguous()
        && tensors.iter().all(|t| t.is_contiguous());
    if !qualifies {
        return None;
    }
    kinds
}

/// The kernels and the context loaded on device `ordinal` (loaded on first use, the failure
/// printed to stderr once), or `None` when they cannot run there.
fn functions(ordinal: i32) -> Option<([usize; 4], usize)> {
    let mut fns = FUNCTIONS.lock().unwrap_or_else(|p| p.into_inner());
    let at = match fns.iter().position(|(o, _)| *o == ordinal) {
        Some(i) => i,
        None => {
            let loaded = load(ordinal);
            if let Err(e) = &loaded {
                eprintln!("fused AdamW unavailable on cuda:{ordinal}: {e}; libtorch ops instead");
            }
            fns.push((ordinal, loaded));
            fns.len() - 1
        }
    };
    match &fns[at].1 {
        Ok(x) => Some(*x),
        Err(_) => None,
    }
}

/// Launches kernel `f` (a `CUfunction` address, loaded in context `ctx` of device `ordinal`)
/// on the `n` elements of `[param, grad, exp_avg, exp_avg_sq]` and `kahan`, with step scalars
/// `s`, on libtorch's current stream.
///
/// # Safety
/// `f` and `ctx` come from [`functions`] for `ordinal`, `f` is the kernel [`kernel_for`]
/// picked for these tensors, and they qualified there.
unsafe fn launch(
    (f, ctx, ordinal): (usize, usize, i32),
    [param, grad, exp_avg, exp_avg_sq]: [&Tensor; 4],
    kahan: Option<&Tensor>,
    n: i64,
    s: &StepScalars,
) -> Result<(), cudarc::driver::result::DriverError> {
    let (mut p, mut g, mut m, mut v) = (
        param.data_ptr(),
        grad.data_ptr(),
        exp_avg.data_ptr(),
        exp_avg_sq.data_ptr(),
    );
    let mut n_arg = n;
    let mut sc = *s;
    let mut c = kahan.map_or(std::ptr::null_mut(), Tensor::data_ptr);
    let mut args: Vec<*mut c_void> = vec![
        (&mut p as *mut *mut c_void).cast(),
        (&mut g as *mut *mut c_void).cast(),
        (&mut m as *mut *mut c_void).cast(),
        (&mut v as *mut *mut c_void).cast(),
        (&mut n_arg as *mut i64).cast(),
        (&mut sc.one_minus_b1 as *mut f32).cast(),
        (&mut sc.b2 as *mut f32).cast(),
        (&mut sc.one_minus_b2 as *mut f32).cast(),
        (&mut sc.bc2_sqrt as *mut f32).cast(),
        (&mut sc.eps as *mut f32).cast(),
        (&mut sc.neg_bc1_over_lr as *mut f32).cast(),
        (&mut sc.decay as *mut f32).cast(),
        (&mut sc.seed as *mut u64).cast(),
    ];
    if kahan.is_some() {
        args.push((&mut c as *mut *mut c_void).cast());
    }
    const THREADS: i64 = 256;
    let blocks = ((n + THREADS - 1) / THREADS).min(16_384) as u32;
    // SAFETY: `f` is a kernel loaded on this device's primary context; the pointers are live
    // CUDA tensors of `n` elements of the kernel's dtypes (the caller's contract), the arguments
    // match its signature in order and type, and it runs on libtorch's current stream, after the
    // work that produced the gradient and before any later reader.
    unsafe {
        let stream = cudarl_current_stream(ordinal);
        cudarc::driver::result::ctx::set_current(ctx as cudarc::driver::sys::CUcontext).and_then(
            |()| {
                cudarc::driver::result::launch_kernel(
                    f as cudarc::driver::sys::CUfunction,
                    (blocks, 1, 1),
                    (THREADS as u32, 1, 1),
                    0,
                    stream.cast(),
                    &mut args,
                )
            },
        )
    }
}
