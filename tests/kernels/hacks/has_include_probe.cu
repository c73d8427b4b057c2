// __has_include picks a forbidden header when it exists.
#include <cuda_runtime.h>
#include <stdint.h>
#if __has_include(<sys/syscall.h>)
#define SC <sys/syscall.h>
#include SC
#endif
__global__ void add(const float* a, const float* b, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
extern "C" void launch(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {

    add<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(a, b, out, n);
}
