//! `cudarl-pipe-runner`: where candidate code runs, and nothing else.
//!
//! - `cudarl-pipe-runner native --dir D [--gpu] [--cudart LIB] [--read P]...`: the native
//!   kernel runner the judge starts (protocol: `cudarl_cuda::runner`). Confined by Landlock to
//!   reading system libraries, the CUDA libraries, `/proc`, `/sys`, the GPU's device files and its
//!   staging directory `D`, before CUDA starts any thread; CUDA initialized on device 0's primary
//!   context with eager module loading and the shared CUDA runtime preloaded; then, per
//!   candidate, the arena and events opened, the seccomp allow-list installed on every thread,
//!   and only then the candidate `dlopen`ed (its constructors run sandboxed).
//! - `cudarl-pipe-runner exec --profile compiler|interpreter [--gpu] [--defer-filter]
//!   [--read P]... [--exec P]... [--write P]... [--device P]... -- PROGRAM ARGS...`: confines
//!   itself (Landlock, the profile's seccomp deny-list, rlimits, death with its parent) and
//!   `exec`s `PROGRAM`; used for nvcc, for Python reading a candidate file, and (`--gpu`: the
//!   GPU's device files and what the driver reads and writes; `--defer-filter`: the deny-list
//!   installed by the program once CUDA is up) for the runner of torch-format candidates.
//!
//! Not meant to be run by hand. Exit codes: 0 done, 2 bad usage, 86 a denied system call,
//! 125 sandbox set-up failed, 127 `exec` failed.

use std::ffi::CString;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::FromRawFd;
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};
use cudarl_cuda::runner::{Reply, Request, from_hex};
use cudarl_sandbox::{ConfineOptions, FilterOptions, FsPolicy, Limits, Profile, Scopes};

#[derive(Parser)]
#[command(
    name = "cudarl-pipe-runner",
    about = "cudarl-pipe's sandboxed runner (internal)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// The native kernel runner (control socket on fd 3).
    Native {
        /// The staging directory the candidate is loaded from (readable, nothing else is).
        #[arg(long)]
        dir: PathBuf,
        /// Initialize CUDA on device 0.
        #[arg(long)]
        gpu: bool,
        /// The shared CUDA runtime (libcudart.so.N) to preload.
        #[arg(long)]
        cudart: Option<PathBuf>,
        /// More read-only paths.
        #[arg(long)]
        read: Vec<PathBuf>,
        /// Writable paths (before the seccomp filter: the driver's initialization only).
        #[arg(long)]
        write: Vec<PathBuf>,
        /// Started under Nsight Compute for a profile pass: the runner's own empty kernel runs
        /// once before the filter (the injected collector connects to `ncu`), and send/receive
        /// on the sockets open then are allowed (`FilterOptions::profiler_fds`).
        #[arg(long)]
        profiled: bool,
    },
    /// Confine this process, then exec PROGRAM.
    Exec {
        /// `compiler` (processes allowed) or `interpreter` (none).
        #[arg(long)]
        profile: String,
        /// The GPU: its device files (read, write, ioctl), what the driver reads
        /// ([`gpu_reads`]) and writes ([`gpu_writes`]).
        #[arg(long)]
        gpu: bool,
        /// Read-only paths.
        #[arg(long)]
        read: Vec<PathBuf>,
        /// Readable and executable paths.
        #[arg(long)]
        exec: Vec<PathBuf>,
        /// Writable paths.
        #[arg(long)]
        write: Vec<PathBuf>,
        /// Device files (read, write, ioctl).
        #[arg(long)]
        device: Vec<PathBuf>,
        /// Hand the system-call filters to the program instead of installing them: the read end
        /// of a pipe holding them ([`cudarl_sandbox::syscalls::to_bytes`]) stays open in the
        /// program, its number in `CUDARL_SECCOMP_FD`, and the processes the program forks
        /// install them on all their threads before they run anything untrusted (the filters
        /// then leave the pid-bound signal rules to them:
        /// `cudarl_sandbox::FilterOptions::installed_in_forks`). For the project's torch
        /// runner, which initializes CUDA first: `cuInit` opens a Unix socket, a call the
        /// filters trap (as the native runner, which installs its filter once CUDA is up).
        /// Limits and Landlock hold from the start either way.
        #[arg(long)]
        defer_filter: bool,
        /// Largest file the program may write, MiB.
        #[arg(long, default_value_t = 256)]
        file_size_mib: u64,
        /// CPU seconds each process may use (RLIMIT_CPU, inherited by its children, each
        /// counting its own).
        #[arg(long, default_value_t = 3600)]
        cpu_seconds: u64,
        /// The program and its arguments.
        #[arg(last = true, required = true)]
        program: Vec<String>,
    },
}

/// What a process using the GPU reads besides the system libraries
/// ([`FsPolicy::system_libraries`]): the driver's and the toolkit's usual homes, the loader's
/// search path, `/proc` and `/sys` (the driver reads both).
fn gpu_reads() -> Vec<PathBuf> {
    let mut read: Vec<PathBuf> = [
        "/usr/local/nvidia",
        "/usr/local/cuda",
        "/proc",
        "/sys",
        "/etc/ld.so.conf",
        "/etc/ld.so.conf.d",
    ]
    .into_iter()
    .map(PathBuf::from)
    .collect();
    if let Some(p) = std::env::var_os("LD_LIBRARY_PATH") {
        // Absolute directories only: an empty or relative entry would be the working
        // directory, which may be the project (and its store).
        read.extend(std::env::split_paths(&p).filter(|d| d.is_absolute()));
    }
    read
}

/// What a process using the GPU writes: its own task directory (`/proc/self/task`, resolved
/// when the policy is applied, so this process's and, across `exec`, its program's). The driver
/// names its threads (`/proc/self/task/<tid>/comm`, opened for writing); cuInit fails with
/// CUDA_ERROR_OPERATING_SYSTEM when it cannot.
fn gpu_writes() -> Vec<PathBuf> {
    vec![PathBuf::from("/proc/self/task")]
}

/// The Landlock scopes of a sandboxed process: signals always; abstract Unix sockets unless it
/// starts CUDA (`gpu`), whose initialization (the driver, an MPS client, a profiler's collector)
/// connects to sockets before the seccomp filter is in, which then denies sockets anyway.
fn scopes(gpu: bool) -> Scopes {
    Scopes {
        signals: true,
        abstract_unix_sockets: !gpu,
    }
}

fn env_flag(k: &str) -> bool {
    std::env::var(k).is_ok_and(|v| v == "1")
}

fn fail(code: i32, msg: &str) -> ! {
    eprintln!("cudarl-pipe-runner: {msg}");
    std::process::exit(code)
}

fn main() {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Exec {
            profile,
            gpu,
            read,
            exec,
            write,
            device,
            file_size_mib,
            cpu_seconds,
            defer_filter,
            program,
        } => {
            let (mut read, mut write, mut devices) = (read, write, device);
            if gpu {
                read.extend(gpu_reads());
                write.extend(gpu_writes());
                devices.extend(FsPolicy::gpu_devices());
            }
            read.extend(FsPolicy::system_libraries());
            let mut exec = exec;
            exec.extend(FsPolicy::dynamic_loader());
            let policy = FsPolicy {
                read,
                exec,
                write,
                devices,
                scopes: scopes(gpu),
            };
            exec_confined(
                &profile,
                policy,
                (file_size_mib, cpu_seconds),
                defer_filter,
                &program,
            )
        }
        Cmd::Native {
            dir,
            gpu,
            cudart,
            read,
            write,
            profiled,
        } => native::run(dir, gpu, cudart, read, write, profiled),
    }
}

fn exec_confined(
    profile: &str,
    policy: FsPolicy,
    (file_size_mib, cpu_seconds): (u64, u64),
    defer_filter: bool,
    program: &[String],
) -> ! {
    let profile = match profile {
        "compiler" => Profile::Compiler,
        "interpreter" => Profile::Interpreter,
        p => fail(2, &format!("unknown profile `{p}` (compiler, interpreter)")),
    };
    let limits = Limits {
        file_size_bytes: file_size_mib << 20,
        cpu_seconds,
        ..Limits::default()
    };
    let confined = cudarl_sandbox::confine(
        profile,
        &policy,
        &limits,
        ConfineOptions {
            allow_unenforced: env_flag("CUDARL_ALLOW_UNCONFINED"),
            log_only: env_flag("CUDARL_SANDBOX_LOG"),
            hand_over: defer_filter,
        },
    )
    .unwrap_or_else(|e| fail(125, &e.to_string()));
    if defer_filter {
        hand_over(&confined.handed);
    }
    let args: Vec<CString> = program
        .iter()
        .map(|a| CString::new(a.as_str()).unwrap_or_else(|_| fail(2, "NUL in an argument")))
        .collect();
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    // SAFETY: a NUL-terminated argv of valid C strings.
    unsafe { libc::execvp(argv[0], argv.as_ptr()) };
    fail(
        127,
        &format!("exec {}: {}", program[0], std::io::Error::last_os_error()),
    )
}

/// Writes `filters` ([`cudarl_sandbox::syscalls::to_bytes`]) into a pipe whose read end the
/// program inherits, named by `CUDARL_SECCOMP_FD`.
fn hand_over(filters: &[cudarl_sandbox::syscalls::BpfProgram]) {
    let bytes = cudarl_sandbox::syscalls::to_bytes(filters);
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        fail(125, &format!("pipe: {}", std::io::Error::last_os_error()));
    }
    // The filters are a few KiB, far below a pipe's buffer: the write does not block.
    // SAFETY: the write end was just opened and is owned here.
    let mut w = unsafe { std::fs::File::from_raw_fd(fds[1]) };
    if let Err(e) = w.write_all(&bytes) {
        fail(125, &format!("writing the filters: {e}"));
    }
    drop(w);
    // SAFETY: clears close-on-exec on the read end, which stays open for the program.
    if unsafe { libc::fcntl(fds[0], libc::F_SETFD, 0) } != 0 {
        fail(125, &format!("fcntl: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: single-threaded; the environment is read by execvp next.
    unsafe { std::env::set_var("CUDARL_SECCOMP_FD", fds[0].to_string()) };
}

/// Writes one reply line on the control socket.
fn reply(out: &mut impl Write, r: &Reply) {
    let line = serde_json::to_string(r).expect("reply serializes");
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Answers that the candidate could not be loaded and leaves at once, without running the
/// candidate's destructors.
fn load_error(out: &mut impl Write, message: String) -> ! {
    reply(out, &Reply::LoadError { message });
    // SAFETY: `_exit` ends the process without unwinding or running atexit handlers.
    unsafe { libc::_exit(0) }
}

/// Reads one request line; `None` at end of input or on a line that is not a request.
fn request(inp: &mut impl BufRead) -> Option<Request> {
    let mut l = String::new();
    match inp.read_line(&mut l) {
        Ok(0) | Err(_) => None,
        Ok(_) => serde_json::from_str(&l).ok(),
    }
}

mod native {
    use super::*;
    use cudarc::driver::sys;

    /// Why the runner's own set-up failed (never the candidate's doing): a driver call, the CUDA
    /// runtime's first call, the runner's poison kernels, or an IPC handle from the judge that
    /// does not decode. Its message becomes the `InitError` reply, or for the arena's and the
    /// window events' IPC handles the `LoadError` reply.
    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    pub(crate) struct SetupError(pub(crate) String);

    type Entry = unsafe extern "C" fn(
        *const *mut std::ffi::c_void,
        *const i64,
        *const f32,
        sys::CUstream,
    ) -> i32;

    fn cu(r: sys::CUresult, what: &str) -> Result<(), SetupError> {
        if r == sys::CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(SetupError(format!("{what}: {r:?}")))
        }
    }

    /// Read-only paths of every native runner: [`gpu_reads`], the shared CUDA runtime's
    /// directory, `extra` and the staging directory.
    fn base_reads(dir: &Path, cudart: Option<&PathBuf>, extra: Vec<PathBuf>) -> Vec<PathBuf> {
        let mut read = FsPolicy::system_libraries();
        read.extend(gpu_reads());
        if let Some(c) = cudart.and_then(|c| c.parent()) {
            read.push(c.to_path_buf());
        }
        read.extend(extra);
        read.push(dir.to_path_buf());
        read
    }

    /// The arena and the window events (`go`, `done`), opened from the judge's IPC handles;
    /// `None` where the driver could not map the events here (the fallback words).
    struct Gpu {
        arena: sys::CUdeviceptr,
        events: Option<(sys::CUevent, sys::CUevent)>,
    }

    /// The runner's own kernels, as PTX (compiled by the driver at start-up): the empty kernel
    /// ([`cudarl_cuda::runner::NOOP_KERNEL`]), what a window without launches runs, so the
    /// judge's calibration windows make the GPU switch to this context the way a candidate's
    /// launch does; and the shared-memory poison ([`cudarl_cuda::runner::POISON_KERNEL`]:
    /// `pattern` (u32) into the first `words` 32-bit words of its dynamic shared memory, every
    /// thread of the block striding by the block size; volatile stores, so none is elided).
    fn kernels_ptx() -> std::ffi::CString {
        let (noop, poison) = (
            cudarl_cuda::runner::NOOP_KERNEL,
            cudarl_cuda::runner::POISON_KERNEL,
        );
        CString::new(format!(
            ".version 7.0\n.target sm_70\n.address_size 64\n\
             .extern .shared .align 16 .b8 cudarl_smem[];\n\
             .visible .entry {noop}()\n{{\n\tret;\n}}\n\
             .visible .entry {poison}(.param .u32 pattern, .param .u32 words)\n{{\n\
             \t.reg .pred %p<2>;\n\t.reg .b32 %r<8>;\n\
             \tld.param.u32 %r1, [pattern];\n\tld.param.u32 %r2, [words];\n\
             \tmov.u32 %r3, %tid.x;\n\tmov.u32 %r4, %ntid.x;\n\tmov.u32 %r5, cudarl_smem;\n\
             FILL:\n\tsetp.ge.u32 %p1, %r3, %r2;\n\t@%p1 bra END;\n\
             \tshl.b32 %r6, %r3, 2;\n\tadd.s32 %r7, %r5, %r6;\n\
             \tst.volatile.shared.u32 [%r7], %r1;\n\tadd.s32 %r3, %r3, %r4;\n\tbra.uni FILL;\n\
             END:\n\tret;\n}}\n"
        ))
        .expect("no NUL in the PTX")
    }

    /// The runner's kernels in the current context ([`kernels_ptx`]).
    #[derive(Clone, Copy)]
    struct Own {
        noop: sys::CUfunction,
        poison: sys::CUfunction,
        /// The poison's grid (one block per SM) and dynamic shared memory per block, bytes
        /// (the device's opt-in maximum).
        sms: u32,
        smem: u32,
    }

    /// Loads [`kernels_ptx`] in the current context and sizes the poison: one block per SM at
    /// the opt-in maximum of dynamic shared memory.
    fn load_own() -> Result<Own, SetupError> {
        let ptx = kernels_ptx();
        let name = |n: &str| CString::new(n).expect("no NUL in the name");
        let (noop_name, poison_name) = (
            name(cudarl_cuda::runner::NOOP_KERNEL),
            name(cudarl_cuda::runner::POISON_KERNEL),
        );
        // SAFETY: a NUL-terminated PTX image, NUL-terminated names and valid out-pointers.
        unsafe {
            let mut m = std::ptr::null_mut();
            cu(
                sys::cuModuleLoadData(&mut m, ptx.as_ptr().cast()),
                "cuModuleLoadData(own kernels)",
            )?;
            let mut noop = std::ptr::null_mut();
            cu(
                sys::cuModuleGetFunction(&mut noop, m, noop_name.as_ptr()),
                "cuModuleGetFunction(noop)",
            )?;
            let mut poison = std::ptr::null_mut();
            cu(
                sys::cuModuleGetFunction(&mut poison, m, poison_name.as_ptr()),
                "cuModuleGetFunction(poison)",
            )?;
            let (mut sms, mut smem) = (0, 0);
            cu(
                sys::cuDeviceGetAttribute(
                    &mut sms,
                    sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                    0,
                ),
                "cuDeviceGetAttribute(SMs)",
            )?;
            cu(
                sys::cuDeviceGetAttribute(
                    &mut smem,
                    sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                    0,
                ),
                "cuDeviceGetAttribute(shared memory opt-in)",
            )?;
            cu(
                sys::cuFuncSetAttribute(
                    poison,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    smem,
                ),
                "cuFuncSetAttribute(poison)",
            )?;
            Ok(Own {
                noop,
                poison,
                sms: sms.max(1) as u32,
                smem: smem.max(0) as u32,
            })
        }
    }

    /// Launches the empty kernel (one thread) on `stream`.
    fn launch_noop(f: sys::CUfunction, stream: sys::CUstream) -> sys::CUresult {
        // SAFETY: a kernel without parameters, one block of one thread.
        unsafe {
            sys::cuLaunchKernel(
                f,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                stream,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        }
    }

    /// Launches the poison kernel on `stream`: `pattern` into all of every SM's shared memory.
    fn launch_poison(own: &Own, pattern: u32, stream: sys::CUstream) -> sys::CUresult {
        let (mut pattern, mut words) = (pattern, own.smem / 4);
        let mut params = [
            (&raw mut pattern).cast::<std::ffi::c_void>(),
            (&raw mut words).cast::<std::ffi::c_void>(),
        ];
        // SAFETY: the kernel's two u32 parameters, one block of 1024 threads per SM, the dynamic
        // shared memory its attribute allows.
        unsafe {
            sys::cuLaunchKernel(
                own.poison,
                own.sms,
                1,
                1,
                1024,
                1,
                1,
                own.smem,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
    }

    fn init_gpu(cudart: Option<&libloading::Library>) -> Result<(), SetupError> {
        // SAFETY: driver initialization and the primary context of device 0, in order.
        unsafe {
            if !sys::is_culib_present() {
                return Err(SetupError(
                    "libcuda not found: no GPU driver on this machine".into(),
                ));
            }
            cu(sys::cuInit(0), "cuInit")?;
            let mut dev = 0;
            cu(sys::cuDeviceGet(&mut dev, 0), "cuDeviceGet")?;
            let mut ctx = std::ptr::null_mut();
            cu(
                sys::cuDevicePrimaryCtxRetain(&mut ctx, dev),
                "cuDevicePrimaryCtxRetain",
            )?;
            cu(sys::cuCtxSetCurrent(ctx), "cuCtxSetCurrent")?;
            if let Some(rt) = cudart {
                // The runtime binds to the current primary context: cudaFree(NULL).
                let free: libloading::Symbol<unsafe extern "C" fn(*mut std::ffi::c_void) -> i32> =
                    rt.get(b"cudaFree")
                        .map_err(|e| SetupError(format!("cudaFree: {e}")))?;
                let rc = free(std::ptr::null_mut());
                if rc != 0 {
                    return Err(SetupError(format!("cudaFree(0) returned cudaError {rc}")));
                }
            }
        }
        Ok(())
    }

    /// Runs the empty kernel once and waits for it, so a profiler injected at CUDA
    /// initialization has connected to its front end; returns the sockets now open other than
    /// the control socket (fd 3): the profiler's.
    fn connect_profiler(noop: sys::CUfunction) -> Result<Vec<i32>, SetupError> {
        cu(
            launch_noop(noop, std::ptr::null_mut()),
            "cuLaunchKernel(noop)",
        )?;
        // SAFETY: a context-wide synchronize.
        cu(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")?;
        let dir = std::fs::read_dir("/proc/self/fd")
            .map_err(|e| SetupError(format!("/proc/self/fd: {e}")))?;
        let mut fds: Vec<i32> = dir
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let fd: i32 = e.file_name().to_str()?.parse().ok()?;
                let target = std::fs::read_link(e.path()).ok()?;
                (fd != 3 && target.to_string_lossy().starts_with("socket:")).then_some(fd)
            })
            .collect();
        fds.sort_unstable();
        Ok(fds)
    }

    /// A 64-byte IPC handle from its hex form.
    fn handle64(hex: &str, what: &str) -> Result<[u8; 64], SetupError> {
        let v = from_hex(hex).ok_or(SetupError(format!("{what} handle: not hex")))?;
        <[u8; 64]>::try_from(v.as_slice())
            .map_err(|_| SetupError(format!("{what} handle: {} bytes, not 64", v.len())))
    }

    fn open_gpu(load: &cudarl_cuda::runner::Load) -> Result<Option<Gpu>, SetupError> {
        let Some(arena) = &load.arena else {
            return Ok(None);
        };
        let mh = handle64(&arena.handle, "arena")?;
        // Empty handles: the judge could not create the events (the fallback words).
        let handles = if arena.go.is_empty() || arena.done.is_empty() {
            None
        } else {
            Some((handle64(&arena.go, "go")?, handle64(&arena.done, "done")?))
        };
        // SAFETY: IPC handles from the judge, opened in the current (primary) context.
        unsafe {
            let mut ptr = 0;
            let handle = sys::CUipcMemHandle {
                reserved: mh.map(|b| b as std::ffi::c_char),
            };
            cu(
                sys::cuIpcOpenMemHandle_v2(
                    &mut ptr,
                    handle,
                    sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
                ),
                "cuIpcOpenMemHandle",
            )?;
            let event = |h: [u8; 64], what: &str| -> Result<sys::CUevent, SetupError> {
                let mut e = std::ptr::null_mut();
                let h = sys::CUipcEventHandle {
                    reserved: h.map(|b| b as std::ffi::c_char),
                };
                cu(sys::cuIpcOpenEventHandle(&mut e, h), what)?;
                Ok(e)
            };
            let events =
                handles.and_then(|(go, done)| match (event(go, "go"), event(done, "done")) {
                    (Ok(g), Ok(d)) => Some((g, d)),
                    _ => None,
                });
            Ok(Some(Gpu { arena: ptr, events }))
        }
    }

    /// Calls the candidate once per rep on the legacy default stream, with the rep's buffers
    /// inside the arena; the first nonzero return value, 0 if none.
    fn call(entry: Entry, arena: sys::CUdeviceptr, reps: &[cudarl_cuda::runner::Rep]) -> i32 {
        let mut rc = 0;
        for rep in reps {
            let ptrs: Vec<*mut std::ffi::c_void> = rep
                .buffers
                .iter()
                .map(|&o| (arena + o) as *mut std::ffi::c_void)
                .collect();
            // SAFETY: the candidate's entry point (the shim's signature) on buffers inside the
            // arena, sizes and scalars in the task's order, the legacy default stream.
            let r = unsafe {
                entry(
                    ptrs.as_ptr(),
                    rep.sizes.as_ptr(),
                    rep.scalars.as_ptr(),
                    std::ptr::null_mut(),
                )
            };
            if rc == 0 {
                rc = r;
            }
        }
        rc
    }

    pub fn run(
        dir: PathBuf,
        gpu: bool,
        cudart: Option<PathBuf>,
        read: Vec<PathBuf>,
        write: Vec<PathBuf>,
        profiled: bool,
    ) -> ! {
        // SAFETY: the judge passes the control socket as fd 3.
        let ctl = unsafe { cudarl_cuda::runner::control_socket() };
        let mut out = ctl
            .try_clone()
            .unwrap_or_else(|e| fail(125, &format!("fd 3: {e}")));
        let mut inp = BufReader::new(ctl);
        harden_runner(&mut out);
        let confined = confine(
            &mut out,
            (&dir, cudart.as_ref()),
            (read, write),
            gpu,
            profiled,
        );
        let (_keep, rt) = preload(&mut out, cudart.as_ref());
        let own = start_gpu(&mut out, gpu, rt.as_ref());
        reply(&mut out, &Reply::Ready { gpu, confined });
        let Some(Request::Load(load)) = request(&mut inp) else {
            // SAFETY: nothing to clean up.
            unsafe { libc::_exit(0) }
        };
        let g = match open_gpu(&load) {
            Ok(g) => g,
            Err(e) => {
                reply(&mut out, &Reply::LoadError { message: e.0 });
                // SAFETY: as above.
                unsafe { libc::_exit(0) }
            }
        };
        let opts = install_filters(&mut out, profiled, own);
        // From here on the candidate's code may run.
        let (_lib, entry) = load_candidate(&mut out, &load.so);
        // The candidate's code is mapped: no executable memory from here on (except under a
        // profiler, whose collector lives in this process and maps code as it goes).
        let exec = if profiled {
            Ok(())
        } else {
            cudarl_sandbox::syscalls::exec_filter(&opts)
                .and_then(|f| cudarl_sandbox::syscalls::install(&[f], true))
        };
        if let Err(e) = exec {
            load_error(&mut out, format!("the exec filter: {e}"));
        }
        let events = g.as_ref().is_some_and(|g| g.events.is_some());
        reply(&mut out, &Reply::Loaded { events });
        serve(inp, out, g.as_ref(), entry, own)
    }

    /// Answers that the runner's own set-up failed (`message`) and leaves at once (exit code
    /// 125).
    fn init_error(out: &mut std::fs::File, message: String) -> ! {
        reply(out, &Reply::InitError { message });
        // SAFETY: leaves without running anything else.
        unsafe { libc::_exit(125) }
    }

    /// The runner's resource limits and hardening ([`cudarl_sandbox::harden`]), then the
    /// reporter of denied system calls on the control socket (fd 3).
    fn harden_runner(out: &mut std::fs::File) {
        let limits = Limits {
            cpu_seconds: 600,
            address_space_gib: 4096,
            file_size_bytes: 0,
            open_files: 256,
        };
        if let Err(e) = cudarl_sandbox::harden(&limits) {
            init_error(out, e.to_string());
        }
        if let Err(e) = cudarl_sandbox::report::install_reporter(3) {
            init_error(out, e.to_string());
        }
    }

    /// Confines the runner's file access (Landlock): reading [`base_reads`] of the staging
    /// directory `dir`, the CUDA runtime `cudart` and `read`; writing `write`, with `profiled`
    /// Nsight Compute's lock directory and with `gpu` the GPU's files and `/dev/shm`. Whether
    /// the confinement is enforced.
    fn confine(
        out: &mut std::fs::File,
        (dir, cudart): (&Path, Option<&PathBuf>),
        (read, write): (Vec<PathBuf>, Vec<PathBuf>),
        gpu: bool,
        profiled: bool,
    ) -> bool {
        let mut write = write;
        if profiled {
            // Nsight Compute's interprocess lock (`$TMPDIR/nvidia/nsight_compute/lock`), opened
            // by its collector at every profiled kernel; the judge gives the profile pass a
            // private `TMPDIR` and creates the directory.
            let tmp =
                std::env::var_os("TMPDIR").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
            write.push(tmp.join("nvidia").join("nsight_compute"));
        }
        if gpu {
            write.extend(gpu_writes());
            // The window events: the driver maps each interprocess event the judge created from
            // a file there, opened for reading and writing (before the seccomp filter, which
            // then refuses every open for writing).
            write.push(PathBuf::from("/dev/shm"));
        }
        let policy = FsPolicy {
            read: base_reads(dir, cudart, read),
            devices: if gpu { FsPolicy::gpu_devices() } else { vec![] },
            write,
            scopes: scopes(gpu),
            ..Default::default()
        };
        match policy.restrict(env_flag("CUDARL_ALLOW_UNCONFINED")) {
            Ok(s) => s.enforced,
            Err(e) => init_error(out, e.to_string()),
        }
    }

    /// Libraries a candidate links, loaded now (their files are not read after the sandbox),
    /// and the CUDA runtime `cudart`; both to be kept loaded.
    fn preload(
        out: &mut std::fs::File,
        cudart: Option<&PathBuf>,
    ) -> (
        Vec<libloading::os::unix::Library>,
        Option<libloading::Library>,
    ) {
        let flags = libc::RTLD_NOW | libc::RTLD_GLOBAL;
        let mut keep = Vec::new();
        for name in ["libstdc++.so.6", "libgcc_s.so.1", "libm.so.6"] {
            // SAFETY: loading system libraries.
            if let Ok(l) = unsafe { libloading::os::unix::Library::open(Some(name), flags) } {
                keep.push(l);
            }
        }
        let rt = match cudart {
            // SAFETY: the CUDA runtime the harness linked candidates against.
            Some(p) => match unsafe { libloading::os::unix::Library::open(Some(p), flags) } {
                Ok(l) => Some(libloading::Library::from(l)),
                Err(e) => init_error(out, format!("{}: {e}", p.display())),
            },
            None => None,
        };
        (keep, rt)
    }

    /// With `gpu`: CUDA initialized ([`init_gpu`], with the CUDA runtime `rt`) and the
    /// runner's kernels loaded ([`load_own`]); `None` without.
    fn start_gpu(
        out: &mut std::fs::File,
        gpu: bool,
        rt: Option<&libloading::Library>,
    ) -> Option<Own> {
        if gpu && let Err(e) = init_gpu(rt) {
            init_error(out, e.0);
        }
        if gpu {
            match load_own() {
                Ok(k) => Some(k),
                Err(e) => init_error(out, e.0),
            }
        } else {
            None
        }
    }

    /// Installs the runner's seccomp filters ([`Profile::Runner`]; with `profiled`, the
    /// profiler's own sockets allowed, found by connecting it with the runner's kernels
    /// `own`), and returns their options.
    fn install_filters(out: &mut std::fs::File, profiled: bool, own: Option<Own>) -> FilterOptions {
        let profiler_fds = match (profiled, own) {
            (true, Some(k)) => match connect_profiler(k.noop) {
                Ok(fds) => fds,
                Err(e) => init_error(out, e.0),
            },
            _ => vec![],
        };
        let opts = FilterOptions {
            // SAFETY: no preconditions.
            self_pid: unsafe { libc::getpid() },
            log_only: env_flag("CUDARL_SANDBOX_LOG"),
            write_opens: profiled,
            profiler_fds,
            ..Default::default()
        };
        let installed = cudarl_sandbox::syscalls::filters(Profile::Runner, &opts)
            .and_then(|f| cudarl_sandbox::syscalls::install(&f, true));
        if let Err(e) = installed {
            init_error(out, e.to_string());
        }
        opts
    }

    /// The candidate library `so`, loaded, and its entry point; the library must stay loaded
    /// while the entry point is called.
    fn load_candidate(
        out: &mut std::fs::File,
        so: &Path,
    ) -> (libloading::os::unix::Library, Entry) {
        // SAFETY: loading the candidate inside the sandbox; its constructors run now.
        let lib = match unsafe {
            libloading::os::unix::Library::open(Some(so), libc::RTLD_NOW | libc::RTLD_LOCAL)
        } {
            Ok(l) => l,
            Err(e) => load_error(out, e.to_string()),
        };
        // SAFETY: the shim's entry point has this signature.
        let entry: Entry = match unsafe { lib.get::<Entry>(b"cudarl_entry") } {
            Ok(s) => *s,
            Err(e) => load_error(out, e.to_string()),
        };
        (lib, entry)
    }

    /// Answers the judge's requests for the loaded candidate until [`Request::Exit`] or the end
    /// of the control socket (then exits without running the candidate's exit handlers).
    fn serve(
        mut inp: impl BufRead,
        mut out: std::fs::File,
        g: Option<&Gpu>,
        entry: Entry,
        own: Option<Own>,
    ) -> ! {
        loop {
            match request(&mut inp) {
                Some(Request::Run(run)) => {
                    let Some(g) = &g else {
                        reply(&mut out, &Reply::Armed { rc: -1 });
                        continue;
                    };
                    let stream: sys::CUstream = std::ptr::null_mut();
                    let own = own.expect("GPU mode loads the runner's kernels");
                    // SAFETY: the poison kernel and a wait on the judge's `go` event, on the
                    // legacy stream, before the launches; after them, the `done` event (ordered
                    // after them on the stream).
                    let poisoned = run.poison.is_none_or(|p| {
                        launch_poison(&own, p, stream) == sys::CUresult::CUDA_SUCCESS
                    });
                    let r = match g.events {
                        // SAFETY: the judge's `go` event, opened at load.
                        Some((go, _)) => unsafe { sys::cuStreamWaitEvent(stream, go, 0) },
                        // SAFETY: the fallback `go` word of the arena.
                        None => unsafe {
                            let go = g.arena + cudarl_cuda::runner::GO_OFFSET;
                            sys::cuStreamWaitValue32_v2(stream, go, run.window, 0)
                        },
                    };
                    let rc = if !poisoned {
                        cudarl_cuda::runner::POISON_FAILED
                    } else if r != sys::CUresult::CUDA_SUCCESS {
                        cudarl_cuda::runner::GO_FAILED
                    } else if run.reps.is_empty() {
                        // A calibration window: the runner's own empty kernel.
                        if launch_noop(own.noop, stream) == sys::CUresult::CUDA_SUCCESS {
                            0
                        } else {
                            cudarl_cuda::runner::NOOP_FAILED
                        }
                    } else {
                        call(entry, g.arena, &run.reps)
                    };
                    let recorded = match g.events {
                        // SAFETY: the judge's `done` event, opened at load.
                        Some((_, done)) => unsafe { sys::cuEventRecord(done, stream) },
                        // SAFETY: the fallback `done` word of the arena.
                        None => unsafe {
                            let done = g.arena + cudarl_cuda::runner::DONE_OFFSET;
                            sys::cuStreamWriteValue32_v2(stream, done, run.window, 0)
                        },
                    };
                    let rc = if recorded == sys::CUresult::CUDA_SUCCESS {
                        rc
                    } else {
                        cudarl_cuda::runner::DONE_FAILED
                    };
                    reply(&mut out, &Reply::Armed { rc });
                }
                Some(Request::Launch(run)) => {
                    let Some(g) = &g else {
                        reply(
                            &mut out,
                            &Reply::Launched {
                                rc: -1,
                                error: Some("no GPU".into()),
                            },
                        );
                        continue;
                    };
                    let rc = call(entry, g.arena, &run.reps);
                    // SAFETY: synchronizes the current context.
                    let r = unsafe { sys::cuCtxSynchronize() };
                    let error = (r != sys::CUresult::CUDA_SUCCESS).then(|| format!("{r:?}"));
                    reply(&mut out, &Reply::Launched { rc, error });
                }
                Some(Request::Sync) => {
                    // SAFETY: synchronizes the current context.
                    let r = unsafe { sys::cuCtxSynchronize() };
                    let error = (r != sys::CUresult::CUDA_SUCCESS).then(|| format!("{r:?}"));
                    reply(&mut out, &Reply::Synced { error });
                }
                Some(Request::Load(_)) => {
                    reply(
                        &mut out,
                        &Reply::LoadError {
                            message: "one candidate per runner".into(),
                        },
                    );
                }
                Some(Request::Exit) | None => {
                    // SAFETY: leaves without running the candidate's atexit handlers or
                    // destructors.
                    unsafe { libc::_exit(0) }
                }
            }
        }
    }
}
