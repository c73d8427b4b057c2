"""cudarl-pipe's Python worker (the machine's python3 with torch; numpy and safetensors later).

Protocol: one JSON request per line on stdin, one JSON answer per line on stdout, in order.
The first line written is a hello: {"hello": true, "python": ..., "torch": ...}.

Requests:
  {"op": "signature", "problem_id": str, "code": str}
      Runs a KernelBench problem's `get_init_inputs()`, `Model(...)`, `get_inputs()` and
      `forward` on torch's meta device (shapes and dtypes only: no memory, no compute, so the
      problems' full sizes cost nothing) and derives a native signature: pointers for inputs,
      parameters and outputs, named integer sizes from the module's integer constants.
      Answer: {"problem_id", "ok", "error", "excluded", "constants", "init_inputs", "inputs",
               "params", "outputs", "sizes"}; `excluded` names why no native signature exists.
  {"op": "raise", "message": str}
      Raises inside the worker (tests the error path): the answer has ok=false and the error.

A request that fails answers {"ok": false, "error": "<type>: <message>"}; the worker goes on.
"""
import json
import sys
import traceback
import types

import torch

NATIVE_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.int64: "i64",
                 torch.int32: "i32", torch.bool: "bool"}


def describe(t):
    return {"shape": list(t.shape), "dtype": NATIVE_DTYPES.get(t.dtype, str(t.dtype).replace("torch.", ""))}


def size_names(constants, shape):
    """Each dimension as the name of the module constant with that value (unique match), else the literal."""
    out = []
    for d in shape:
        names = [k for k, v in constants.items() if v == d]
        out.append(names[0] if len(names) == 1 else str(d))
    return out


def signature(req):
    mod = types.ModuleType("kb_problem")
    code = compile(req["code"], req["problem_id"], "exec")
    torch.set_default_device("meta")
    real_cuda = torch.Tensor.cuda
    real_to = torch.Tensor.to
    # Keep everything on the meta device: `.cuda()` / `.to("cuda")` in get_inputs are no-ops.
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.Tensor.to = lambda self, *a, **k: self if (a and isinstance(a[0], (str, torch.device))) or "device" in k else real_to(self, *a, **k)
    try:
        exec(code, mod.__dict__)
        constants = {k: v for k, v in vars(mod).items()
                     if not k.startswith("_") and isinstance(v, int) and not isinstance(v, bool)}
        init = list(mod.get_init_inputs()) if hasattr(mod, "get_init_inputs") else []
        model = mod.Model(*init)
        inputs = mod.get_inputs()
        with torch.no_grad():
            out = model(*inputs)
    finally:
        torch.Tensor.cuda = real_cuda
        torch.Tensor.to = real_to
        torch.set_default_device("cpu")
    res = {"constants": constants, "init_inputs": [repr(x) for x in init], "excluded": None}
    ins, excluded = [], None
    for i, x in enumerate(inputs):
        if isinstance(x, torch.Tensor):
            ins.append({"name": f"in{i}", **describe(x)})
        elif isinstance(x, (int, float)) and not isinstance(x, bool):
            ins.append({"name": f"in{i}", "scalar": repr(x)})
        else:
            excluded = excluded or f"input {i} is a {type(x).__name__}, not a tensor or number"
    params = [{"name": n.replace(".", "_"), **describe(p)} for n, p in model.state_dict().items()]
    outs = out if isinstance(out, (tuple, list)) else [out]
    outputs = []
    for i, o in enumerate(outs):
        if isinstance(o, torch.Tensor):
            outputs.append({"name": "out" if len(outs) == 1 else f"out{i}", **describe(o)})
        else:
            excluded = excluded or f"output {i} is a {type(o).__name__}, not a tensor"
    for b in ins + params + outputs:
        if "dtype" in b and b["dtype"] not in NATIVE_DTYPES.values():
            excluded = excluded or f"`{b['name']}` has dtype {b['dtype']}"
        if "shape" in b:
            b["dims"] = size_names(constants, b["shape"])
    used = sorted({d for b in ins + params + outputs for d in b.get("dims", []) if d in constants})
    res.update(inputs=ins, params=params, outputs=outputs, sizes={k: constants[k] for k in used}, excluded=excluded)
    return res


def main():
    print(json.dumps({"hello": True, "python": sys.version.split()[0], "torch": torch.__version__}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        req = {}
        try:
            req = json.loads(line)
            if req.get("op") == "signature":
                ans = signature(req)
            elif req.get("op") == "raise":
                raise RuntimeError(req.get("message", "raised on request"))
            else:
                raise ValueError(f"unknown op {req.get('op')!r}")
            ans.update(ok=True, error=None)
        except Exception as e:  # noqa: BLE001 - every failure is an answer
            tb = traceback.extract_tb(e.__traceback__)
            where = next((f"line {f.lineno}" for f in reversed(tb) if f.filename == req.get("problem_id")), None)
            ans = {"ok": False, "error": f"{type(e).__name__}: {e}" + (f" ({where})" if where else "")}
        ans["problem_id"] = req.get("problem_id")
        print(json.dumps(ans), flush=True)


if __name__ == "__main__":
    main()
