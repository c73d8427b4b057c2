# KernelBench kb/L1/19_ReLU: a tensor hidden in an nn layer's setting
# (`nn.ELU(alpha=torch.tensor(...))`) and used as an index (a gather) (written for cudarl-pipe's
# tests; the ModelNew allow-list must refuse it before any of it runs).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_ext = load_inline(name="relu_ext", cpp_sources="", cuda_sources="", functions=["relu_forward"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = nn.ELU(alpha=torch.tensor([2, 0, 1]))

    def forward(self, x):
        k = self.act.alpha + 0
        y = x[:, k]
        c = self.act.alpha[0]
        c += 1
        return relu_ext.relu_forward(y)
