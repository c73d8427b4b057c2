"""Wall time (ms, median of REPS after one warm-up, each synchronized) of the torch-format judge's
work around one timed window at KernelBench level 1 sizes on a GPU: kb/L1/19_ReLU's input and
output, 4096 x 393216 float32 (1.6e9 elements, 6.4 GB each). For this checkout's
`python/cudarl_worker.py` and, with --before PATH, another worker script, side by side:

- `rms` of the reference output (the scale of a sample's tolerance under redrawn inputs);
- `compare` of a right output in full (the first timed window, the full-size tests) and at
  TIMED_COMPARE drawn positions (later timed windows);
- `same_bits` of the arena's input against the judge's copy (a launch must not change inputs);
- the rest of a window, the same for both: drawing inputs (`torch.rand`, `torch.randn`), the
  output poison, the copy into the arena, the reference (clone and relu).

Also the relative difference of each `rms` from a float64 sum (`rms_rel_diff`) and whether both
`compare`s pass the right output and fail one with an element off by 1.0.

Usage: python3 scripts/gpu/judge_ops.py [--before PATH] [--out judge_ops.json]
(`--device cpu --rows 64` runs the same steps small on the CPU, to try the script.)
"""

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import torch

REPS = 5


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn):
    fn()
    sync()
    ts = []
    for _ in range(REPS):
        t = time.perf_counter()
        fn()
        sync()
        ts.append((time.perf_counter() - t) * 1e3)
    return round(statistics.median(ts), 2)


def exact_rms(e):
    sq = 0.0
    for c in e.reshape(-1).split(1 << 26):
        sq += float(c.double().square().sum())
    return (sq / e.numel()) ** 0.5


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--before")
    ap.add_argument("--out", default="judge_ops.json")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rows", type=int, default=4096)
    args = ap.parse_args()
    dev, shape = args.device, (args.rows, 393216)
    here = Path(__file__).resolve().parents[2] / "python" / "cudarl_worker.py"
    workers = {"this": load(here, "worker_this")}
    if args.before:
        workers["before"] = load(args.before, "worker_before")

    g = torch.Generator(device=dev).manual_seed(1)
    x = torch.randn(shape, device=dev, generator=g)
    arena = torch.empty_like(x)
    out = torch.empty_like(x)
    common = {
        "rand": timed(lambda: torch.rand(shape, device=dev, generator=g)),
        "randn": timed(lambda: torch.randn(shape, device=dev, generator=g)),
        "poison_fill": timed(lambda: out.view(-1).view(torch.uint8).fill_(0xFF)),
        "copy_into_arena": timed(lambda: arena.copy_(x)),
        "reference_clone_relu": timed(lambda: torch.relu(x.clone())),
    }
    exp = torch.relu(x)
    out.copy_(exp)
    wrong = exp.clone()
    wrong.view(-1)[exp.numel() * 3 // 4] += 1.0
    want_rms = exact_rms(exp)
    per = {}
    for name, w in workers.items():
        jg = torch.Generator(device=dev).manual_seed(2)

        def sample(w=w, jg=jg):
            at = torch.randint(0, exp.numel(), (w.TIMED_COMPARE,), device=dev, generator=jg)
            return w.compare([out.view(-1)[at]], [exp.view(-1)[at]], 1e-2, 1e-2, scaled=True, scales=[1.0])

        r = w.rms(exp, dev)
        per[name] = {
            "rms": timed(lambda w=w: w.rms(exp, dev)),
            "compare_full": timed(lambda w=w: w.compare([out], [exp], 1e-2, 1e-2, scaled=True)),
            "compare_sample": timed(sample),
            "same_bits_input": timed(lambda w=w: w.same_bits(arena, x)),
            "rms_rel_diff": abs(r - want_rms) / want_rms,
            "right_passes": bool(w.compare([out], [exp], 1e-2, 1e-2, scaled=True)[0]),
            "wrong_fails": not w.compare([wrong], [exp], 1e-2, 1e-2, scaled=True)[0],
        }
    res = {
        "what": "torch-format judge's per-window operations, kb/L1/19_ReLU sizes (1.6e9 float32)",
        "gpu": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
        "elements": exp.numel(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
        "reps": REPS,
        "window_common_ms": common,
        "judge_ms": per,
    }
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(f"gpu: {res['gpu']} torch {res['torch']}")
    for k, v in common.items():
        print(f"{k:24} {v:9.2f} ms")
    keys = [k for k in next(iter(per.values())) if k not in ("rms_rel_diff", "right_passes", "wrong_fails")]
    print(f"{'':24} " + " ".join(f"{n:>10}" for n in per))
    for k in keys:
        print(f"{k:24} " + " ".join(f"{per[n][k]:10.2f}" for n in per))
    for k in ("rms_rel_diff", "right_passes", "wrong_fails"):
        print(f"{k:24} " + " ".join(f"{per[n][k]!s:>10}" for n in per))
    return 0


if __name__ == "__main__":
    sys.exit(main())
