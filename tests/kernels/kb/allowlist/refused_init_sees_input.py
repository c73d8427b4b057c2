# KernelBench kb/L1/19_ReLU: an own class assigned to forward, so the input reaches a constructor
# (written for cudarl-pipe's tests; the ModelNew allow-list must refuse it before any of it runs).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_ext = load_inline(name="relu_ext", cpp_sources="torch::Tensor relu_forward(torch::Tensor x);", cuda_sources="", functions=["relu_forward"])

class Relu(nn.Module):
    def __init__(self, v):
        super().__init__()
        self.T = v * (v > 0)


class Door(nn.Module):
    def __init__(self):
        super().__init__()
        self.forward = Relu


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.door = Door()

    def forward(self, x):
        return self.door(x).T
