#include <cuda_runtime.h>
#include <stdint.h>
// Never finishes: spins until the (poisoned, NaN) output equals a number, which never happens.
__global__ void k(const float* a, const float* b, float* out, int64_t n) {
    volatile float* p = out;
    while (p[0] != 123456.0f) { }
    out[0] = a[0] + b[0];
}
extern "C" void launch(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {
    k<<<1, 32, 0, stream>>>(a, b, out, n);
}
