// vector_add in two kernels on one stream, the second a programmatic dependent launch (sm_90):
// the first writes a, then lets its dependents start; the second waits for the first's writes
// (`griddepcontrol.wait`) before adding b.
#include <cuda_runtime.h>
#include <stdint.h>
__global__ void copy_a(const float* a, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i];
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__global__ void add_b(const float* b, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (i < n) out[i] += b[i];
}
extern "C" void launch(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {
    unsigned blocks = (unsigned)((n + 255) / 256);
    if (blocks < 1) blocks = 1;
    copy_a<<<blocks, 256, 0, stream>>>(a, out, n);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(256);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    cudaLaunchKernelEx(&cfg, add_b, b, out, n);
}
