// row_max, optimized: one block per row, coalesced loads, warp-shuffle + shared-memory max.
#include <cuda_runtime.h>
#include <stdint.h>
#include <math.h>
__device__ __forceinline__ float warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}
// Block-wide reduction (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
__device__ __forceinline__ float block_reduce(float v, bool is_max) {
    __shared__ float part[32];
    __shared__ float result;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = is_max ? warp_max(v) : warp_sum(v);
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float w = lane < nw ? part[lane] : (is_max ? -INFINITY : 0.0f);
        w = is_max ? warp_max(w) : warp_sum(w);
        if (lane == 0) result = w;
    }
    __syncthreads();
    float r = result;
    __syncthreads();
    return r;
}

__global__ void row_max_block(const float* __restrict__ x, float* __restrict__ out, int64_t rows, int64_t cols) {
    const int64_t r = blockIdx.x;
    const float* row = x + r * cols;
    float m = -INFINITY;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, row[c]);
    m = block_reduce(m, true);
    if (threadIdx.x == 0) out[r] = m;
}

extern "C" void launch(const float* x, float* out, int64_t rows, int64_t cols, cudaStream_t stream) {
    const int block = cols >= 4096 ? 512 : (cols >= 512 ? 256 : 64);
    row_max_block<<<(unsigned)rows, block, 0, stream>>>(x, out, rows, cols);
}
