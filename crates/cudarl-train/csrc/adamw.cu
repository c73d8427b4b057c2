// One AdamW step of a bf16 parameter with float32 or bf16 moments, or of a float32 parameter
// with float32 moments, in one pass over memory: what `adamw.rs`'s libtorch path computes in
// about fifteen elementwise kernels (about 150 bytes of traffic a bf16 parameter, 108 a float32
// one), here 22 bytes a parameter with float32 moments (gradient 2, parameter 2 + 2, moments
// 8 + 8), 14 with bf16 moments (moments 4 + 4) and 28 for float32 throughout. The arithmetic
// follows that path operation for operation, in float32:
//
//   m  <- m + (1 - b1) (g - m)                      (lerp)
//   v  <- v b2 + g (g (1 - b2))                     (mul, addcmul)
//   d  <- (sqrt(v) / sqrt(1 - b2^t) + eps) * (-(1 - b1^t) / lr)
//   x' <- x (1 - lr wd) + m / d
//
// and a bf16 x' (and bf16 moments) are rounded to bf16 stochastically (Gupta et al. 2015): 16 random
// low bits added to the float32 pattern, then cut. The bits come from splitmix64 (Steele et al.
// 2014) of the step's seed and the element's index (bits 48-63 for the parameter, 32-47 for m,
// 16-31 for v), so a step is a pure function of its seed. The Kahan entry point rounds x' to
// nearest instead and keeps what the rounding lost in a bf16 buffer c added to the next step
// (Kahan 1965): w = (x' - x) + c, r = bf16(x + w), c <- bf16(w - (r - x)), x <- r.
//
// Built by build.rs with nvcc into a fatbin that `fused_adamw.rs` loads with the CUDA driver API.

#include <cuda_bf16.h>
#include <stdint.h>

__device__ __forceinline__ uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// x rounded to bf16 with the 16 random bits `noise`.
__device__ __forceinline__ __nv_bfloat16 round_stochastic(float x, uint32_t noise) {
  uint32_t bits = (__float_as_uint(x) + noise) & 0xffff0000u;
  return __ushort_as_bfloat16((unsigned short)(bits >> 16));
}

__device__ __forceinline__ float load(const float* p, long long i) { return p[i]; }
__device__ __forceinline__ float load(const __nv_bfloat16* p, long long i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ void store(float* p, long long i, float x, uint32_t) { p[i] = x; }
__device__ __forceinline__ void store(__nv_bfloat16* p, long long i, float x, uint32_t noise) {
  p[i] = round_stochastic(x, noise);
}

// The moments' update in place (float32) and the step's divisor d, so that the new weight is
// x (1 - lr wd) + m / d (the formula above).
__device__ __forceinline__ float moments(float g, float& m, float& v, float one_minus_b1,
                                         float b2, float one_minus_b2, float bc2_sqrt, float eps,
                                         float neg_bc1_over_lr) {
  m = m + one_minus_b1 * (g - m);
  v = v * b2 + g * (g * one_minus_b2);
  return (sqrtf(v) / bc2_sqrt + eps) * neg_bc1_over_lr;
}

template <typename P, typename M>
__device__ __forceinline__ void adamw_step(
    P* __restrict__ param, const P* __restrict__ grad,
    M* __restrict__ exp_avg, M* __restrict__ exp_avg_sq, long long n, float one_minus_b1,
    float b2, float one_minus_b2, float bc2_sqrt, float eps, float neg_bc1_over_lr, float decay,
    unsigned long long seed) {
  long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float g = load(grad, i), m = load(exp_avg, i), v = load(exp_avg_sq, i);
    float d = moments(g, m, v, one_minus_b1, b2, one_minus_b2, bc2_sqrt, eps, neg_bc1_over_lr);
    uint64_t r = splitmix64(seed ^ (uint64_t)i);
    store(exp_avg, i, m, (uint32_t)(r >> 32) & 0xffffu);
    store(exp_avg_sq, i, v, (uint32_t)(r >> 16) & 0xffffu);
    float x = load(param, i) * decay + m / d;
    store(param, i, x, (uint32_t)(r >> 48));
  }
}

extern "C" __global__ void cudarl_adamw_bf16_stochastic(
    __nv_bfloat16* __restrict__ param, const __nv_bfloat16* __restrict__ grad,
    float* __restrict__ exp_avg, float* __restrict__ exp_avg_sq, long long n, float one_minus_b1,
    float b2, float one_minus_b2, float bc2_sqrt, float eps, float neg_bc1_over_lr, float decay,
    unsigned long long seed) {
  adamw_step(param, grad, exp_avg, exp_avg_sq, n, one_minus_b1, b2, one_minus_b2, bc2_sqrt, eps,
             neg_bc1_over_lr, decay, seed);
}

extern "C" __global__ void cudarl_adamw_bf16_stochastic_bf16_moments(
    __nv_bfloat16* __restrict__ param, const __nv_bfloat16* __restrict__ grad,
    __nv_bfloat16* __restrict__ exp_avg, __nv_bfloat16* __restrict__ exp_avg_sq, long long n,
    float one_minus_b1, float b2, float one_minus_b2, float bc2_sqrt, float eps,
    float neg_bc1_over_lr, float decay, unsigned long long seed) {
  adamw_step(param, grad, exp_avg, exp_avg_sq, n, one_minus_b1, b2, one_minus_b2, bc2_sqrt, eps,
             neg_bc1_over_lr, decay, seed);
}

extern "C" __global__ void cudarl_adamw_f32(
    float* __restrict__ param, const float* __restrict__ grad, float* __restrict__ exp_avg,
    float* __restrict__ exp_avg_sq, long long n, float one_minus_b1, float b2,
    float one_minus_b2, float bc2_sqrt, float eps, float neg_bc1_over_lr, float decay,
    unsigned long long seed) {
  adamw_step(param, grad, exp_avg, exp_avg_sq, n, one_minus_b1, b2, one_minus_b2, bc2_sqrt, eps,
             neg_bc1_over_lr, decay, seed);
}

extern "C" __global__ void cudarl_adamw_bf16_kahan(
    __nv_bfloat16* __restrict__ param, const __nv_bfloat16* __restrict__ grad,
    float* __restrict__ exp_avg, float* __restrict__ exp_avg_sq, long long n, float one_minus_b1,
    float b2, float one_minus_b2, float bc2_sqrt, float eps, float neg_bc1_over_lr, float decay,
    unsigned long long, __nv_bfloat16* __restrict__ comp) {
  long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float g = load(grad, i), m = exp_avg[i], v = exp_avg_sq[i];
    float d = moments(g, m, v, one_minus_b1, b2, one_minus_b2, bc2_sqrt, eps, neg_bc1_over_lr);
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    float x = load(param, i);
    float wanted = (x * decay + m / d - x) + __bfloat162float(comp[i]);
    __nv_bfloat16 r = __float2bfloat16_rn(x + wanted);
    comp[i] = __float2bfloat16_rn(wanted - (__bfloat162float(r) - x));
    param[i] = r;
  }
}
