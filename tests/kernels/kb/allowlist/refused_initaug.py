# KernelBench kb/L1/19_ReLU: an augmented assignment in __init__ that makes a tensor look like a
# number, later an index (written for cudarl-pipe's tests; the ModelNew allow-list must refuse it
# before any of it runs).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

ext = load_inline(name="e", cpp_sources="", cuda_sources="", functions=["f"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        n = 0
        n += torch.tensor([1, 0, 2])
        self.idx = n

    def forward(self, x):
        return ext.f(x[:, self.idx])
