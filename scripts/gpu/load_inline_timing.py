"""Times torch.utils.cpp_extension.load_inline on the vector_add kernel (cold build in a fresh
directory) and checks the result, for comparison with the native nvcc path. Prints JSON."""

import json
import tempfile
import time

import torch
from torch.utils.cpp_extension import load_inline

cuda_src = r"""
#include <torch/extension.h>
__global__ void add_kernel(const float* a, const float* b, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
torch::Tensor vector_add(torch::Tensor a, torch::Tensor b) {
    auto out = torch::empty_like(a);
    int64_t n = a.numel();
    add_kernel<<<(n + 255) / 256, 256>>>(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""
cpp_src = "torch::Tensor vector_add(torch::Tensor a, torch::Tensor b);"
with tempfile.TemporaryDirectory() as d:
    t0 = time.perf_counter()
    mod = load_inline(
        name="cudarl_va",
        cpp_sources=cpp_src,
        cuda_sources=cuda_src,
        functions=["vector_add"],
        build_directory=d,
        extra_cuda_cflags=["-O3", "-gencode=arch=compute_90,code=sm_90"],
        verbose=False,
    )
    build = time.perf_counter() - t0
    a = torch.randn(1 << 20, device="cuda")
    b = torch.randn(1 << 20, device="cuda")
    ok = bool(torch.allclose(mod.vector_add(a, b), a + b))
print(json.dumps({"build_s": build, "correct": ok, "torch": torch.__version__}))
