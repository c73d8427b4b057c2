# A ModelNew with a tuple[int, ...] annotation (written for cudarl-pipe's tests; the allow-list admits it).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_ext = load_inline(name="relu_ext", cpp_sources="torch::Tensor relu_forward(torch::Tensor x);", cuda_sources="", functions=["relu_forward"])

class ModelNew(nn.Module):
    def __init__(self, shape: tuple[int, ...]):
        super().__init__()
    def forward(self, x):
        return relu_ext.relu_forward(x)
