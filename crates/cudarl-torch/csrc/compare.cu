// The judge's comparison of one output buffer with its float64 reference in one pass
// (`crates/cudarl-torch/src/compare.rs` launches it; its `torch_stats` is the same arithmetic
// as libtorch ops, kept as the fallback and as the test's oracle). Per element `i` of
// `n`, with `g` the candidate's value read from its raw bits `got[i]`:
//   unwritten   += got[i] == poison (the bit pattern)
//   non_finite  += !isfinite(g)                 (the caller subtracts `unwritten`)
//   d            = isfinite(g) ? |double(g) - ref[i]| : 0, then 0 where that is NaN or infinite
//   bad         += d > mag[i] * rtol + atol      (two roundings, as two libtorch ops give)
//   max_abs      = max(max_abs, d)
//   max_rel      = max(max_rel, d / max(|ref[i]|, 1e-12)), NaN when |ref[i]| is NaN
// out[0..3] are the counts, out[3..5] the bit patterns of the maxima (non-negative doubles and
// NaN, whose patterns order as unsigned integers the way the values do; zeroed by the caller).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

__device__ __forceinline__ float to_float(uint32_t b) { return __uint_as_float(b); }
__device__ __forceinline__ float to_float_f16(uint16_t b) { return __half2float(__ushort_as_half(b)); }
__device__ __forceinline__ float to_float_bf16(uint16_t b) {
    return __bfloat162float(__ushort_as_bfloat16(b));
}

struct Acc {
    unsigned long long unwritten, non_finite, bad, max_abs, max_rel;
};

__device__ __forceinline__ void element(float g, bool unwritten, double r, double m, double rtol,
                                        double atol, Acc& a) {
    a.unwritten += unwritten;
    bool fin = isfinite(g);
    a.non_finite += !fin;
    double d = 0.0;
    if (fin) {
        d = fabs(__dsub_rn((double)g, r));
        if (!isfinite(d)) d = 0.0;
    }
    double tol = __dadd_rn(__dmul_rn(m, rtol), atol);
    a.bad += d > tol;
    unsigned long long db = (unsigned long long)__double_as_longlong(d);
    a.max_abs = db > a.max_abs ? db : a.max_abs;
    double den = fabs(r);
    if (!isnan(den)) den = fmax(den, 1e-12);
    unsigned long long rb = (unsigned long long)__double_as_longlong(__ddiv_rn(d, den));
    // A NaN with the sign bit set orders above every non-negative double too.
    a.max_rel = rb > a.max_rel ? rb : a.max_rel;
}

__device__ __forceinline__ void reduce(Acc a, unsigned long long* out) {
    for (int o = 16; o > 0; o >>= 1) {
        a.unwritten += __shfl_down_sync(0xffffffffu, a.unwritten, o);
        a.non_finite += __shfl_down_sync(0xffffffffu, a.non_finite, o);
        a.bad += __shfl_down_sync(0xffffffffu, a.bad, o);
        unsigned long long x = __shfl_down_sync(0xffffffffu, a.max_abs, o);
        a.max_abs = x > a.max_abs ? x : a.max_abs;
        x = __shfl_down_sync(0xffffffffu, a.max_rel, o);
        a.max_rel = x > a.max_rel ? x : a.max_rel;
    }
    if ((threadIdx.x & 31) == 0) {
        if (a.unwritten) atomicAdd(&out[0], a.unwritten);
        if (a.non_finite) atomicAdd(&out[1], a.non_finite);
        if (a.bad) atomicAdd(&out[2], a.bad);
        if (a.max_abs) atomicMax(&out[3], a.max_abs);
        if (a.max_rel) atomicMax(&out[4], a.max_rel);
    }
}

#define COMPARE(NAME, BITS, CONVERT)                                                             \
    extern "C" __global__ void NAME(const BITS* got, const double* ref, const double* mag,      \
                                    long long n, BITS poison, double rtol, double atol,          \
                                    unsigned long long* out) {                                   \
        Acc a = {0, 0, 0, 0, 0};                                                                 \
        long long stride = (long long)gridDim.x * blockDim.x;                                    \
        for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) { \
            BITS b = got[i];                                                                     \
            element(CONVERT(b), b == poison, ref[i], mag[i], rtol, atol, a);                     \
        }                                                                                        \
        reduce(a, out);                                                                          \
    }

COMPARE(cudarl_compare_f32, uint32_t, to_float)
COMPARE(cudarl_compare_f16, uint16_t, to_float_f16)
COMPARE(cudarl_compare_bf16, uint16_t, to_float_bf16)
