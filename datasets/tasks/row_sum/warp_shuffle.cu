// row_sum, optimized: one block per row, coalesced strided loads, warp-shuffle reduction then
// a shared-memory reduction across warps.
#include <cuda_runtime.h>
#include <stdint.h>

__inline__ __device__ float warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) {
        v += __shfl_down_sync(0xffffffffu, v, off);
    }
    return v;
}

__global__ void row_sum_shfl(const float* __restrict__ x, float* __restrict__ out, int64_t rows, int64_t cols) {
    __shared__ float partial[32];
    const int64_t r = blockIdx.x;
    if (r >= rows) return;
    const float* row = x + r * cols;
    float acc = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        acc += row[c];
    }
    acc = warp_sum(acc);
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    if (lane == 0) partial[warp] = acc;
    __syncthreads();
    if (warp == 0) {
        const int nwarps = (blockDim.x + 31) >> 5;
        float v = lane < nwarps ? partial[lane] : 0.0f;
        v = warp_sum(v);
        if (lane == 0) out[r] = v;
    }
}

extern "C" void launch(const float* x, float* out, int64_t rows, int64_t cols, cudaStream_t stream) {
    const int block = cols >= 1024 ? 512 : 128;
    row_sum_shfl<<<(unsigned)rows, block, 0, stream>>>(x, out, rows, cols);
}
