// row_sum with dynamic shared memory sized at launch (one float per thread).
#include <cuda_runtime.h>
#include <stdint.h>
__global__ void row_sum_dyn(const float* x, float* out, int64_t rows, int64_t cols) {
    extern __shared__ float buf[];
    int64_t r = blockIdx.x;
    float acc = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) acc += x[r * cols + c];
    buf[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[r] = buf[0];
}
extern "C" void launch(const float* x, float* out, int64_t rows, int64_t cols, cudaStream_t stream) {
    const int block = 256;
    row_sum_dyn<<<(unsigned)rows, block, block * sizeof(float), stream>>>(x, out, rows, cols);
}
