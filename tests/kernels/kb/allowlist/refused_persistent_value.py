# KernelBench kb/L1/19_ReLU: code hidden in the value of a keyword that names no value of the
# allow-list's (written for cudarl-pipe's tests; the ModelNew allow-list must refuse it before
# any of it runs).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_ext = load_inline(name="relu_ext", cpp_sources="torch::Tensor relu_forward(torch::Tensor x);", cuda_sources="", functions=["relu_forward"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("b", None, persistent=len(range(3)) > 0)

    def forward(self, x):
        return relu_ext.relu_forward(x)
