// A function placed in a data section: the compiler marks the section executable, and the linker
// puts it among the writable data, so the library's data pages become writable code.
#include <cuda_runtime.h>
#include <stdint.h>
__attribute__((section(".data.fast"), noinline)) static int helper(int x) { return x + 1; }
__global__ void add(const float* a, const float* b, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
extern "C" void launch(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {
    volatile int k = helper(1);
    (void)k;
    add<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(a, b, out, n);
}
