// Reads %globaltimer with __asm__ __volatile__ (not `asm volatile(`).
#include <cuda_runtime.h>
#include <stdint.h>
__global__ void tk(long long* t) { long long v; __asm__ __volatile__("mov.u64 %0, %%globaltimer;" : "=l"(v)); *t = v; }
__global__ void add(const float* a, const float* b, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
extern "C" void launch(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {

    add<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(a, b, out, n);
}
