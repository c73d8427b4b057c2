// bias_gelu, naive: one thread per element, the bias column from the flat index.
#include <cuda_runtime.h>
#include <stdint.h>
#include <math.h>

__global__ void bias_gelu_naive(const float* x, const float* bias, float* out, int64_t rows, int64_t cols) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * cols) return;
    float v = x[i] + bias[i % cols];
    out[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
}

extern "C" void launch(const float* x, const float* bias, float* out, int64_t rows, int64_t cols, cudaStream_t stream) {
    const int block = 256;
    int64_t n = rows * cols;
    bias_gelu_naive<<<(unsigned)((n + block - 1) / block), block, 0, stream>>>(x, bias, out, rows, cols);
}
