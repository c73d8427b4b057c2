// matmul_f16, optimized: tensor cores through WMMA (16x16x16 f16 fragments, float accumulators).
// 64x64 output tile per block of 4 warps (32x32 per warp: 2x2 fragments), 32-deep k steps staged
// in padded shared memory with zero fill at the edges (any m, n, k), the float tile written back
// through shared memory and rounded to f16 once.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <mma.h>
#include <stdint.h>

using namespace nvcuda;

constexpr int BM = 64, BN = 64, BK = 32;
constexpr int LDA = BK + 8, LDB = BN + 8, LDC = BN + 4;  // padding: fewer bank conflicts

__global__ void __launch_bounds__(128) matmul_f16_wmma(const __half* __restrict__ a, const __half* __restrict__ b,
                                                       __half* __restrict__ out, int64_t m, int64_t n, int64_t k) {
    __shared__ __align__(32) __half as[BM * LDA];
    __shared__ __align__(32) __half bs[BK * LDB];
    __shared__ __align__(32) float cs[BM * LDC];
    const int warp = threadIdx.x >> 5;
    const int wr = warp >> 1, wc = warp & 1;
    const int64_t row0 = (int64_t)blockIdx.y * BM, col0 = (int64_t)blockIdx.x * BN;
    const __half zero = __float2half(0.0f);
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
    for (int64_t k0 = 0; k0 < k; k0 += BK) {
        for (int idx = threadIdx.x; idx < BM * BK; idx += blockDim.x) {
            const int r = idx / BK, c = idx % BK;
            const int64_t gr = row0 + r, gc = k0 + c;
            as[r * LDA + c] = (gr < m && gc < k) ? a[gr * k + gc] : zero;
        }
        for (int idx = threadIdx.x; idx < BK * BN; idx += blockDim.x) {
            const int r = idx / BN, c = idx % BN;
            const int64_t gr = k0 + r, gc = col0 + c;
            bs[r * LDB + c] = (gr < k && gc < n) ? b[gr * n + gc] : zero;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> fb[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], as + (wr * 32 + i * 16) * LDA + kk, LDA);
#pragma unroll
            for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(fb[j], bs + kk * LDB + wc * 32 + j * 16, LDB);
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j)
            wmma::store_matrix_sync(cs + (wr * 32 + i * 16) * LDC + wc * 32 + j * 16, acc[i][j], LDC, wmma::mem_row_major);
    __syncthreads();
    for (int idx = threadIdx.x; idx < BM * BN; idx += blockDim.x) {
        const int r = idx / BN, c = idx % BN;
        const int64_t gr = row0 + r, gc = col0 + c;
        if (gr < m && gc < n) out[gr * n + gc] = __float2half(cs[r * LDC + c]);
    }
}

extern "C" void launch(const __half* a, const __half* b, __half* out, int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
    dim3 grid((unsigned)((n + BN - 1) / BN), (unsigned)((m + BM - 1) / BM));
    matmul_f16_wmma<<<grid, 128, 0, stream>>>(a, b, out, m, n, k);
}
