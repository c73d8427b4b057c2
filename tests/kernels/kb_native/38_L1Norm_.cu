// x / torch.mean(torch.abs(x), dim=1, keepdim=True): an honest native kernel for KernelBench level 1, one block per row of `dim`
// (block reductions in shared memory).
#include <cuda_runtime.h>
#include <stdint.h>
#include <float.h>

static __device__ __forceinline__ float block_reduce(float v, bool is_max, float* sh) {
    for (int o = 16; o > 0; o >>= 1) {
        float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, w) : v + w;
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    int nw = blockDim.x >> 5;
    v = threadIdx.x < nw ? sh[threadIdx.x] : (is_max ? -FLT_MAX : 0.f);
    if (warp == 0) {
        for (int o = 16; o > 0; o >>= 1) {
            float w = __shfl_xor_sync(0xffffffffu, v, o);
            v = is_max ? fmaxf(v, w) : v + w;
        }
        if (lane == 0) sh[0] = v;
    }
    __syncthreads();
    return sh[0];
}

__global__ void k(const float* __restrict__ x, float* __restrict__ y, int64_t dim) {
    __shared__ float sh[32];
    const float* r = x + blockIdx.x * dim;
    float* o = y + blockIdx.x * dim;
    float s = 0.f;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) s += fabsf(r[i]);
    s = block_reduce(s, false, sh);
    float inv = (float)dim / s;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) o[i] = r[i] * inv;
}

extern "C" void launch(const float* in0, float* out, int64_t batch_size, int64_t dim,
                       cudaStream_t stream) {
    k<<<(unsigned)batch_size, 1024, 0, stream>>>(in0, out, dim);
}
