// matmul_bias_relu, optimized: 64x64 output tiles per 256-thread block, k in steps of 16 through shared
// memory, 4x4 outputs per thread in registers (rows ty + 16i, columns tx + 16j: conflict-free
// shared-memory reads), bias+relu fused into the epilogue.
#include <cuda_runtime.h>
#include <stdint.h>
#include <math.h>

#define BM 64
#define BN 64
#define BK 16

__global__ void __launch_bounds__(256) matmul_bias_relu_tiled(const float* __restrict__ a, const float* __restrict__ b, const float* bias, float* __restrict__ out,
                                                  int64_t m, int64_t n, int64_t k) {
    __shared__ float as[BK][BM + 4];
    __shared__ float bs[BK][BN + 4];
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int64_t row0 = (int64_t)blockIdx.y * BM, col0 = (int64_t)blockIdx.x * BN;
    float acc[4][4];
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
    for (int64_t k0 = 0; k0 < k; k0 += BK) {
        for (int e = threadIdx.x; e < BM * BK; e += 256) {
            const int mm = e / BK, kk = e % BK;
            const int64_t gr = row0 + mm, gk = k0 + kk;
            as[kk][mm] = (gr < m && gk < k) ? a[gr * k + gk] : 0.0f;
        }
        for (int e = threadIdx.x; e < BK * BN; e += 256) {
            const int kk = e / BN, nn = e % BN;
            const int64_t gk = k0 + kk, gc = col0 + nn;
            bs[kk][nn] = (gk < k && gc < n) ? b[gk * n + gc] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            float av[4], bv[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) av[i] = as[kk][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; ++j) bv[j] = bs[kk][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        __syncthreads();
    }
    for (int i = 0; i < 4; ++i) {
        const int64_t r = row0 + ty + 16 * i;
        if (r >= m) continue;
        for (int j = 0; j < 4; ++j) {
            const int64_t c = col0 + tx + 16 * j;
            if (c >= n) continue;
            float v = acc[i][j];
            v = fmaxf(v + bias[c], 0.0f);
            out[r * n + c] = v;
        }
    }
}

extern "C" void launch(const float* a, const float* b, const float* bias, float* out, int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
    dim3 grid((unsigned)((n + BN - 1) / BN), (unsigned)((m + BM - 1) / BM));
    matmul_bias_relu_tiled<<<grid, 256, 0, stream>>>(a, b, bias, out, m, n, k);
}
