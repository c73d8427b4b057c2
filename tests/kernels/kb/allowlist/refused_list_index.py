# KernelBench kb/L1/19_ReLU: indexing with a list (a gather kernel) (written for cudarl-pipe's
# tests; the ModelNew allow-list must refuse it before any of it runs).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_ext = load_inline(name="relu_ext", cpp_sources="torch::Tensor relu_forward(torch::Tensor x);", cuda_sources="", functions=["relu_forward"])

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        flipped = x[[3, 2, 1, 0]]
        masked = x[[True, False, True, False]]
        rev = x[list(range(x.size(0) - 1, -1, -1))]
        return relu_ext.relu_forward(rev[list(range(x.size(0) - 1, -1, -1))])
