# KernelBench kb/L1/19_ReLU: list indices disguised by `or` and a conditional expression (advanced
# indexing: gather and mask kernels) (written for cudarl-pipe's tests; the ModelNew allow-list
# must refuse it before any of it runs).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_ext = load_inline(name="relu_ext", cpp_sources="", cuda_sources="", functions=["relu_forward"])


class ModelNew(nn.Module):
    def forward(self, x):
        y = x[:, [2, 0, 1] or 0]
        z = y[[True, False] if 1 else 0]
        return relu_ext.relu_forward(z)
