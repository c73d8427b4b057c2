// gelu_bf16, naive: one thread per element, computed in float, rounded to bfloat16 once.
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>

__global__ void gelu_bf16_naive(const __nv_bfloat16* x, __nv_bfloat16* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = __bfloat162float(x[i]);
        out[i] = __float2bfloat16(0.5f * v * (1.0f + erff(v * 0.70710678118654752f)));
    }
}

extern "C" void launch(const __nv_bfloat16* x, __nv_bfloat16* out, int64_t n, cudaStream_t stream) {
    const int block = 256;
    int64_t grid = (n + block - 1) / block;
    gelu_bf16_naive<<<(unsigned)grid, block, 0, stream>>>(x, out, n);
}
