# KernelBench kb/L1/19_ReLU: calls at import and modules passed to the extension (written for
# cudarl-pipe's tests; the ModelNew allow-list must refuse it before any of it runs).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_ext = load_inline(name="relu_ext", cpp_sources="torch::Tensor relu_forward(torch::Tensor x);", cuda_sources="", functions=["relu_forward"])

def warm():
    return relu_ext.relu_forward(torch.ones(3))


N = len(warm())
M = len(torch.empty(2, 3))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return relu_ext.relu_forward(x, torch, self, nn)
