// Defines `cudaLaunchKernel`: the library exports the CUDA runtime's launch entry point under its
// own name, and every launch that resolves to the library reaches the candidate's code.
#include <cuda_runtime.h>
#include <stdint.h>
extern "C" cudaError_t cudaLaunchKernel(const void* func, dim3 grid, dim3 block, void** args,
                                        size_t shared, cudaStream_t stream) {
    (void)func; (void)grid; (void)block; (void)args; (void)shared; (void)stream;
    return cudaSuccess;
}
__global__ void add(const float* a, const float* b, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
extern "C" void launch(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {
    add<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(a, b, out, n);
}
