// CUDA graphs of libtorch work for cudarl-train: a C ABI over `at::cuda::CUDAGraph` (what
// Python's `torch.cuda.CUDAGraph` wraps), which tch does not bind. Capture runs the tch
// operations issued between `cudarl_graph_begin` and `cudarl_graph_end` on a side stream, with
// allocations from a private memory pool (shared by the graphs of one pool handle), and with
// libtorch's default CUDA generator registered, so random draws advance on every replay.
//
// Also the version counter of a tensor, which tells the decoder whether a model's weights changed,
// the release of a tensor's gradient, and the caching allocator's statistics and cache release.
//
// Built by build.rs with the `cc` crate against the headers of the torch wheel libtorch comes
// from. Without CUDA headers it is built with CUDARL_NO_CUDA_GRAPHS and every call reports that
// graphs are unavailable. Every function catches C++ exceptions and returns 0 on success or 1
// with the message in `err` (NUL-terminated, truncated to `err_len`).

#include <cstddef>
#include <cstring>
#include <exception>
#include <string>

namespace {
void put_err(char* err, size_t err_len, const std::string& msg) {
  if (err == nullptr || err_len == 0) return;
  size_t n = msg.size() < err_len - 1 ? msg.size() : err_len - 1;
  std::memcpy(err, msg.data(), n);
  err[n] = '\0';
}
}  // namespace

#ifndef CUDARL_NO_TORCH_HEADERS
#include <ATen/core/Tensor.h>

// The version counter of a tensor (`at::Tensor*`, what tch's `Tensor::as_ptr` returns): every
// in-place write to its storage through libtorch (an optimizer step, `copy_`) increases it.
extern "C" long long cudarl_tensor_version(const void* t) {
  try {
    return static_cast<long long>(static_cast<const at::Tensor*>(t)->_version());
  } catch (...) {
    return -1;
  }
}

// Increases that counter after a write libtorch did not see (the fused AdamW kernel's).
extern "C" void cudarl_tensor_bump_version(const void* t) {
  try {
    static_cast<const at::Tensor*>(t)->unsafeGetTensorImpl()->bump_version();
  } catch (...) {
  }
}

// Drops a tensor's gradient (`t.mutable_grad().reset()`, what PyTorch's
// `zero_grad(set_to_none=True)` does), so its memory returns to the allocator until the next
// backward pass makes a new one. Returns 1 when done, 0 when it could not be (the caller then
// zeroes the gradient in place).
extern "C" int cudarl_tensor_reset_grad(void* t) {
  try {
    static_cast<at::Tensor*>(t)->mutable_grad().reset();
    return 1;
  } catch (...) {
    return 0;
  }
}
#else
extern "C" long long cudarl_tensor_version(const void*) { return -1; }
extern "C" void cudarl_tensor_bump_version(const void*) {}
extern "C" int cudarl_tensor_reset_grad(void*) { return 0; }
#endif

#ifndef CUDARL_NO_CUDA_GRAPHS

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>

namespace {
struct Graph {
  at::cuda::CUDAGraph graph;
  c10::cuda::CUDAStream side;
  c10::cuda::CUDAStream prev;
  explicit Graph(c10::DeviceIndex dev)
      : graph(false),
        side(c10::cuda::getStreamFromPool(false, dev)),
        prev(c10::cuda::getCurrentCUDAStream(dev)) {}
};

template <typename F>
int guarded(char* err, size_t err_len, F f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    put_err(err, err_len, e.what());
  } catch (...) {
    put_err(err, err_len, "unknown C++ exception");
  }
  return 1;
}
}  // namespace

extern "C" {

int cudarl_graph_available() { return 1; }

int cudarl_graph_pool(unsigned long long* id0, unsigned long long* id1, char* err,
                      size_t err_len) {
  return guarded(err, err_len, [&] {
    auto id = at::cuda::graph_pool_handle();
    *id0 = id.first;
    *id1 = id.second;
  });
}

int cudarl_graph_new(int device, void** out, char* err, size_t err_len) {
  return guarded(err, err_len, [&] { *out = new Graph(static_cast<c10::DeviceIndex>(device)); });
}

int cudarl_graph_begin(void* g, unsigned long long id0, unsigned long long id1, char* err,
                       size_t err_len) {
  return guarded(err, err_len, [&] {
    auto* gr = static_cast<Graph*>(g);
    gr->prev = c10::cuda::getCurrentCUDAStream(gr->side.device_index());
    // Work queued before the capture (the prefill, the warm-up step) is done before it.
    c10::cuda::device_synchronize();
    c10::cuda::setCurrentCUDAStream(gr->side);
    try {
      gr->graph.capture_begin({id0, id1}, cudaStreamCaptureModeThreadLocal);
    } catch (...) {
      c10::cuda::setCurrentCUDAStream(gr->prev);
      throw;
    }
  });
}

int cudarl_graph_end(void* g, char* err, size_t err_len) {
  auto* gr = static_cast<Graph*>(g);
  int rc = guarded(err, err_len, [&] { gr->graph.capture_end(); });
  c10::cuda::setCurrentCUDAStream(gr->prev);
  return rc;
}

int cudarl_graph_replay(void* g, char* err, size_t err_len) {
  return guarded(err, err_len, [&] { static_cast<Graph*>(g)->graph.replay(); });
}

void cudarl_graph_free(void* g) { delete static_cast<Graph*>(g); }

// libtorch's caching allocator on `device`: `out[0..3]` = bytes allocated to tensors now, their
// peak, and the peak reserved from the driver, since the last reset (`reset` != 0 resets the
// peaks after reading).
int cudarl_cuda_memory(int device, int reset, unsigned long long* out, char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    auto dev = static_cast<c10::DeviceIndex>(device);
    auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(dev);
    // Index 0: the aggregate over both pools.
    out[0] = static_cast<unsigned long long>(s.allocated_bytes[0].current);
    out[1] = static_cast<unsigned long long>(s.allocated_bytes[0].peak);
    out[2] = static_cast<unsigned long long>(s.reserved_bytes[0].peak);
    if (reset != 0) c10::cuda::CUDACachingAllocator::resetPeakStats(dev);
  });
}

// Returns the caching allocator's cached, unused blocks to the driver
// (`torch.cuda.empty_cache()`); graph pools and live tensors keep theirs.
int cudarl_cuda_empty_cache(char* err, size_t err_len) {
  return guarded(err, err_len, [&] { c10::cuda::CUDACachingAllocator::emptyCache(); });
}

// libtorch's current CUDA stream on `device` (a `cudaStream_t`), where work launched beside
// libtorch's (the fused AdamW step) must go to stay in order with it.
void* cudarl_current_stream(int device) {
  try {
    return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
  } catch (...) {
    return nullptr;
  }
}

}  // extern "C"

#else  // CUDARL_NO_CUDA_GRAPHS

namespace {
int unavailable(char* err, size_t err_len) {
  put_err(err, err_len, "cudarl-train was built without CUDA headers: no CUDA graphs");
  return 1;
}
}  // namespace

extern "C" {
int cudarl_graph_available() { return 0; }
int cudarl_graph_pool(unsigned long long*, unsigned long long*, char* err, size_t err_len) {
  return unavailable(err, err_len);
}
int cudarl_graph_new(int, void**, char* err, size_t err_len) { return unavailable(err, err_len); }
int cudarl_graph_begin(void*, unsigned long long, unsigned long long, char* err, size_t err_len) {
  return unavailable(err, err_len);
}
int cudarl_graph_end(void*, char* err, size_t err_len) { return unavailable(err, err_len); }
int cudarl_graph_replay(void*, char* err, size_t err_len) { return unavailable(err, err_len); }
void cudarl_graph_free(void*) {}
void* cudarl_current_stream(int) { return nullptr; }
int cudarl_cuda_memory(int, int, unsigned long long*, char* err, size_t err_len) {
  return unavailable(err, err_len);
}
int cudarl_cuda_empty_cache(char* err, size_t err_len) { return unavailable(err, err_len); }
}  // extern "C"

#endif  // CUDARL_NO_CUDA_GRAPHS
