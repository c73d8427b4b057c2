// axpy, naive: one thread per element.
#include <cuda_runtime.h>
#include <stdint.h>

__global__ void axpy_naive(const float* x, const float* y, float* out, float alpha, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v_x = x[i]; float v_y = y[i];
        out[i] = fmaf(alpha, v_x, v_y);
    }
}

extern "C" void launch(const float* x, const float* y, float* out, float alpha, int64_t n, cudaStream_t stream) {
    const int block = 256;
    int64_t grid = (n + block - 1) / block;
    axpy_naive<<<(unsigned)grid, block, 0, stream>>>(x, y, out, alpha, n);
}
