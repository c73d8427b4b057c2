# A ModelNew with an optional bias checked against None (written for cudarl-pipe's tests; the allow-list admits it).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_ext = load_inline(name="relu_ext", cpp_sources="torch::Tensor relu_forward(torch::Tensor x);", cuda_sources="", functions=["relu_forward"])

class ModelNew(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.bias = None
    def forward(self, x):
        if self.bias is not None:
            return relu_ext.relu_forward(x, self.bias)
        return relu_ext.relu_forward(x)
