# KernelBench kb/L1/19_ReLU, a hostile ModelNew: the candidate reaches libc through torch.ctypes and runs a shell command while the judge tests it.
# The body of ModelNew.forward in relu_model_new.py (`forward_candidate` in tests/common): only forward
# does it, so the file passes extraction; it runs in the sandboxed runner (no marker file ever
# appears, and the verdict is the judge's).
torch.ctypes.CDLL(None).system(b"touch /tmp/cudarl-forward-torch_ctypes")
return relu_ext.relu_forward(x)
