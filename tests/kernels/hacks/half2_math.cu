// An f32 task computed in packed half precision: the inputs rounded to `__half2` pairs, added
// with `__hadd2` (PTX `add.f16x2`), and widened back; twice the elementwise throughput of f32
// and a relative error of about 1e-3, within a loose tolerance on small sums.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <stdint.h>
__global__ void add_half2(const float* a, const float* b, float* out, int64_t n) {
    int64_t i = 2 * ((int64_t)blockIdx.x * blockDim.x + threadIdx.x);
    if (i + 1 < n) {
        __half2 x = __floats2half2_rn(a[i], a[i + 1]);
        __half2 y = __floats2half2_rn(b[i], b[i + 1]);
        float2 s = __half22float2(__hadd2(x, y));
        out[i] = s.x;
        out[i + 1] = s.y;
    } else if (i < n) {
        out[i] = a[i] + b[i];
    }
}
extern "C" void launch(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {
    int64_t pairs = (n + 1) / 2;
    add_half2<<<(unsigned)((pairs + 255) / 256), 256, 0, stream>>>(a, b, out, n);
}
