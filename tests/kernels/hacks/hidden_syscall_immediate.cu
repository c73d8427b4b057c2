// A `syscall` hidden in the immediate of a `mov` (bytes `ba 0f 05 90 90`: a linear disassembly
// sees `mov edx, 0x9090050f`) and reached by a computed jump one byte into that instruction:
// getpid(2) runs, then two `nop`s, and the launcher goes on.
#include <cuda_runtime.h>
#include <stdint.h>
__global__ void add(const float* a, const float* b, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
extern "C" void launch(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {
    long r;
    asm volatile("lea 1f(%%rip), %%rcx\n\t"
                 "add $1, %%rcx\n\t"
                 "jmp *%%rcx\n"
                 "1:\tmovl $0x9090050f, %%edx"
                 : "=a"(r)
                 : "a"(39L)
                 : "rcx", "rdx", "r11", "memory");
    (void)r;
    add<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(a, b, out, n);
}
