# KernelBench kb/L1/19_ReLU: a tensor handed to the constructor of a module of the file, where
# arguments are sizes, so it could be indexed or computed with there (written for cudarl-pipe's
# tests; the ModelNew allow-list must refuse it before any of it runs).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_ext = load_inline(name="relu_ext", cpp_sources="torch::Tensor relu_forward(torch::Tensor x);", cuda_sources="", functions=["relu_forward"])


class Gather(nn.Module):
    def __init__(self, idx):
        super().__init__()
        self.idx = idx

    def forward(self, x):
        return x[self.idx]


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.g = Gather(torch.tensor([2, 0, 1]))

    def forward(self, x):
        return relu_ext.relu_forward(self.g(x))
