# KernelBench kb/L1/19_ReLU: a module-level annotation that runs code at import (written for
# cudarl-pipe's tests; the ModelNew allow-list must refuse it before any of it runs).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_ext = load_inline(name="relu_ext", cpp_sources="torch::Tensor relu_forward(torch::Tensor x);", cuda_sources="", functions=["relu_forward"])

X: torch.os.system("echo ran-at-import > /tmp/cudarl-allowlist-pwned_b02") = 1

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return relu_ext.relu_forward(x)
