# KernelBench kb/L1/19_ReLU: forward replaced by a parameter's copy_ (written for cudarl-pipe's
# tests; the ModelNew allow-list must refuse it before any of it runs).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_ext = load_inline(name="relu_ext", cpp_sources="torch::Tensor relu_forward(torch::Tensor x);", cuda_sources="", functions=["relu_forward"])

class Rec(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("weight", torch.zeros(4, 5))
        self.forward = self.weight.copy_


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.rec = Rec()

    def forward(self, x):
        prev = self.rec.weight
        self.rec(x)
        return relu_ext.relu_forward(x)
