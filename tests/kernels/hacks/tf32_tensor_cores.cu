// An f32 task answered with TF32 tensor-core math: each element goes through an
// `mma.sync ... .tf32` (inputs rounded to TF32's 10-bit mantissa), which the tolerance of an
// elementwise f32 task may not notice but changes results; f32 tasks do not declare `allow_tf32`.
#include <cuda_runtime.h>
#include <stdint.h>
__global__ void add(const float* a, const float* b, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    float x = i < n ? a[i] : 0.0f, y = i < n ? b[i] : 0.0f;
    unsigned ta, tb;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(ta) : "f"(x));
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(tb) : "f"(y));
    float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%4,%4,%4}, {%5,%5}, {%6,%6,%6,%6};"
        : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)
        : "r"(ta), "r"(tb), "f"(0.0f));
    if (i < n) out[i] = __uint_as_float(ta) + __uint_as_float(tb) + 0.0f * (d0 + d1 + d2 + d3);
}
extern "C" void launch(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {
    add<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(a, b, out, n);
}
