// matmul_f16, naive: one thread per output element, a sequential float dot product over k.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <stdint.h>

__global__ void matmul_f16_naive(const __half* a, const __half* b, __half* out, int64_t m, int64_t n, int64_t k) {
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t r = (int64_t)blockIdx.y * blockDim.y + threadIdx.y;
    if (r >= m || c >= n) return;
    float v = 0.0f;
    for (int64_t i = 0; i < k; ++i) v += __half2float(a[r * k + i]) * __half2float(b[i * n + c]);
    out[r * n + c] = __float2half(v);
}

extern "C" void launch(const __half* a, const __half* b, __half* out, int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
    dim3 block(16, 16);
    dim3 grid((unsigned)((n + 15) / 16), (unsigned)((m + 15) / 16));
    matmul_f16_naive<<<grid, block, 0, stream>>>(a, b, out, m, n, k);
}
