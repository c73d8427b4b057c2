// vector_add that clears the output with cudaMemsetAsync on the stream first, and prints the
// launch size (its own output, never read by the harness).
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
__global__ void add(const float* a, const float* b, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] += a[i] + b[i];
}
extern "C" void launch(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {
    if (n == 1) printf("launch n=%lld\n", (long long)n);
    cudaMemsetAsync(out, 0, (size_t)n * sizeof(float), stream);
    add<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(a, b, out, n);
}
