# KernelBench kb/L1/19_ReLU, a hostile ModelNew: the candidate writes a file on the host while the judge tests it.
# The body of ModelNew.forward in relu_model_new.py (`forward_candidate` in tests/common): only forward
# does it, so the file passes extraction; it runs in the sandboxed runner (no marker file ever
# appears, and the verdict is the judge's).
opener = torch.os.__dict__["op" + "en"]
fd = opener("/tmp/cudarl-forward-write_file", torch.os.O_WRONLY | torch.os.O_CREAT, 0o644)
torch.os.write(fd, b"written from forward")
return relu_ext.relu_forward(x)
