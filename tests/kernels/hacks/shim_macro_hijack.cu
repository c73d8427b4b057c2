// Macros aimed at the harness's shim, which is appended to the candidate's file: its
// `cudaGetLastError()` made `cudaSuccess`, so a launch that fails (2048 threads per block) is
// reported as a success after an earlier launch wrote the outputs. The shim undefines every name
// it uses, so it still returns the launch's error.
#include <cuda_runtime.h>
#include <stdint.h>
#define cudaGetLastError() cudaSuccess
__global__ void add(const float* a, const float* b, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
extern "C" void launch(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {
    add<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(a, b, out, n);
    add<<<1, 2048, 0, stream>>>(a, b, out, 0);
}
