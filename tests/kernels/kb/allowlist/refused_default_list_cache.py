# KernelBench kb/L1/19_ReLU: a mutable default argument kept between calls (written for cudarl-
# pipe's tests; the ModelNew allow-list must refuse it before any of it runs).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_ext = load_inline(name="relu_ext", cpp_sources="torch::Tensor relu_forward(torch::Tensor x);", cuda_sources="", functions=["relu_forward"])

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, cache=[]):
        c = max((cache,) if True else 0)
        n = len(c)
        c += (relu_ext.relu_forward(x),) if True else 0
        t = tuple(c)
        return t[0]
