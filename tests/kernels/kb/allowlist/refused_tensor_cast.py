# KernelBench kb/L1/19_ReLU: torch.tensor of a tensor (a cast and copy) (written for cudarl-pipe's
# tests; the ModelNew allow-list must refuse it before any of it runs).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_ext = load_inline(name="relu_ext", cpp_sources="torch::Tensor relu_forward(torch::Tensor x);", cuda_sources="", functions=["relu_forward"])

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        h = torch.tensor(x, dtype=torch.float16)
        m = torch.tensor(x, dtype=torch.bool)
        return relu_ext.relu_forward(h)
