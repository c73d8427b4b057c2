# KernelBench kb/L1/19_ReLU, the body of ModelNew.forward in relu_model_new.py: an index far
# out of bounds, a device-side assert that leaves the runner's CUDA context unusable (written
# for cudarl-pipe's tests; must be cuda_error, and the next candidate of the same judge must be
# judged as if it came first).
return x.reshape(-1)[torch.full((1,), 1 << 40, dtype=torch.long, device=x.device)]
