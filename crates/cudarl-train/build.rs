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
use std::process::Command;

/// nvcc: `$NVCC`, `$CUDARL_NVCC`, `$CUDA_HOME/bin/nvcc`, the `nvidia-cuda-nvcc` wheel beside the
/// torch wheel (`site-packages/nvidia/cu13/bin`), then `nvcc` on `PATH`.
fn nvcc(torch_lib: &Path) -> Option<PathBuf> {
    let mut c: Vec<PathBuf> = ["NVCC", "CUDARL_NVCC"]
        .iter()
        .filter_map(|v| std::env::var(v).ok().map(PathBuf::from))
        .collect();
    if let Ok(h) = std::env::var("CUDA_HOME") {
        c.push(PathBuf::from(h).join("bin/nvcc"));
    }
    if let Some(site) = torch_lib.parent().and_then(Path::parent) {
        c.push(site.join("nvidia/cu13/bin/nvcc"));
    }
    if let Some(path) = std::env::var_os("PATH") {
        c.extend(std::env::split_paths(&path).map(|d| d.join("nvcc")));
    }
    c.into_iter().find(|p| p.is_file())
}

/// Compiles `csrc/adamw.cu` into `$OUT_DIR/adamw.fatbin`; whether it did.
fn fused_adamw(torch_lib: &Path) -> bool {
    let Some(nvcc) = nvcc(torch_lib) else {
        println!("cargo:warning=no nvcc: bf16 AdamW steps run as libtorch ops, not fused");
        return false;
    };
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("adamw.fatbin");
    let status = Command::new(&nvcc)
        .args(["-fatbin", "-O3", "-std=c++17"])
        .args([
            "-gencode=arch=compute_80,code=sm_80",
            "-gencode=arch=compute_90,code=sm_90",
            "-gencode=arch=compute_90,code=compute_90",
        ])
        .arg("csrc/adamw.cu")
        .arg("-o")
        .arg(&out)
        .status();
    match status {
        Ok(s) if s.success() => true,
        other => {
            println!(
                "cargo:warning={} failed on csrc/adamw.cu ({other:?}): bf16 AdamW steps run as libtorch ops",
                nvcc.display()
            );
            false
        }
    }
}

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
    println!("cargo:rerun-if-changed=csrc/adamw.cu");
    println!("cargo:rerun-if-env-changed=NVCC");
    println!("cargo:rerun-if-env-changed=CUDARL_NVCC");
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
            if fused_adamw(&lib) {
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
