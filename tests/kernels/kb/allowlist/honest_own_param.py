# A ModelNew with an own module's parameter read through it (written for cudarl-pipe's tests; the allow-list admits it).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_ext = load_inline(name="relu_ext", cpp_sources="torch::Tensor relu_forward(torch::Tensor x);", cuda_sources="", functions=["relu_forward"])

class Inner(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(n))
    def forward(self, x):
        return relu_ext.relu_forward(x, self.gamma)
class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.inner = Inner(n)
    def forward(self, x):
        return relu_ext.relu_forward(x, self.inner.gamma.contiguous())
