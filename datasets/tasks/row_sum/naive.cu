// row_sum, naive: one thread per row, sequential loop (uncoalesced: neighbouring threads read
// addresses `cols` floats apart).
#include <cuda_runtime.h>
#include <stdint.h>

__global__ void row_sum_naive(const float* x, float* out, int64_t rows, int64_t cols) {
    int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r < rows) {
        float acc = 0.0f;
        for (int64_t c = 0; c < cols; ++c) {
            acc += x[r * cols + c];
        }
        out[r] = acc;
    }
}

extern "C" void launch(const float* x, float* out, int64_t rows, int64_t cols, cudaStream_t stream) {
    const int block = 256;
    int64_t grid = (rows + block - 1) / block;
    row_sum_naive<<<(unsigned)grid, block, 0, stream>>>(x, out, rows, cols);
}
