// transpose, naive: one thread per element; reads are coalesced, writes stride by `rows`.
#include <cuda_runtime.h>
#include <stdint.h>

__global__ void transpose_naive(const float* x, float* out, int64_t rows, int64_t cols) {
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t r = (int64_t)blockIdx.y * blockDim.y + threadIdx.y;
    if (r < rows && c < cols) out[c * rows + r] = x[r * cols + c];
}

extern "C" void launch(const float* x, float* out, int64_t rows, int64_t cols, cudaStream_t stream) {
    dim3 block(32, 8);
    dim3 grid((unsigned)((cols + 31) / 32), (unsigned)((rows + 7) / 8));
    transpose_naive<<<grid, block, 0, stream>>>(x, out, rows, cols);
}
