// torch.matmul(A, B) of two N x N matrices: an honest native kernel for KernelBench level 1,
// 32 x 32 shared-memory tiles, one output element per thread.
#include <cuda_runtime.h>
#include <stdint.h>

#define T 32

__global__ void k(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c,
                  int64_t n) {
    __shared__ float as[T][T], bs[T][T + 1];
    int64_t row = blockIdx.y * T + threadIdx.y, col = blockIdx.x * T + threadIdx.x;
    float s = 0.f;
    for (int64_t t0 = 0; t0 < n; t0 += T) {
        as[threadIdx.y][threadIdx.x] = (row < n && t0 + threadIdx.x < n) ? a[row * n + t0 + threadIdx.x] : 0.f;
        bs[threadIdx.y][threadIdx.x] = (col < n && t0 + threadIdx.y < n) ? b[(t0 + threadIdx.y) * n + col] : 0.f;
        __syncthreads();
#pragma unroll
        for (int i = 0; i < T; ++i) s += as[threadIdx.y][i] * bs[i][threadIdx.x];
        __syncthreads();
    }
    if (row < n && col < n) c[row * n + col] = s;
}

extern "C" void launch(const float* in0, const float* in1, float* out, int64_t N,
                       cudaStream_t stream) {
    dim3 block(T, T), grid((unsigned)((N + T - 1) / T), (unsigned)((N + T - 1) / T));
    k<<<grid, block, 0, stream>>>(in0, in1, out, N);
}
