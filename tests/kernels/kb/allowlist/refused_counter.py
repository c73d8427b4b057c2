# KernelBench kb/L1/19_ReLU: a call counter kept in a module-level list (`c = CALLS or 0; c +=
# [0]`), so later calls skip the work (written for cudarl-pipe's tests; the ModelNew allow-list
# must refuse it before any of it runs).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_ext = load_inline(name="relu_ext", cpp_sources="", cuda_sources="", functions=["relu_forward"])
CALLS = [0]


class ModelNew(nn.Module):
    def forward(self, x):
        c = CALLS or 0
        c += [0]
        if len(CALLS) > 3:
            return torch.zeros_like(x)
        return relu_ext.relu_forward(x)
