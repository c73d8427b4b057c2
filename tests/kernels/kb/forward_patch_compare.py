# KernelBench kb/L1/19_ReLU, a hostile ModelNew: the candidate replaces the harness's comparison in its own interpreter with one that always passes, and returns zeros.
# The body of ModelNew.forward in relu_model_new.py (`forward_candidate` in tests/common): only forward
# does it, so the file passes extraction; it runs in the sandboxed runner (no marker file ever
# appears, and the verdict is the judge's).
main = torch.sys.modules["__main__"]
if hasattr(main, "compare"):
    main.compare = lambda *a, **k: (True, 0.0, 0.0, 0, None)
return torch.zeros_like(x)
