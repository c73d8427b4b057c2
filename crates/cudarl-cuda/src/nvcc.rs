//! Finding nvcc and its version.
//!
//! Search order: `$CUDARL_NVCC`, `$CUDA_HOME/bin/nvcc`, `nvcc` on `PATH`, then the
//! `nvidia-cuda-nvcc` wheel (`lib/python3*/site-packages/nvidia/cu13/bin/nvcc`) of the project's
//! `.venv`, then of `$VIRTUAL_ENV` (a copy of the project without a `.venv` of its own, run after
//! the original's `scripts/env.sh`). When none runs, the error names every place looked at.
//! The wheel's `nvcc.profile` misses its own `lib` directory, so [`Nvcc::lib_dirs`] adds it
//! to every link.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A usable nvcc.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nvcc {
    /// Path of the `nvcc` executable.
    pub path: PathBuf,
    /// Version and build, e.g. `13.0.88` (from `nvcc --version`, `V13.0.88`).
    pub version: String,
    /// Extra `-L` directories for linking (the wheel's `lib`).
    pub lib_dirs: Vec<PathBuf>,
}

/// nvcc was not found or does not run.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "nvcc not found ({0}); set CUDARL_NVCC, CUDA_HOME, put nvcc on PATH, or run `make setup` (installs the nvidia-cuda-nvcc wheel into .venv)"
)]
pub struct NvccNotFound(pub String);

fn version_of(path: &Path) -> Option<String> {
    let out = Command::new(path).arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    // "Cuda compilation tools, release 13.0, V13.0.88"
    text.lines()
        .find_map(|l| l.rsplit_once(", V").map(|(_, v)| v.trim().to_string()))
}

/// The nvcc of the `nvidia-cuda-nvcc` wheel in virtual environment `venv`, if there is one.
fn venv_nvcc(venv: &Path) -> Option<PathBuf> {
    let rd = std::fs::read_dir(venv.join("lib")).ok()?;
    let mut pys: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("python3"))
        })
        .collect();
    pys.sort();
    pys.into_iter()
        .map(|p| p.join("site-packages/nvidia/cu13/bin/nvcc"))
        .find(|p| p.is_file())
}

impl Nvcc {
    /// For the build script of a crate that embeds a kernel of its own, run in the package's
    /// directory `manifest_dir` (two levels below the repository root): compiles `src` (a path
    /// in the package) with the nvcc [`Nvcc::discover`] finds into `$OUT_DIR/<name>.fatbin`,
    /// `name` being `src`'s file stem, and prints Cargo's rerun lines for the source and for the
    /// environment the search reads. Where no nvcc is found or it fails, prints a Cargo warning
    /// ending in `without` (what the crate does instead). Whether the fatbin was built.
    pub fn build_script_fatbin(manifest_dir: &Path, src: &str, without: &str) -> bool {
        println!("cargo:rerun-if-changed={src}");
        for v in ["CUDARL_NVCC", "CUDA_HOME", "VIRTUAL_ENV"] {
            println!("cargo:rerun-if-env-changed={v}");
        }
        let stem = Path::new(src)
            .file_stem()
            .map_or_else(|| "kernel".into(), |s| s.to_string_lossy().into_owned());
        let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default())
            .join(format!("{stem}.fatbin"));
        let built = Nvcc::discover(&manifest_dir.join("../.."))
            .map_err(|e| e.to_string())
            .and_then(|n| n.embedded_fatbin(Path::new(src), &out));
        if let Err(e) = &built {
            println!("cargo:warning={e}: {without}");
        }
        built.is_ok()
    }

    /// Compiles `src` into a fatbin at `out` for a crate that embeds a kernel of its own:
    /// `-O3 -std=c++17`, SASS for sm_80 and sm_90 and PTX for later GPUs.
    ///
    /// # Errors
    /// nvcc could not start or failed (its status in the message; its diagnostics went to the
    /// build script's stderr).
    pub fn embedded_fatbin(&self, src: &Path, out: &Path) -> Result<(), String> {
        let status = Command::new(&self.path)
            .args(["-fatbin", "-O3", "-std=c++17"])
            .args([
                "-gencode=arch=compute_80,code=sm_80",
                "-gencode=arch=compute_90,code=sm_90",
                "-gencode=arch=compute_90,code=compute_90",
            ])
            .arg(src)
            .arg("-o")
            .arg(out)
            .status();
        match status {
            Ok(s) if s.success() => Ok(()),
            other => Err(format!(
                "{} failed on {} ({other:?})",
                self.path.display(),
                src.display()
            )),
        }
    }

    /// The toolkit's root: the directory above nvcc's `bin`, as found and, if that is a link,
    /// also resolved (the sandbox grants both).
    pub fn toolkit_roots(&self) -> Vec<PathBuf> {
        let Some(root) = self.path.parent().and_then(Path::parent) else {
            return vec![];
        };
        let mut v = vec![root.to_path_buf()];
        if let Ok(c) = std::fs::canonicalize(root)
            && c != root
        {
            v.push(c);
        }
        v
    }

    /// The shared CUDA runtime of this toolkit (`libcudart.so.<major>`, else `libcudart.so`) in
    /// its `lib`, `lib64` or `targets/x86_64-linux/lib` directory: what candidates link and the
    /// runner preloads.
    pub fn cudart(&self) -> Option<PathBuf> {
        let major = self.version.split('.').next().unwrap_or("");
        let mut dirs = self.lib_dirs.clone();
        for r in self.toolkit_roots() {
            dirs.extend(["lib", "lib64", "targets/x86_64-linux/lib"].map(|d| r.join(d)));
        }
        for d in &dirs {
            for name in [format!("libcudart.so.{major}"), "libcudart.so".into()] {
                let p = d.join(&name);
                if p.is_file() {
                    return Some(p);
                }
            }
        }
        None
    }

    /// [`Nvcc::discover`] under the tests' policy: `None` when nvcc is missing, after printing
    /// `SKIPPED: ...` so the skip is visible, unless `CUDARL_REQUIRE_NVCC` is set (`make test`
    /// sets it), when a missing nvcc panics naming what was tried.
    pub fn discover_or_skip(root: &Path) -> Option<Nvcc> {
        match Nvcc::discover(root) {
            Ok(n) => Some(n),
            Err(e) => {
                assert!(
                    std::env::var_os("CUDARL_REQUIRE_NVCC").is_none(),
                    "CUDARL_REQUIRE_NVCC is set: {e}"
                );
                eprintln!("SKIPPED: {e}");
                None
            }
        }
    }

    /// Finds nvcc (see the module docs), looking for a `.venv` under `root`.
    ///
    /// # Errors
    /// [`NvccNotFound`] listing what was tried.
    pub fn discover(root: &Path) -> Result<Nvcc, NvccNotFound> {
        // (where it came from, the path) of every candidate, and what was found where none is.
        let mut candidates: Vec<(String, PathBuf)> = Vec::new();
        let mut absent: Vec<String> = Vec::new();
        match std::env::var("CUDARL_NVCC") {
            Ok(p) => candidates.push(("$CUDARL_NVCC".into(), PathBuf::from(p))),
            Err(_) => absent.push("$CUDARL_NVCC unset".into()),
        }
        match std::env::var("CUDA_HOME") {
            Ok(h) => candidates.push(("$CUDA_HOME".into(), Path::new(&h).join("bin/nvcc"))),
            Err(_) => absent.push("$CUDA_HOME unset".into()),
        }
        let path: Vec<PathBuf> = on_path("nvcc")
            .into_iter()
            .filter(|p| p.is_file())
            .collect();
        if path.is_empty() {
            absent.push("no nvcc on PATH".into());
        }
        candidates.extend(path.into_iter().map(|p| ("PATH".to_string(), p)));
        let mut venvs = vec![root.join(".venv")];
        if let Some(v) = std::env::var_os("VIRTUAL_ENV") {
            venvs.push(PathBuf::from(v));
        }
        for v in venvs {
            match venv_nvcc(&v) {
                Some(n) => candidates.push((format!("the wheel in {}", v.display()), n)),
                None => absent.push(format!("no nvidia-cuda-nvcc wheel in {}", v.display())),
            }
        }
        let mut tried = Vec::new();
        for (from, c) in candidates {
            if !c.is_file() {
                absent.push(format!("{from}: no file {}", c.display()));
                continue;
            }
            // Absolute: compiles run nvcc from a temporary directory (`--root .` gave a
            // relative venv path that no longer resolved there).
            let c = std::path::absolute(&c).unwrap_or(c);
            if let Some(version) = version_of(&c) {
                let mut lib_dirs = Vec::new();
                if let Some(lib) = c.parent().and_then(|b| b.parent()).map(|d| d.join("lib"))
                    && lib.is_dir()
                {
                    lib_dirs.push(lib);
                }
                return Ok(Nvcc {
                    path: c,
                    version,
                    lib_dirs,
                });
            }
            tried.push(format!("{from}: {} does not run", c.display()));
        }
        tried.extend(absent);
        Err(NvccNotFound(tried.join("; ")))
    }
}

/// `name` in every directory of `$PATH`, in order (files or not: callers check).
pub fn on_path(name: &str) -> Vec<PathBuf> {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join(name)).collect())
        .unwrap_or_default()
}
