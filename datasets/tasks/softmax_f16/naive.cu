// softmax_f16, naive: one thread per row, three sequential passes (max, sum of exp, write),
// float math, f16 loads and stores.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <math.h>

__global__ void softmax_f16_naive(const __half* x, __half* out, int64_t rows, int64_t cols) {
    int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const __half* row = x + r * cols;
    float m = -INFINITY;
    for (int64_t c = 0; c < cols; ++c) m = fmaxf(m, __half2float(row[c]));
    float s = 0.0f;
    for (int64_t c = 0; c < cols; ++c) s += expf(__half2float(row[c]) - m);
    for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = __float2half(expf(__half2float(row[c]) - m) / s);
}

extern "C" void launch(const __half* x, __half* out, int64_t rows, int64_t cols, cudaStream_t stream) {
    const int block = 128;
    softmax_f16_naive<<<(unsigned)((rows + block - 1) / block), block, 0, stream>>>(x, out, rows, cols);
}
