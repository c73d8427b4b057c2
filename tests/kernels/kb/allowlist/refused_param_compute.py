# KernelBench kb/L1/19_ReLU: arithmetic on parameters and max with key= (written for cudarl-pipe's
# tests; the ModelNew allow-list must refuse it before any of it runs).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_ext = load_inline(name="relu_ext", cpp_sources="torch::Tensor relu_forward(torch::Tensor x);", cuda_sources="", functions=["relu_forward"])

class Holder(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(5, 5))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.h = Holder()
        self.lin = nn.Linear(5, 5)
        self.lstm = nn.LSTM(5, 5)

    def forward(self, x):
        w2 = self.h.w @ self.h.w
        z = self.lstm.weight_ih_l0 * 2
        v = max((self.h.w,), key=self.lin.forward)
        return relu_ext.relu_forward(x)
