"""Torch-format equivalents of the native KernelBench kernels in tests/kernels/kb_native/.

Each native kernel (a `.cu` defining the launcher `kb-specs` derived for its level-1 problem) is
written again as a SakanaAI-style torch extension: the same source, then a `forward` that
allocates the reference's output, passes the sizes read from the input tensors and torch's
current stream to the same `launch`, and `PYBIND11_MODULE`. The two files run the same device
code, so `check` must give both the same verdict (correct or the same failure), and their
speedups against torch eager differ only by the harness's two call paths.

Usage: python3 scripts/gpu/kb_torch_equivalents.py OUT_DIR   (writes OUT_DIR/<problem>.cu)
"""

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
NATIVE = ROOT / "tests" / "kernels" / "kb_native"

ROWS = ("torch::empty_like(in0)", ["in0.size(0)", "in0.size(1)"])
# problem -> (tensor inputs, output allocation, launcher size arguments), from each problem's
# `forward` and `get_inputs` (datasets/kernelbench/problems.parquet).
SPECS = {
    "19_ReLU": (1, *ROWS),
    "21_Sigmoid": (1, *ROWS),
    "22_Tanh": (1, *ROWS),
    "23_Softmax": (1, *ROWS),
    "24_LogSoftmax": (1, *ROWS),
    "26_GELU_": (1, *ROWS),
    "38_L1Norm_": (1, *ROWS),
    "39_L2Norm_": (1, *ROWS),
    # torch.matmul(A, B), A and B (N, N).
    "1_Square_matrix_multiplication_": (2, "torch::empty({in0.size(0), in0.size(0)}, in0.options())", ["in0.size(0)"]),
    # torch.matmul(A, B), A (M, K), B (K, 1): out (M, 1); launch(..., K, M).
    "4_Matrix_vector_multiplication_": (
        2,
        "torch::empty({in0.size(0), 1}, in0.options())",
        ["in0.size(1)", "in0.size(0)"],
    ),
    # torch.sum(x, dim=1, keepdim=True), x (b, d1, d2): out (b, 1, d2); reduce_dim 1.
    "47_Sum_reduction_over_a_dimension": (
        1,
        "torch::empty({in0.size(0), 1, in0.size(2)}, in0.options())",
        ["in0.size(0)", "in0.size(1)", "in0.size(2)", "1"],
    ),
    # torch.max(x, dim=1)[0], x (b, d1, d2): out (b, d2).
    "49_Max_reduction_over_a_dimension": (
        1,
        "torch::empty({in0.size(0), in0.size(2)}, in0.options())",
        ["in0.size(0)", "in0.size(1)", "in0.size(2)"],
    ),
}


def extension(native: str, n_in: int, alloc: str, sizes: list[str]) -> str:
    """The native source with a torch `forward` around its `launch`; torch's headers come first,
    so a macro of the kernel's (`#define T 32`) cannot break them."""
    ins = [f"in{i}" for i in range(n_in)]
    params = ", ".join(f"torch::Tensor {x}" for x in ins)
    ptrs = ", ".join([f"{x}.contiguous().data_ptr<float>()" for x in ins] + ["out.data_ptr<float>()"])
    return (
        "#include <torch/extension.h>\n#include <ATen/cuda/CUDAContext.h>\n\n"
        + native.rstrip()
        + "\n\n// The torch-format entry point of the same kernel (scripts/gpu/kb_torch_equivalents.py).\n"
        + f"torch::Tensor forward({params}) {{\n"
        + f"    auto out = {alloc};\n"
        + f"    launch({ptrs}, {', '.join(sizes)}, at::cuda::getCurrentCUDAStream());\n"
        + "    return out;\n}\n\n"
        + 'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("forward", &forward, "forward"); }\n'
    )


def main() -> None:
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    names = sorted(p.stem for p in NATIVE.glob("*.cu"))
    missing = [n for n in names if n not in SPECS]
    if missing:
        sys.exit(f"no torch-format wrapper spec for {missing} (scripts/gpu/kb_torch_equivalents.py SPECS)")
    for n in names:
        n_in, alloc, sizes = SPECS[n]
        (out / f"{n}.cu").write_text(extension((NATIVE / f"{n}.cu").read_text(), n_in, alloc, sizes))
    print(f"{len(names)} torch-format equivalents in {out}")


if __name__ == "__main__":
    main()
