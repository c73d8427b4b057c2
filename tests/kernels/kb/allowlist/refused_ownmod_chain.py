# KernelBench kb/L1/19_ReLU: a chain of own modules whose forwards are torch modules' forwards
# (written for cudarl-pipe's tests; the ModelNew allow-list must refuse it before any of it runs).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_ext = load_inline(name="relu_ext", cpp_sources="torch::Tensor relu_forward(torch::Tensor x);", cuda_sources="", functions=["relu_forward"])

class Wrap(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = nn.Softplus()
        self.forward = self.act.forward


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = Wrap()
        self.b = Wrap()
        self.b.forward = nn.ReLU().forward

    def forward(self, x):
        return self.b(self.a(x))
