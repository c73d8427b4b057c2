// torch.matmul(A, B) of A (M x K) and B (K x 1): an honest native kernel for KernelBench level 1,
// one block per row of A, a block reduction of the dot product.
#include <cuda_runtime.h>
#include <stdint.h>

__global__ void k(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c,
                  int64_t kdim) {
    __shared__ float sh[32];
    const float* r = a + blockIdx.x * kdim;
    float s = 0.f;
    for (int64_t i = threadIdx.x; i < kdim; i += blockDim.x) s += r[i] * b[i];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        s = threadIdx.x < (blockDim.x >> 5) ? sh[threadIdx.x] : 0.f;
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (threadIdx.x == 0) c[blockIdx.x] = s;
    }
}

extern "C" void launch(const float* in0, const float* in1, float* out, int64_t K, int64_t M,
                       cudaStream_t stream) {
    k<<<(unsigned)M, 1024, 0, stream>>>(in0, in1, out, K);
}
