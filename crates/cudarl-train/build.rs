//! This crate links libtorch: the link arguments of `cudarl-torch`'s build script (`-ltorch_cuda`
//! kept, rpath to the venv's libtorch), forwarded to its binaries and tests; and the CUDA-graph
//! shim `csrc/cuda_graph.cpp`, compiled with the `cc` crate against the headers of the same
//! libtorch (its `include/` beside `lib/`) and the CUDA runtime headers (the `nvidia-cuda-runtime`
//! wheel beside the torch wheel, or `$CUDA_HOME`). Where libtorch has no CUDA library or no CUDA
//! headers are found, the shim is built without graphs (`CUDARL_NO_CUDA_GRAPHS`) and the crate
//! decodes without them.
//!
//! With the CUDA shim, the fused AdamW kernel `csrc/adamw.cu` is compiled with nvcc into a
//! fatbin (SASS for sm_80 and sm_90, PTX for later GPUs) that the crate embeds
//! (`cfg(cudarl_fused_adamw)`); without nvcc the crate steps bf16 parameters with libtorch ops.
use std::path::{Path, PathBuf};

fn cuda_include(torch_lib: &Path) -> Option<PathBuf> {
    let site = torch_lib.parent()?.parent()?;
    let mut dirs = vec![
        site.join("nvidia/cu13/include"),
        site.join("nvidia/cuda_runtime/include"),
    ];
    if let Ok(h) = std::env::var("CUDA_HOME") {
        dirs.push(PathBuf::from(h).join("include"));
    }
    dirs.push(PathBuf::from("/usr/local/cuda/include"));
    dirs.into_iter()
        .find(|d| d.join("cuda_runtime_api.h").exists())
}

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_CUDARL_TORCH_LINK_ARGS");
    println!("cargo:rerun-if-env-changed=DEP_CUDARL_TORCH_LIBTORCH_LIB");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    println!("cargo:rerun-if-changed=csrc/cuda_graph.cpp");
    println!("cargo::rustc-check-cfg=cfg(cudarl_fused_adamw)");
    if let Ok(args) = std::env::var("DEP_CUDARL_TORCH_LINK_ARGS") {
        for a in args.split(' ').filter(|a| !a.is_empty()) {
            println!("cargo:rustc-link-arg={a}");
        }
    }
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .file("csrc/cuda_graph.cpp")
        .flag_if_supported("-std=c++17")
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .warnings(false);
    let lib = std::env::var("DEP_CUDARL_TORCH_LIBTORCH_LIB").map(PathBuf::from);
    let cuda = lib.as_ref().ok().and_then(|l| {
        let inc = l.parent()?.join("include");
        let ok = l.join("libtorch_cuda.so").exists() && inc.join("ATen/cuda/CUDAGraph.h").exists();
        ok.then(|| (l.clone(), inc, cuda_include(l)))
    });
    match cuda {
        Some((lib, inc, Some(cuda_inc))) => {
            build
                .include(&inc)
                .include(inc.join("torch/csrc/api/include"))
                .include(&cuda_inc);
            build.compile("cudarl_cuda_graph");
            println!("cargo:rustc-link-search=native={}", lib.display());
            for l in ["torch_cuda", "c10_cuda", "torch_cpu", "c10"] {
                println!("cargo:rustc-link-lib=dylib={l}");
            }
            // The harness's search for nvcc (`$CUDARL_NVCC`, `$CUDA_HOME`, `PATH`, the nvcc
            // wheel of the repository's `.venv` or of `$VIRTUAL_ENV`).
            if cudarl_cuda::Nvcc::build_script_fatbin(
                Path::new(env!("CARGO_MANIFEST_DIR")),
                "csrc/adamw.cu",
                "bf16 AdamW steps run as libtorch ops",
            ) {
                println!("cargo:rustc-cfg=cudarl_fused_adamw");
            }
        }
        _ => {
            build.define("CUDARL_NO_CUDA_GRAPHS", None);
            match lib
                .as_ref()
                .ok()
                .and_then(|l| l.parent())
                .map(|p| p.join("include"))
            {
                Some(inc) if inc.join("ATen/core/Tensor.h").exists() => {
                    build
                        .include(&inc)
                        .include(inc.join("torch/csrc/api/include"));
                }
                _ => {
                    build.define("CUDARL_NO_TORCH_HEADERS", None);
                }
            }
            build.compile("cudarl_cuda_graph");
        }
    }
}
