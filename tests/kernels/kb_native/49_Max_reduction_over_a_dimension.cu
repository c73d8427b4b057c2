// torch.max(x, dim=1)[0] over x (batch_size, dim1, dim2): an honest native kernel for
// KernelBench level 1, one thread per output element, reading along dim1 coalesced across dim2.
#include <cuda_runtime.h>
#include <stdint.h>

__global__ void k(const float* __restrict__ x, float* __restrict__ y, int64_t b, int64_t d1,
                  int64_t d2) {
    int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (t >= b * d2) return;
    int64_t bi = t / d2, j = t % d2;
    const float* p = x + bi * d1 * d2 + j;
    float s = p[0];
    for (int64_t i = 1; i < d1; ++i) {
        float v = p[i * d2];
        s = (v > s || v != v) ? v : s;  // NaN propagates, as in torch.max
    }
    y[t] = s;
}

extern "C" void launch(const float* in0, float* out, int64_t batch_size, int64_t dim1,
                       int64_t dim2, cudaStream_t stream) {
    int64_t n = batch_size * dim2;
    k<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(in0, out, batch_size, dim1, dim2);
}
