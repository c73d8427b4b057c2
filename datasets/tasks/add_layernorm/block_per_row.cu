// add_layernorm, optimized: one block per row, coalesced passes, block reductions (warp shuffles) for
// the mean and the (two-pass) variance, the residual add fused into every pass.
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

__global__ void add_layernorm_block(const float* __restrict__ x, const float* __restrict__ res, const float* __restrict__ w, const float* __restrict__ b,
                           float* __restrict__ out, int64_t rows, int64_t cols) {
    const int64_t r = blockIdx.x;
    const float* row = x + r * cols;
    const float* rrow = res + r * cols;
    float s = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += (row[c] + rrow[c]);
    const float mean = block_reduce(s, false) / (float)cols;
    float q = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) { float d = (row[c] + rrow[c]) - mean; q += d * d; }
    const float rstd = rsqrtf(block_reduce(q, false) / (float)cols + 1e-5f);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) out[r * cols + c] = ((row[c] + rrow[c]) - mean) * rstd * w[c] + b[c];
}

extern "C" void launch(const float* x, const float* res, const float* w, const float* b, float* out, int64_t rows, int64_t cols, cudaStream_t stream) {
    const int block = cols >= 2048 ? 512 : (cols >= 256 ? 256 : 64);
    add_layernorm_block<<<(unsigned)rows, block, 0, stream>>>(x, res, w, b, out, rows, cols);
}
