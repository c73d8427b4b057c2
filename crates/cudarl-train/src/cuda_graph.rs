//! CUDA graphs of tch work: a safe wrapper of `at::cuda::CUDAGraph` (what Python's
//! `torch.cuda.CUDAGraph` wraps) through the C++ shim `csrc/cuda_graph.cpp`. The tch operations
//! a closure issues during [`CudaGraph::capture`] are recorded, not run; [`CudaGraph::replay`]
//! runs them again with one launch, on the same tensors (addresses), with fresh random draws of
//! libtorch's default CUDA generator. Tensors allocated during capture live in the graph's
//! memory pool ([`GraphPool`]) for as long as the graph; reading one after a replay reads that
//! replay's result.

use std::ffi::{CStr, c_char, c_void};

use crate::ModelError;

unsafe extern "C" {
    fn cudarl_tensor_version(t: *const c_void) -> i64;
    fn cudarl_tensor_reset_grad(t: *mut c_void) -> i32;
    fn cudarl_graph_available() -> i32;
    fn cudarl_graph_pool(id0: *mut u64, id1: *mut u64, err: *mut c_char, n: usize) -> i32;
    fn cudarl_graph_new(device: i32, out: *mut *mut c_void, err: *mut c_char, n: usize) -> i32;
    fn cudarl_graph_begin(g: *mut c_void, id0: u64, id1: u64, err: *mut c_char, n: usize) -> i32;
    fn cudarl_graph_end(g: *mut c_void, err: *mut c_char, n: usize) -> i32;
    fn cudarl_graph_replay(g: *mut c_void, err: *mut c_char, n: usize) -> i32;
    fn cudarl_graph_free(g: *mut c_void);
    fn cudarl_cuda_memory(
        device: i32,
        reset: i32,
        out: *mut u64,
        err: *mut c_char,
        n: usize,
    ) -> i32;
    fn cudarl_cuda_empty_cache(err: *mut c_char, n: usize) -> i32;
}

/// libtorch's caching allocator on `dev` since the last [`gpu_memory`] call that reset it
/// (as `torch.cuda.memory_allocated`, `max_memory_allocated`, `max_memory_reserved`), then,
/// with `reset`, its peaks reset. `None` on a CPU device or a build without CUDA.
pub fn gpu_memory(dev: tch::Device, reset: bool) -> Option<cudarl_protocol::GpuMemory> {
    let tch::Device::Cuda(i) = dev else {
        return None;
    };
    let mut out = [0u64; 3];
    // SAFETY: `out` has the three slots the shim writes.
    call("memory", |e, n| unsafe {
        cudarl_cuda_memory(i as i32, reset as i32, out.as_mut_ptr(), e, n)
    })
    .ok()?;
    Some(cudarl_protocol::GpuMemory {
        allocated: out[0],
        peak_allocated: out[1],
        peak_reserved: out[2],
    })
}

/// Returns libtorch's cached, unused GPU memory to the driver (`torch.cuda.empty_cache()`):
/// between requests of a trainer that shares its GPU, what one request freed (a prefill's
/// activations, an update's) is then free for the next request's own sizes and for other
/// processes (the harness's kernel runs), instead of held in blocks cut for the last one. At
/// Qwen2.5-Coder 7B with LoRA, checkpointed, the RL trainer's nvidia-smi peak over a rollout
/// and a GRPO update went from 25.2 to 22.6 GiB
/// (`benchmarks/results/model_scale_h200_2026-11-30.json`, `grpo_update`). Nothing on a CPU
/// device or without CUDA.
pub fn release_cached_memory(dev: tch::Device) {
    if let tch::Device::Cuda(_) = dev {
        // SAFETY: the shim takes no pointers but the error buffer; a failure changes nothing.
        let _ = call("empty cache", |e, n| unsafe {
            cudarl_cuda_empty_cache(e, n)
        });
    }
}

/// Calls a shim function with an error buffer; its message as a [`ModelError::Generate`].
fn call(what: &str, f: impl FnOnce(*mut c_char, usize) -> i32) -> Result<(), ModelError> {
    let mut buf = vec![0 as c_char; 1024];
    if f(buf.as_mut_ptr(), buf.len()) == 0 {
        return Ok(());
    }
    // SAFETY: the shim writes a NUL-terminated message into the buffer (zeroed beforehand).
    let msg = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy();
    Err(ModelError::Generate(format!("CUDA graph {what}: {msg}")))
}

/// libtorch's version counter of `t`'s storage (`Tensor._version` in Python): every in-place
/// write through libtorch (an optimizer step, `copy_`) increases it. `-1` when this build has
/// no libtorch headers.
pub fn tensor_version(t: &tch::Tensor) -> i64 {
    // SAFETY: `as_ptr` is a live `at::Tensor*` for as long as `t`; the shim only reads it.
    unsafe { cudarl_tensor_version(t.as_ptr().cast()) }
}

/// Drops `t`'s gradient, as PyTorch's `zero_grad(set_to_none=True)` does: `t.grad()` is
/// undefined afterwards and its memory goes back to libtorch's allocator until the next backward
/// pass makes a new one (6.2 GB of float32 gradients at 1.5B parameters). A build without
/// libtorch headers zeroes the gradient in place instead.
pub fn reset_grad(t: &mut tch::Tensor) {
    // SAFETY: `as_mut_ptr` is a live `at::Tensor*` for as long as `t`, borrowed mutably; the
    // shim resets the gradient it holds and catches libtorch's exceptions.
    if unsafe { cudarl_tensor_reset_grad(t.as_mut_ptr().cast()) } == 0 {
        t.zero_grad();
    }
}

/// Whether this build can capture CUDA graphs (built against CUDA headers and a libtorch with
/// CUDA; whether a GPU is present is `tch::Cuda::is_available`).
pub fn available() -> bool {
    // SAFETY: returns a constant.
    unsafe { cudarl_graph_available() == 1 }
}

/// A memory pool that several graphs share (`torch.cuda.graph_pool_handle()`): what one
/// graph's capture freed, the next capture reuses. Graphs of one pool must not run at the same
/// time (they are replayed one after another on one stream here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphPool(u64, u64);

impl GraphPool {
    /// A new pool id.
    ///
    /// # Errors
    /// No CUDA graphs in this build ([`available`]), libtorch errors.
    pub fn new() -> Result<GraphPool, ModelError> {
        let (mut a, mut b) = (0u64, 0u64);
        // SAFETY: the shim writes two integers through valid pointers.
        call("pool", |e, n| unsafe {
            cudarl_graph_pool(&mut a, &mut b, e, n)
        })?;
        Ok(GraphPool(a, b))
    }
}

/// One captured CUDA graph.
#[derive(Debug)]
pub struct CudaGraph {
    ptr: *mut c_void,
}

// SAFETY: the graph is an owned C++ object with no thread affinity; replays are serialized by
// `&mut self`.
unsafe impl Send for CudaGraph {}

impl CudaGraph {
    /// Captures the work `body` issues on CUDA device `device` into a graph that allocates from
    /// `pool`, and returns it with `body`'s result (tensors that live in the pool; their
    /// contents are defined only after a replay). Nothing runs during capture: `body` must not
    /// read a device value on the host or synchronize (libtorch then errors and the capture is
    /// abandoned).
    ///
    /// # Errors
    /// No CUDA graphs in this build, `body`'s error, libtorch's capture errors.
    pub fn capture<T>(
        device: usize,
        pool: GraphPool,
        body: impl FnOnce() -> Result<T, ModelError>,
    ) -> Result<(CudaGraph, T), ModelError> {
        let mut ptr = std::ptr::null_mut();
        // SAFETY: the shim allocates a graph and writes its pointer.
        call("create", |e, n| unsafe {
            cudarl_graph_new(device as i32, &mut ptr, e, n)
        })?;
        let graph = CudaGraph { ptr };
        // SAFETY: `ptr` is a live graph.
        call("capture", |e, n| unsafe {
            cudarl_graph_begin(graph.ptr, pool.0, pool.1, e, n)
        })?;
        let out = body();
        // SAFETY: as above; ends the capture begun here whatever `body` returned.
        let end = call("capture", |e, n| unsafe {
            cudarl_graph_end(graph.ptr, e, n)
        });
        let out = out?;
        end?;
        Ok((graph, out))
    }

    /// Runs the captured work once more on the current stream (asynchronous to the host).
    ///
    /// # Errors
    /// CUDA errors of the launch.
    pub fn replay(&mut self) -> Result<(), ModelError> {
        // SAFETY: `ptr` is a live, captured graph.
        call("replay", |e, n| unsafe {
            cudarl_graph_replay(self.ptr, e, n)
        })
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `cudarl_graph_new` and is freed once.
        unsafe { cudarl_graph_free(self.ptr) }
    }
}
