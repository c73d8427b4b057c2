# KernelBench kb/L1/19_ReLU, the body of ModelNew.forward in relu_model_new.py: the honest extension launched on one element (a token launch) beside
# plain torch.relu, which does the work (written for cudarl-pipe's tests; must be flagged
# torch_op_stands_in from the kernels that ran).
relu_ext.relu_forward(x.reshape(-1)[:1])
return torch.relu(x)
