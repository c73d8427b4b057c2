# A ModelNew built from a module of its own (an nn.Module whose forward calls the extension) and
# an extension function returning two tensors, written for cudarl-pipe's tests: layer-norm
# weights held by nn.LayerNorm, a buffer, loops over sizes, views of the outputs.
import torch
from torch import nn
from torch.utils.cpp_extension import load_inline

src = """
#include <torch/extension.h>
#include <vector>
__global__ void ln(const float* x, float* y, float* stats, int rows, int cols) {}
std::vector<torch::Tensor> ln_stats(torch::Tensor x, torch::Tensor w, torch::Tensor b, double eps) {
    return {torch::empty_like(x), torch::empty({x.size(0), 2}, x.options())};
}
"""

ext = load_inline(name="ln_stats", cpp_sources="", cuda_sources=src, functions=["ln_stats"])


class FusedNorm(nn.Module):
    def __init__(self, features, eps=1e-5):
        super().__init__()
        self.norm = nn.LayerNorm(features, eps=eps)
        self.register_buffer("scale", torch.ones(features))

    def forward(self, x):
        rows = 1
        for d in range(x.dim() - 1):
            rows = rows * x.size(d)
        flat = x.reshape(rows, x.shape[-1])
        y, stats = ext.ln_stats(flat, self.norm.weight, self.norm.bias, self.norm.eps)
        return y.view_as(x), stats


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.inner = FusedNorm(features)

    def forward(self, x):
        y, _ = self.inner(x)
        return y
