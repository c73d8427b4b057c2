import torch
import torch.nn as nn


class Model(nn.Module):
    """Swish (SiLU) activation, x * sigmoid(x): the example problem of `cudarl-pipe optimize`,
    written the way KernelBench writes its problems (a Model, its sizes, get_inputs and
    get_init_inputs)."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)


batch_size = 4096
dim = 16384


def get_inputs():
    x = torch.rand(batch_size, dim)
    return [x]


def get_init_inputs():
    return []
