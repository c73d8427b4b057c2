// matmul_bias_relu, naive: one thread per output element, a sequential dot product over k and the bias+relu epilogue.
#include <cuda_runtime.h>
#include <stdint.h>
#include <math.h>

__global__ void matmul_bias_relu_naive(const float* a, const float* b, const float* bias, float* out, int64_t m, int64_t n, int64_t k) {
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t r = (int64_t)blockIdx.y * blockDim.y + threadIdx.y;
    if (r >= m || c >= n) return;
    float v = 0.0f;
    for (int64_t i = 0; i < k; ++i) v += a[r * k + i] * b[i * n + c];
    v = fmaxf(v + bias[c], 0.0f);
    out[r * n + c] = v;
}

extern "C" void launch(const float* a, const float* b, const float* bias, float* out, int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
    dim3 block(16, 16);
    dim3 grid((unsigned)((n + 15) / 16), (unsigned)((m + 15) / 16));
    matmul_bias_relu_naive<<<grid, block, 0, stream>>>(a, b, bias, out, m, n, k);
}
