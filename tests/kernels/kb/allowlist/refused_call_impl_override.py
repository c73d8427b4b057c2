# KernelBench kb/L1/19_ReLU: _call_impl replaced in __init__ (written for cudarl-pipe's tests; the
# ModelNew allow-list must refuse it before any of it runs).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_ext = load_inline(name="relu_ext", cpp_sources="torch::Tensor relu_forward(torch::Tensor x);", cuda_sources="", functions=["relu_forward"])

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = nn.ReLU()
        self._call_impl = self.act.forward

    def forward(self, x):
        return relu_ext.relu_forward(x)
