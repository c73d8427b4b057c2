# KernelBench kb/L1/19_ReLU: a name rebound across branches to reach torch.os (written for cudarl-
# pipe's tests; the ModelNew allow-list must refuse it before any of it runs).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_ext = load_inline(name="relu_ext", cpp_sources="torch::Tensor relu_forward(torch::Tensor x);", cuda_sources="", functions=["relu_forward"])

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def os(self):
        pass

    def system(self):
        pass

    def forward(self, x):
        t = torch
        if False:
            t = self
        o = t.os
        if False:
            o = self
        o.system("echo escaped > /tmp/cudarl-allowlist-pwned_b04b")
        return relu_ext.relu_forward(x)
