// row_max, naive: one thread per row, a sequential scan (neighbouring threads read different rows).
#include <cuda_runtime.h>
#include <stdint.h>
#include <math.h>

__global__ void row_max_naive(const float* x, float* out, int64_t rows, int64_t cols) {
    int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    float m = -INFINITY;
    for (int64_t c = 0; c < cols; ++c) m = fmaxf(m, x[r * cols + c]);
    out[r] = m;
}

extern "C" void launch(const float* x, float* out, int64_t rows, int64_t cols, cudaStream_t stream) {
    const int block = 128;
    row_max_naive<<<(unsigned)((rows + block - 1) / block), block, 0, stream>>>(x, out, rows, cols);
}
