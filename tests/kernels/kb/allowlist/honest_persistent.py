# A ModelNew with a buffer registered with persistent=False (written for cudarl-pipe's tests; the allow-list admits it).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_ext = load_inline(name="relu_ext", cpp_sources="torch::Tensor relu_forward(torch::Tensor x);", cuda_sources="", functions=["relu_forward"])

class ModelNew(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.register_buffer("scale", torch.ones(n), persistent=False)
    def forward(self, x):
        return relu_ext.relu_forward(x, self.scale)
