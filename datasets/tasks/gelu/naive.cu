// gelu, naive: one thread per element.
#include <cuda_runtime.h>
#include <stdint.h>

__global__ void gelu_naive(const float* x, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v_x = x[i];
        out[i] = 0.5f * v_x * (1.0f + erff(v_x * 0.70710678118654752f));
    }
}

extern "C" void launch(const float* x, float* out, int64_t n, cudaStream_t stream) {
    const int block = 256;
    int64_t grid = (n + block - 1) / block;
    gelu_naive<<<(unsigned)grid, block, 0, stream>>>(x, out, n);
}
