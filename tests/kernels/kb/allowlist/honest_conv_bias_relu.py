# A ModelNew for a conv + bias + ReLU problem, written for cudarl-pipe's tests: the constructor
# makes the same parameter holders as the reference (nn.Conv2d, nn.Parameter), forward reads their
# weights, does size arithmetic and calls the file's own extension; its own helper method and
# an imported `math` constant. Every construct is on the allow-list.
import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = r"""
#include <torch/extension.h>
__global__ void conv_bias_relu(const float* x, const float* w, const float* b, float* y, int n) {}
torch::Tensor forward_cuda(torch::Tensor x, torch::Tensor w, torch::Tensor b, int64_t stride) {
    auto y = torch::empty({x.size(0), w.size(0), x.size(2), x.size(3)}, x.options());
    return y;
}
"""
cpp_src = "torch::Tensor forward_cuda(torch::Tensor x, torch::Tensor w, torch::Tensor b, int64_t stride);"

_ext = load_inline(
    name="conv_bias_relu",
    cpp_sources=cpp_src,
    cuda_sources=cuda_src,
    functions=["forward_cuda"],
    extra_cuda_cflags=["-O3", "--use_fast_math"],
    verbose=False,
)

SCALE = 1.0 / math.sqrt(2.0)


class ModelNew(nn.Module):
    """Conv2d, then a bias, then ReLU, in one kernel."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, bias_shape: tuple):
        super(ModelNew, self).__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape) * 0.02)
        self.stride = 1
        self.block = 256
        nn.init.kaiming_uniform_(self.conv.weight, a=math.sqrt(5))

    def check_input(self, x: torch.Tensor) -> None:
        if x.dim() != 4 or x.dtype != torch.float32:
            raise ValueError(f"expected a 4-D float32 input, got {x.dim()}-D {x.dtype}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        n, c, h, w = x.shape
        k = self.conv.kernel_size[0]
        out_h, out_w = (h - k) // self.stride + 1, (w - k) // self.stride + 1
        assert out_h > 0 and out_w > 0, "the kernel is larger than the input"
        x = x.contiguous()
        y = _ext.forward_cuda(x, self.conv.weight, self.bias.view(-1), self.stride)
        return y.view(n, -1, out_h, out_w)


def get_inputs():
    return [torch.randn(8, 3, 32, 32)]
