//! Torch operations standing in for a torch-format candidate's kernel, found from the kernels
//! that ran on the GPU rather than from source text (docs/architecture.md, "Torch ops standing
//! in").
//!
//! The judge profiles one forward of the candidate (in its runner) and one of the reference
//! `Model` (in the judge) at the problem's own sizes with CUPTI's activity API (`Cupti` in the
//! worker script), and answers each as kernel names with their summed GPU time; names come
//! mangled and are demangled here, with the library that reads the candidate's own kernels. The candidate's own kernels are
//! read from the shared objects it was built into ([`own_kernels`]): nvcc's host stub for each
//! `__global__` function carries the kernel's mangled name, so macros, templates and namespaces
//! are resolved by the compiler, not guessed from the source.

use std::collections::BTreeSet;

use object::{Object, ObjectSymbol};
use serde::Deserialize;

/// Library kernels that only move data a wrapper needs (aten's fill for `zeros`/`full`, its copy
/// for `contiguous`/`copy_`): never counted as the reference's work.
const PLUMBING: [&str; 2] = ["FillFunctor", "copy_kernel"];

/// Memory copies and sets, as the profiler names them (`Memcpy DtoD (Device -> Device)`,
/// `Memset (Device)`): not kernels.
const TRANSFERS: [&str; 2] = ["Memcpy", "Memset"];

/// The GPU work of one profiled forward: `(kernel name, summed GPU time in ns)`, longest first.
/// Names are demangled ([`crate::diag::demangle`]: `ns::k<float>(float const*, int)`); copies
/// and sets are `Memcpy HtoD`, `Memcpy DtoD`, ..., `Memset`.
pub type KernelTimes = Vec<(String, u64)>;

/// What the judge profiled at the problem's own sizes: the candidate's forward (in its runner)
/// and the reference's (in the judge). Deserialized from the worker's `[[name, ns], ...]` lists,
/// mangled names demangled (a name that does not demangle is kept as given, so reading a list
/// again changes nothing).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct KernelsRan {
    /// The candidate's forward.
    #[serde(deserialize_with = "demangled")]
    pub candidate: KernelTimes,
    /// The reference `Model`'s forward.
    #[serde(deserialize_with = "demangled")]
    pub reference: KernelTimes,
}

fn demangled<'de, D: serde::Deserializer<'de>>(d: D) -> Result<KernelTimes, D::Error> {
    let v = KernelTimes::deserialize(d)?;
    Ok(v.into_iter()
        .map(|(n, t)| (crate::diag::demangle(&n), t))
        .collect())
}

/// The qualified name of a demangled function without its return type, template arguments or
/// parameters: `void ns::relu_kernel<float>(float const*, float*, int)` -> `ns::relu_kernel`.
pub fn base_name(demangled: &str) -> String {
    let anon = demangled.replace("(anonymous namespace)", "{anon}");
    let mut out = String::new();
    let mut depth = 0usize;
    for c in anon.chars() {
        match c {
            '<' => depth += 1,
            '>' => depth = depth.saturating_sub(1),
            '(' if depth == 0 => break,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    let name = out.split_whitespace().last().unwrap_or_default();
    name.replace("{anon}", "(anonymous namespace)")
}

/// The base names ([`base_name`]) of the `__global__` functions defined in the shared object
/// `bytes`: from nvcc's host stubs, `__device_stub__<mangled kernel name minus its leading
/// underscore>`, demangled with `cpp_demangle`.
///
/// # Errors
/// The bytes are not an object file `object` can parse.
pub fn own_kernels(bytes: &[u8]) -> Result<BTreeSet<String>, crate::inspect::ObjectError> {
    const STUB: &str = "__device_stub__";
    let file = object::File::parse(bytes)?;
    let mut names = BTreeSet::new();
    for s in file.symbols() {
        let Ok(sym) = s.name() else { continue };
        // `_Z30__device_stub__Z10gemm_macroPfPf`, `_ZL47__device_stub__ZN2ns...`: the stub's own
        // name is one length-prefixed identifier.
        let Some(rest) = sym.strip_prefix("_Z") else {
            continue;
        };
        let rest = rest.strip_prefix('L').unwrap_or(rest);
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let Ok(len) = rest[..digits].parse::<usize>() else {
            continue;
        };
        let Some(ident) = rest.get(digits..digits + len) else {
            continue;
        };
        let Some(kernel) = ident.strip_prefix(STUB) else {
            continue;
        };
        let mangled = format!("_{kernel}");
        let name = crate::diag::demangle(&mangled);
        names.insert(base_name(&name));
    }
    Ok(names)
}

fn is_transfer(name: &str) -> bool {
    TRANSFERS.iter().any(|t| name.starts_with(t))
}

/// Torch operations standing in for the candidate's kernels, or `None`. `own` holds the base
/// names of the candidate's kernels ([`own_kernels`]). Flagged when
/// - none of the candidate's own kernels ran (when `own` is known: empty means unknown), or
/// - the reference ran at least one kernel that is not data movement (`PLUMBING`) and every
///   such kernel also ran for the candidate: its own kernels replaced none of the reference's
///   work (a token launch beside `torch.relu`, `getattr(F, ...)`, `torch.ops.aten`).
///
/// Torch operations for the parts the candidate's kernels do not replace (a cuBLAS matmul
/// before a fused custom epilogue) are not flagged: the reference's epilogue kernels are then
/// missing from the candidate's run. Returns the reason, naming the kernels, for the feedback.
pub fn stands_in(ran: &KernelsRan, own: &BTreeSet<String>) -> Option<String> {
    let is_own = |n: &str| own.contains(&base_name(n));
    let show = |v: &[&str]| {
        v.iter()
            .take(3)
            .map(|n| format!("`{}`", base_name(n)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let library: Vec<&str> = ran
        .candidate
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| !is_transfer(n) && !is_own(n))
        .collect();
    if !own.is_empty() && !ran.candidate.iter().any(|(n, _)| is_own(n)) {
        return Some(if library.is_empty() {
            "none of the candidate's own kernels ran".into()
        } else {
            format!(
                "none of the candidate's own kernels ran; the GPU ran {}",
                show(&library)
            )
        });
    }
    let work: Vec<&str> = ran
        .reference
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| !is_transfer(n) && !PLUMBING.iter().any(|p| n.contains(p)))
        .collect();
    let ran_names: BTreeSet<&str> = ran.candidate.iter().map(|(n, _)| n.as_str()).collect();
    if !work.is_empty() && work.iter().all(|n| ran_names.contains(n)) {
        return Some(format!(
            "every kernel the reference runs also ran for the candidate ({}): its own kernels replaced none of the reference's work",
            show(&work)
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const RELU: &str = "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)::{lambda()#1}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul> >(int, at::native::(anonymous namespace)::launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)::{lambda()#1}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul>)";
    const FILL: &str = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)";
    const GEMM: &str = "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas";

    fn ran(candidate: &[(&str, u64)], reference: &[(&str, u64)]) -> KernelsRan {
        let v = |x: &[(&str, u64)]| x.iter().map(|(n, t)| (n.to_string(), *t)).collect();
        KernelsRan {
            candidate: v(candidate),
            reference: v(reference),
        }
    }

    #[test]
    fn base_names_drop_return_types_templates_and_parameters() {
        assert_eq!(
            base_name("void ns::relu_kernel<float>(float const*, float*, int)"),
            "ns::relu_kernel"
        );
        assert_eq!(base_name("gemm_macro(float*)"), "gemm_macro");
        assert_eq!(
            base_name("(anonymous namespace)::kernel(float*)"),
            "(anonymous namespace)::kernel"
        );
        assert_eq!(base_name(RELU), "at::native::vectorized_elementwise_kernel");
        assert_eq!(base_name(GEMM), GEMM);
    }

    #[test]
    fn a_token_kernel_beside_the_reference_op_is_flagged() {
        let own = BTreeSet::from(["token".to_string()]);
        let r = ran(
            &[("token(float*)", 1_500), (RELU, 2_000_000)],
            &[(RELU, 2_000_000)],
        );
        let why = stands_in(&r, &own).expect("flagged");
        assert!(why.contains("replaced none"), "{why}");
        assert!(why.contains("vectorized_elementwise_kernel"), "{why}");
    }

    #[test]
    fn lists_read_from_the_worker_are_demangled_once() {
        let k: KernelsRan = serde_json::from_str(
            r#"{"candidate": [["_Z11relu_kernelPKfPfi", 7], ["Memcpy DtoD", 2]],
                "reference": [["relu_kernel(float const*, float*, int)", 5], ["_Z4tanhPf", 1]]}"#,
        )
        .unwrap();
        assert_eq!(k.candidate[0].0, "relu_kernel(float const*, float*, int)");
        assert_eq!(k.candidate[1].0, "Memcpy DtoD");
        // A name read before (demangled) is kept as it is.
        assert_eq!(k.reference[0].0, k.candidate[0].0);
        assert_eq!(k.reference[1].0, "tanh(float*)");
        let own = BTreeSet::from(["relu_kernel".to_string()]);
        assert_eq!(stands_in(&k, &own), None);
    }

    #[test]
    fn own_kernels_that_never_ran_are_flagged() {
        let own = BTreeSet::from(["relu_kernel".to_string()]);
        let why = stands_in(&ran(&[(RELU, 10)], &[(RELU, 10)]), &own).expect("flagged");
        assert!(
            why.starts_with("none of the candidate's own kernels ran"),
            "{why}"
        );
        // Unknown own kernels (empty set): only the reference comparison decides.
        let r = ran(
            &[("relu_kernel(float const*, float*, long)", 10)],
            &[(RELU, 10)],
        );
        assert_eq!(stands_in(&r, &BTreeSet::new()), None);
    }

    #[test]
    fn a_library_matmul_before_a_custom_epilogue_is_not_flagged() {
        let own = BTreeSet::from(["fused_bias_relu".to_string()]);
        let r = ran(
            &[
                (GEMM, 900_000),
                (FILL, 3_000),
                (
                    "void fused_bias_relu<float>(float*, float const*, int)",
                    40_000,
                ),
                ("Memcpy DtoD (Device -> Device)", 20_000),
            ],
            &[(GEMM, 900_000), (RELU, 60_000)],
        );
        assert_eq!(stands_in(&r, &own), None);
        // An honest kernel with an output filled by torch.zeros: fill is plumbing.
        let r = ran(
            &[
                (FILL, 3_000),
                ("relu_kernel(float const*, float*, long)", 9),
            ],
            &[(FILL, 3_000), (RELU, 10)],
        );
        assert_eq!(stands_in(&r, &BTreeSet::from(["relu_kernel".into()])), None);
    }
}
