#include <cuda_runtime.h>
#include <stdint.h>
// Correct output, but scribbles on an input.
__global__ void k(const float* a, const float* b, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { out[i] = a[i] + b[i]; ((float*)a)[i] = 0.0f; }
}
extern "C" void launch(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {
    k<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(a, b, out, n);
}
