//! Link arguments for the worker binary and this crate's tests (and `DEP_CUDARL_TORCH_LIBTORCH_LIB`
//! and `DEP_CUDARL_TORCH_LINK_ARGS` for dependents).
//!
//! - `-Wl,--no-as-needed,-ltorch_cuda,--as-needed`: nothing here references a `libtorch_cuda`
//!   symbol directly (its CUDA kernels register themselves from static constructors), so with
//!   `--as-needed` the linker drops it and tch silently runs CPU-only.
//! - `-rpath` to libtorch's lib dir (the `.venv` torch wheel, from torch-sys's
//!   `DEP_TCH_LIBTORCH_LIB`), so the worker runs without `LD_LIBRARY_PATH` on the machine it
//!   was built on. On another machine, set `LD_LIBRARY_PATH` to that machine's torch `lib/`.
//!
//! And the judge's one-pass comparison kernel `csrc/compare.cu`, compiled with nvcc (found as
//! the harness finds it) into a fatbin the crate embeds (SASS for sm_80 and sm_90, PTX for later
//! GPUs; `cfg(cudarl_fused_compare)`); without nvcc the judge compares with libtorch ops.
fn main() {
    println!("cargo::rustc-check-cfg=cfg(cudarl_fused_compare)");
    if cudarl_cuda::Nvcc::build_script_fatbin(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")),
        "csrc/compare.cu",
        "the judge compares outputs with libtorch ops",
    ) {
        println!("cargo:rustc-cfg=cudarl_fused_compare");
    }
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    if let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:libtorch_lib={lib}");
        let mut args = vec![format!("-Wl,-rpath,{lib}")];
        if std::path::Path::new(&lib).join("libtorch_cuda.so").exists() {
            args.push("-Wl,--no-as-needed,-ltorch_cuda,--as-needed".into());
        }
        for a in &args {
            println!("cargo:rustc-link-arg={a}");
        }
        // For crates whose own binaries and tests link libtorch (DEP_CUDARL_TORCH_LINK_ARGS).
        println!("cargo:link_args={}", args.join(" "));
    }
}
