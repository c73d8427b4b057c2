// torch.relu: an honest native kernel for KernelBench level 1 (grid-stride elementwise).
#include <cuda_runtime.h>
#include <stdint.h>

__global__ void k(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float v = x[i];
        y[i] = v > 0.f ? v : 0.f;
    }
}

extern "C" void launch(const float* in0, float* out, int64_t batch_size, int64_t dim,
                       cudaStream_t stream) {
    int64_t n = batch_size * dim;
    int blocks = (int)((n + 255) / 256 < 65536 ? (n + 255) / 256 : 65536);
    k<<<blocks, 256, 0, stream>>>(in0, out, n);
}
