// An IFUNC resolver runs when the library is loaded.
#include <cuda_runtime.h>
#include <stdint.h>
extern "C" { static int impl() { return 0; } static void* resolve() { return (void*)impl; } int chosen() __attribute__((ifunc("resolve"))); }
__global__ void add(const float* a, const float* b, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
extern "C" void launch(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {
    (void)chosen;
    add<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(a, b, out, n);
}
