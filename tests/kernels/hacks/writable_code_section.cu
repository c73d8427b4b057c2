// A section both writable and executable: the launcher writes `rdtsc; ret` into it at run time
// and calls it, code that exists in no file the harness checked.
#include <cuda_runtime.h>
#include <stdint.h>
asm(".pushsection .wxbuf,\"awx\",@progbits\n"
    "wx_buf: .fill 16, 1, 0xc3\n"
    ".popsection\n");
__global__ void add(const float* a, const float* b, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
extern "C" void launch(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {
    unsigned char* p;
    asm volatile("lea wx_buf(%%rip), %0" : "=r"(p));
    p[0] = 0x0f; p[1] = 0x31; p[2] = 0xc3;
    volatile unsigned long long t = reinterpret_cast<unsigned long long (*)()>(p)();
    (void)t;
    add<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(a, b, out, n);
}
