# A ModelNew that allocates its output with tensor creation and passes sizes computed from
# shapes to an extension that writes into it, written for cudarl-pipe's tests.
import torch
import torch.nn as nn
import torch.nn.functional as F  # noqa: F401 (imported, never used)
import torch.utils.cpp_extension as cpp_extension

K = 4096
kernel = r"""
#include <torch/extension.h>
__global__ void rowsum(const float* x, float* y, long rows, long cols) {}
void rowsum_into(torch::Tensor x, torch::Tensor y, int64_t rows, int64_t cols) {}
"""
mod = cpp_extension.load_inline(
    name="rowsum_into", cpp_sources="", cuda_sources=kernel, functions=["rowsum_into"]
)


class ModelNew(nn.Module):
    def __init__(self, dim: int = 1):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows, cols = x.size(0), x.numel() // x.size(0)
        out = torch.empty((rows, 1), device=x.device, dtype=x.dtype)
        mod.rowsum_into(x.contiguous(), out, rows, min(cols, K * K))
        return out if self.dim == 1 else out.squeeze(-1)
