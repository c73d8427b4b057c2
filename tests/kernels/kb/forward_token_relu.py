# KernelBench kb/L1/19_ReLU: a token kernel launch beside plain torch.relu, which does the work
# (written for cudarl-pipe's tests; must be flagged torch_op_stands_in from the kernels that ran).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = r"""
#include <ATen/cuda/CUDAContext.h>
__global__ void token_kernel(float* t) {
    if (threadIdx.x == 0) t[0] = 1.0f;
}

torch::Tensor touch(torch::Tensor x) {
    auto t = torch::empty({1}, x.options());
    token_kernel<<<1, 32, 0, at::cuda::getCurrentCUDAStream()>>>(t.data_ptr<float>());
    return t;
}
"""

token_ext = load_inline(
    name="token_ext",
    cpp_sources="torch::Tensor touch(torch::Tensor x);",
    cuda_sources=cuda_src,
    functions=["touch"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        token_ext.touch(x)
        return torch.relu(x)
