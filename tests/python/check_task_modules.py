"""Checks that every task's KernelBench-style module computes what the judge's reference does.

Reads a JSON file (written by `crates/cudarl-torch/tests/task_modules.rs`) with one case per
task: the module source, the sizes to run it at, the forward inputs and the parameters the
judge drew (float64), the reference output the judge's evaluator computed for them
(`cudarl_torch::eval`, libtorch), and the launcher the task declares. For each case it runs the
module in float64 with those sizes and inputs (the parameters loaded into its state dict by the
launcher's names: `ln.weight` is `ln_weight`) and compares its output with the reference; for
cases marked `derive`, it also derives the launcher from the module as `kb-specs` does
(`python/cudarl_worker.py`, op `signature`) and compares it with the declared one.

Usage: check_task_modules.py CASES.json. Prints `checked N modules (M signatures)` and exits 0,
or lists every disagreement and exits 1.
"""

import json
import sys
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
import cudarl_worker

C_TYPES = {"float32": "float", "f32": "float", "f16": "__half", "bf16": "__nv_bfloat16"}


def native_signature(ans):
    """The launcher `kb-specs` writes for a worker answer (crates/cudarl-stages/src/kb_specs.rs)."""
    params = []
    for b in ans["inputs"] + ans["params"]:
        if "scalar" in b:
            params.append(f"float {b['name']}")
        else:
            params.append(f"const {C_TYPES[b['dtype']]}* {b['name']}")
    for b in ans["outputs"]:
        params.append(f"{C_TYPES[b['dtype']]}* {b['name']}")
    params += [f"int64_t {k}" for k in ans["sizes"]]
    params.append("cudaStream_t stream")
    return f'extern "C" void launch({", ".join(params)})'


def tensor(spec):
    return torch.tensor(spec["data"], dtype=torch.float64).reshape(spec["shape"])


def run_case(case):
    mod = types.ModuleType("task_module")
    exec(compile(case["code"], case["id"], "exec"), mod.__dict__)
    for k, v in case["sizes"].items():
        setattr(mod, k, v)
    init = list(mod.get_init_inputs())
    torch.manual_seed(0)
    model = mod.Model(*init).double()
    state = model.state_dict()
    params = case["params"]
    names = {k.replace(".", "_"): k for k in state}
    if set(names) != set(params):
        return f"state dict {sorted(names)} != launcher parameters {sorted(params)}"
    model.load_state_dict({names[n]: tensor(p) for n, p in params.items()})
    args = [a["value"] if "value" in a else tensor(a) for a in case["forward"]]
    with torch.no_grad():
        out = model(*args)
    want = torch.tensor(case["expected"], dtype=torch.float64)
    got = out.reshape(-1).to(torch.float64)
    if got.numel() != want.numel():
        return f"output has {got.numel()} elements, the reference {want.numel()}"
    if not torch.allclose(got, want, rtol=1e-6, atol=1e-9, equal_nan=False):
        err = (got - want).abs().max().item()
        return f"output differs from the reference (max abs error {err:.3g})"
    return None


def main():
    cases = json.loads(Path(sys.argv[1]).read_text())
    failures, derived = [], 0
    for case in cases:
        try:
            why = run_case(case)
        except Exception as e:  # the module itself fails: that is a finding, not a crash
            why = f"{type(e).__name__}: {e}"
        if why:
            failures.append(f"{case['id']}: {why}")
            continue
        if case.get("derive"):
            ans = cudarl_worker.signature({"code": case["code"], "problem_id": case["id"]})
            sig = native_signature(ans)
            if ans.get("excluded") or sig != case["signature"]:
                failures.append(f"{case['id']}: derived {sig} ({ans.get('excluded')}), declared {case['signature']}")
            derived += 1
    for f in failures:
        print(f)
    print(f"checked {len(cases)} modules ({derived} signatures), {len(failures)} disagree")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
