#include <cuda_runtime.h>
#include <stdint.h>
// The host launcher dereferences a null pointer.
extern "C" void launch(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {
    volatile int* p = nullptr;
    *p = (int)n;
}
