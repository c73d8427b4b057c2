// softmax, naive: one thread per row, three sequential passes (max, sum of exp, write).
#include <cuda_runtime.h>
#include <stdint.h>
#include <math.h>

__global__ void softmax_naive(const float* x, float* out, int64_t rows, int64_t cols) {
    int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* row = x + r * cols;
    float m = -INFINITY;
    for (int64_t c = 0; c < cols; ++c) m = fmaxf(m, row[c]);
    float s = 0.0f;
    for (int64_t c = 0; c < cols; ++c) s += expf(row[c] - m);
    for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = expf(row[c] - m) / s;
}

extern "C" void launch(const float* x, float* out, int64_t rows, int64_t cols, cudaStream_t stream) {
    const int block = 128;
    softmax_naive<<<(unsigned)((rows + block - 1) / block), block, 0, stream>>>(x, out, rows, cols);
}
