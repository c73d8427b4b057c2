# KernelBench kb/L1/19_ReLU with a host escape at import: torch.os reaches the os module without importing it.
# Executing the file to record its load_inline calls runs the payload: only the sandbox stands in
# the way (cudarl-pipe's tests: the marker file must never appear).
# The payload only: the test appends the honest ModelNew of relu_model_new.py from its `cuda_src`.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

torch.os.system("touch /tmp/cudarl-escape-torch_os")
