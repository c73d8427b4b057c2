//! The runner's sandbox with real processes, real nvcc builds and real files, on a machine
//! without a GPU: what a candidate's constructor (the first code of it that runs, at `dlopen`)
//! can and cannot do. The shared objects here are built with nvcc directly, skipping the
//! harness's own checks (which would reject them before any runner saw them).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use cudarl_cuda::Nvcc;
use cudarl_cuda::runner::{Answer, Load, Reply, Request, RunnerProcess};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn nvcc() -> Option<Nvcc> {
    Nvcc::discover_or_skip(&repo_root())
}

/// Builds `src` (plus a vector_add entry point) into `dir/name.so` against the shared runtime.
fn build(n: &Nvcc, dir: &Path, name: &str, src: &str) -> PathBuf {
    let cu = dir.join(format!("{name}.cu"));
    let full = format!(
        "{src}\n#include <cuda_runtime.h>\n#include <stdint.h>\n__global__ void add_k(const float* a, const float* b, float* o, int64_t n) {{ int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; if (i < n) o[i] = a[i] + b[i]; }}\n\
         extern \"C\" int cudarl_entry(void* const* b, const int64_t* s, const float* sc, cudaStream_t st) {{ add_k<<<(unsigned)((s[0] + 255) / 256), 256, 0, st>>>((const float*)b[0], (const float*)b[1], (float*)b[2], s[0]); return (int)cudaGetLastError(); }}\n"
    );
    std::fs::write(&cu, full).unwrap();
    let so = dir.join(format!("{name}.so"));
    let cudart = n.cudart().expect("shared CUDA runtime beside nvcc");
    let o = Command::new(&n.path)
        .args([
            "-gencode=arch=compute_90,code=sm_90",
            "-shared",
            "-Xcompiler",
            "-fPIC",
            "-cudart",
            "none",
            "-o",
        ])
        .arg(&so)
        .arg(&cu)
        .arg("-Xlinker")
        .arg(&cudart)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    so
}

/// Starts a runner without a GPU, loads `so` in it and returns its answer to the load and
/// what the candidate printed.
fn load(n: &Nvcc, so: &Path) -> (Answer, String) {
    let cudart = n.cudart().unwrap();
    let mut r = RunnerProcess::spawn(false, Some(&cudart), &[]).unwrap();
    match r.recv(Duration::from_secs(30)) {
        Answer::Reply(Reply::Ready {
            gpu: false,
            confined,
        }) => {
            assert!(confined, "Landlock must confine the runner on this kernel")
        }
        a => panic!("runner not ready: {a:?}"),
    }
    let staged = r.dir.path().join("kernel.so");
    std::fs::copy(so, &staged).unwrap();
    let a = r.call(
        &Request::Load(Load {
            so: staged,
            arena: None,
        }),
        Duration::from_secs(30),
    );
    std::thread::sleep(Duration::from_millis(50));
    (a, r.output())
}

#[test]
fn a_constructor_calling_system_through_a_pointer_is_killed_and_never_runs_its_payload() {
    let Some(n) = nvcc() else { return };
    let d = tempfile::tempdir().unwrap();
    let marker = d.path().join("pwned");
    let src = format!(
        "#include <stdlib.h>\ntypedef int (*fn_t)(const char*);\n\
         __attribute__((constructor)) static void payload() {{ volatile fn_t f = (fn_t)&system; f(\"touch {}\"); }}\n",
        marker.display()
    );
    let so = build(&n, d.path(), "evil_ctor", &src);
    let (a, _) = load(&n, &so);
    match a {
        Answer::Died(m) => assert!(m.contains("sandbox violation"), "{m}"),
        a => panic!("the runner survived a constructor that spawns a process: {a:?}"),
    }
    std::thread::sleep(Duration::from_millis(200));
    assert!(!marker.exists(), "the payload ran on the host");
}

#[test]
fn a_constructor_reads_nothing_outside_the_staging_directory_and_writes_nothing() {
    let Some(n) = nvcc() else { return };
    let d = tempfile::tempdir().unwrap();
    let secret = d.path().join("hidden-salt");
    std::fs::write(&secret, "s3cret").unwrap();
    let src = format!(
        "#include <stdio.h>\n\
         __attribute__((constructor)) static void probe() {{\n\
           FILE* f = fopen(\"{}\", \"r\"); printf(\"secret:%s\\n\", f ? \"read\" : \"denied\");\n\
           FILE* g = fopen(\"/etc/hostname\", \"r\"); printf(\"etc:%s\\n\", g ? \"read\" : \"denied\");\n\
           FILE* h = fopen(\"/tmp/cudarl-runner-written\", \"w\"); printf(\"write:%s\\n\", h ? \"written\" : \"denied\");\n\
           fflush(stdout);\n\
         }}\n",
        secret.display()
    );
    let so = build(&n, d.path(), "probe", &src);
    let (a, out) = load(&n, &so);
    assert_eq!(a, Answer::Reply(Reply::Loaded { events: false }), "{out}");
    assert!(out.contains("secret:denied"), "{out}");
    assert!(out.contains("etc:denied"), "{out}");
    assert!(out.contains("write:denied"), "{out}");
    assert!(!Path::new("/tmp/cudarl-runner-written").exists());
}

#[test]
fn an_honest_library_loads_and_a_raw_syscall_is_reported_by_name() {
    let Some(n) = nvcc() else { return };
    let d = tempfile::tempdir().unwrap();
    let so = build(&n, d.path(), "honest", "");
    let (a, out) = load(&n, &so);
    assert_eq!(a, Answer::Reply(Reply::Loaded { events: false }), "{out}");
    // socket(2) through a raw `syscall` instruction, bypassing libc: trapped and named.
    let src = "__attribute__((constructor)) static void raw() { long r; asm volatile(\"syscall\" : \"=a\"(r) : \"a\"(41L), \"D\"(2L), \"S\"(1L), \"d\"(0L) : \"rcx\", \"r11\", \"memory\"); }\n";
    let so = build(&n, d.path(), "raw", src);
    let (a, _) = load(&n, &so);
    match a {
        Answer::Died(m) => assert!(m.contains("`socket`"), "{m}"),
        a => panic!("a raw socket syscall was not stopped: {a:?}"),
    }
}

#[test]
fn exec_mode_confines_the_program_it_runs() {
    let runner = env!("CARGO_BIN_EXE_cudarl-pipe-runner");
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("secret"), "s3cret").unwrap();
    // An interpreter may not start processes: the shell's fork is trapped (SIGSYS).
    let o = Command::new(runner)
        .args([
            "exec",
            "--profile",
            "interpreter",
            "--exec",
            "/bin",
            "--exec",
            "/usr/bin",
            "--",
        ])
        .args(["/bin/sh", "-c", "/bin/true; echo survived"])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("survived"),
        "{o:?}"
    );
    // A compiler may start processes but read only what it was given.
    let o = Command::new(runner)
        .args([
            "exec",
            "--profile",
            "compiler",
            "--exec",
            "/bin",
            "--exec",
            "/usr/bin",
            "--",
        ])
        .arg("/bin/sh")
        .arg("-c")
        .arg(format!(
            "cat {} || echo denied",
            d.path().join("secret").display()
        ))
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("denied") && !out.contains("s3cret"), "{out}");
    // Nothing outside the exec list runs.
    let o = Command::new(runner)
        .args(["exec", "--profile", "compiler", "--", "/bin/true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(127), "{o:?}");
}

/// `exec --defer-filter`: the program runs unfiltered until it installs the handed filters
/// (`handed_filters` and `install_handed_filters` in the worker script, as the torch runner does
/// once CUDA is up),
/// and from then on a socket is trapped (SIGSYS) on every thread, including threads started
/// before the installation.
#[test]
fn handed_filters_hold_once_the_program_installs_them() {
    let py = cudarl_cuda::pyworker::python(&repo_root());
    let has_torch = Command::new(&py)
        .args(["-c", "import torch"])
        .status()
        .is_ok_and(|s| s.success());
    if !has_torch {
        assert!(
            std::env::var("CUDARL_REQUIRE_PYTHON").is_err(),
            "CUDARL_REQUIRE_PYTHON is set: no Python with torch at {}",
            py.display()
        );
        eprintln!("SKIPPED: no Python with torch at {}", py.display());
        return;
    }
    let script = format!(
        r#"
import os, socket, sys, threading
sys.path.insert(0, {dir:?})
import cudarl_worker as w
socket.socket(socket.AF_UNIX).close()
print("socket before", flush=True)
go = threading.Event()
def late():
    go.wait()
    socket.socket(socket.AF_UNIX)
    print("socket on an older thread survived", flush=True)
t = threading.Thread(target=late)
t.start()
print("filters", w.install_handed_filters(w.handed_filters()), "fd left", "CUDARL_SECCOMP_FD" in os.environ, flush=True)
go.set()
t.join()
print("survived", flush=True)
"#,
        dir = repo_root().join("python").display().to_string()
    );
    let runner = env!("CARGO_BIN_EXE_cudarl-pipe-runner");
    let scratch = tempfile::tempdir().unwrap();
    let o = Command::new(runner)
        .args([
            "exec",
            "--profile",
            "interpreter",
            "--defer-filter",
            "--read",
            "/",
            "--exec",
            "/",
            "--device",
            "/dev/null",
            "--write",
        ])
        .arg(scratch.path())
        .arg("--")
        .env("TMPDIR", scratch.path())
        .arg(&py)
        .args(["-c", &script])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("socket before") && out.contains("filters 3 fd left False"),
        "{out} {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!out.contains("survived"), "{out}");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(o.status.signal(), Some(libc::SIGSYS), "{o:?}");
}
