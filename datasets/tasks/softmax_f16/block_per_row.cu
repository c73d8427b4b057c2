// softmax_f16, optimized: one block per row (one warp per row for rows of at most 256 columns),
// coalesced passes, float math, warp-shuffle + shared-memory reductions for the max and the sum.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
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

__global__ void softmax_f16_block(const __half* __restrict__ x, __half* __restrict__ out, int64_t cols) {
    const int64_t r = blockIdx.x;
    const __half* row = x + r * cols;
    float m = -INFINITY;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, __half2float(row[c]));
    m = block_reduce(m, true);
    float s = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += expf(__half2float(row[c]) - m);
    s = block_reduce(s, false);
    const float inv = 1.0f / s;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
        out[r * cols + c] = __float2half(expf(__half2float(row[c]) - m) * inv);
}

// Rows of at most 256 columns: one warp per row, eight rows per block, values kept in registers.
__global__ void softmax_f16_warp(const __half* __restrict__ x, __half* __restrict__ out, int64_t rows, int64_t cols) {
    const int64_t r = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (r >= rows) return;
    const __half* row = x + r * cols;
    float v[8];
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int64_t c = lane + 32 * i;
        v[i] = c < cols ? __half2float(row[c]) : -INFINITY;
        m = fmaxf(m, v[i]);
    }
    m = warp_max(m);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        v[i] = (lane + 32 * i) < cols ? expf(v[i] - m) : 0.0f;
        s += v[i];
    }
    s = warp_sum(s);
    const float inv = 1.0f / s;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int64_t c = lane + 32 * i;
        if (c < cols) out[r * cols + c] = __float2half(v[i] * inv);
    }
}

extern "C" void launch(const __half* x, __half* out, int64_t rows, int64_t cols, cudaStream_t stream) {
    if (cols <= 256) {
        softmax_f16_warp<<<(unsigned)((rows + 7) / 8), 256, 0, stream>>>(x, out, rows, cols);
    } else {
        const int block = cols >= 2048 ? 512 : 256;
        softmax_f16_block<<<(unsigned)rows, block, 0, stream>>>(x, out, cols);
    }
}
