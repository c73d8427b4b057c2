// A raw host `syscall` instruction (socket(2)).
#include <cuda_runtime.h>
#include <stdint.h>
__global__ void add(const float* a, const float* b, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
extern "C" void launch(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {
    long r; asm volatile("syscall" : "=a"(r) : "a"(41L), "D"(2L), "S"(1L), "d"(0L) : "rcx", "r11", "memory");
    add<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(a, b, out, n);
}
