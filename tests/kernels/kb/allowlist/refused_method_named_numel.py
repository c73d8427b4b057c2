# KernelBench kb/L1/19_ReLU: an own method named like a shape method, self passed as an argument
# (written for cudarl-pipe's tests; the ModelNew allow-list must refuse it before any of it runs).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_ext = load_inline(name="relu_ext", cpp_sources="torch::Tensor relu_forward(torch::Tensor x);", cuda_sources="", functions=["relu_forward"])

def launder(m, x):
    y = m.numel(x)
    return y * (y > 0)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def numel(self, x):
        return x

    def forward(self, x):
        return launder(self, x)
