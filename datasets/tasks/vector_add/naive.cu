// vector_add, naive: one thread per element, grid-stride free.
#include <cuda_runtime.h>
#include <stdint.h>

__global__ void vector_add_naive(const float* a, const float* b, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = a[i] + b[i];
    }
}

extern "C" void launch(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {
    const int block = 256;
    int64_t grid = (n + block - 1) / block;
    vector_add_naive<<<(unsigned)grid, block, 0, stream>>>(a, b, out, n);
}
