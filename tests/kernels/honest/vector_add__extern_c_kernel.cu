// vector_add with a C-linkage kernel, a non-inline `__device__` helper (nvcc gives it a host stub
// the object defines), a `__constant__` scale of one, and `std::min` in the launcher (an inline
// instantiation the object defines as a weak symbol).
#include <cuda_runtime.h>
#include <stdint.h>
#include <algorithm>
__constant__ float c_scale = 1.0f;
__device__ __noinline__ float sum_scaled(float x, float y) { return (x + y) * c_scale; }
extern "C" __global__ void vector_add_c(const float* a, const float* b, float* out, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        out[i] = sum_scaled(a[i], b[i]);
}
extern "C" void launch(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {
    int64_t blocks = std::min<int64_t>((n + 255) / 256, 65535);
    if (blocks < 1) blocks = 1;
    vector_add_c<<<(unsigned)blocks, 256, 0, stream>>>(a, b, out, n);
}
