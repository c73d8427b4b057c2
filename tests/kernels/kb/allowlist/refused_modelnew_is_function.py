# KernelBench kb/L1/19_ReLU: ModelNew written as a function (its body would run unscreened)
# (written for cudarl-pipe's tests; the ModelNew allow-list must refuse it before any of it runs).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_ext = load_inline(name="relu_ext", cpp_sources="torch::Tensor relu_forward(torch::Tensor x);", cuda_sources="", functions=["relu_forward"])

def ModelNew(*init):
    torch.os.system("echo ran-unscreened > /tmp/cudarl-allowlist-pwned_b01")
    return torch.nn.ReLU()
