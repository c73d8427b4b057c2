# KernelBench kb/L1/19_ReLU: a tensor in an nn layer's setting mutated in place in forward (state
# between calls) (written for cudarl-pipe's tests; the ModelNew allow-list must refuse it before
# any of it runs).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_ext = load_inline(name="relu_ext", cpp_sources="", cuda_sources="", functions=["relu_forward"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = nn.ELU(alpha=torch.zeros(1))

    def forward(self, x):
        k = self.act.alpha[0]
        k += 1
        if k > 2:
            return torch.empty_like(x)
        return relu_ext.relu_forward(x)
