// A host thread that outlives the launch.
#include <cuda_runtime.h>
#include <stdint.h>
extern "C" int pthread_create(void*, const void*, void* (*)(void*), void*);
static void* spin(void*) { for (;;) {} return 0; }
__global__ void add(const float* a, const float* b, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
extern "C" void launch(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {
    unsigned long t; pthread_create(&t, 0, spin, 0);
    add<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(a, b, out, n);
}
