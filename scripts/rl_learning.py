#!/usr/bin/env python3
"""The pre-registered RL comparison pooled over SFT draws.

Each RUN_DIR is one SFT draw's main job as `scripts/gpu/main_job.sh` collects it (with
`rl-train.control = true`): `rl_metrics.jsonl` (rl-train's `metrics`, with the frozen control's
columns) and `export/eval/report/comparison.json` (`export/eval.report/` in run directories
exported before one folder per node; eval's pre-registered comparison: the primary
metric and the guardrail named in `pipelines/default.toml`, RL - SFT on the hold-out families
paired by sampling seed). Per draw it takes:

- RL - control on the practised tasks: the mean over steps 2 on of the per-step difference in
  mean reward (step 1 samples from identical weights);
- RL - SFT on the hold-out in the primary metric and in the guardrail, from comparison.json;
- collab-SFT - SFT likewise, where the draw evaluated the cross-agent fine-tuned checkpoints
  (`eval.collab = true`).

A draw whose RL run was cut short (`partial_step.txt` beside its metrics: the rows of the run's
last save, no eval) counts for RL - control only and not towards the three draws.

Over draws it reports the mean of the per-draw differences with the standard error over draws
(sd / sqrt(n), n >= 2); with one draw, that draw's own standard error (over steps, or clustered by
task). The acceptance of the RL issue: RL - control above 0 by 3 standard errors, RL - SFT on the
hold-out above 0 by 2 in the primary metric, the guardrail not lower by more than one, RL's
multi-turn rate above its single-turn rate on the hold-out by 2 (comparison.json's
`rl_multi_minus_single_turn`, in the guardrail's outcome).

One draw on a GPU host (binaries from `make carry`), detached, about 25 minutes on an H200:
    DRAW=N ACTION=start bash scripts/gpu/rl_draw.sh     # then ACTION=wait until it says done
$OUT/draw.tar.gz unpacks to the RUN_DIR. Several on a host of several GPUs, one GPU each, sharing
the nodes no draw seed reaches: DRAWS="1 2 3" ACTION=start bash scripts/gpu/rl_draw.sh, then
$OUT/draw<N>.tar.gz.

Usage: python3 scripts/rl_learning.py RUN_DIR [RUN_DIR ...] [--out FILE] [--gpu NAME]
Writes the JSON to --out (e.g. benchmarks/results/rl_learning_h200_<date>.json) or stdout.
Standard library only.
"""

import argparse
import json
import math
import os
import statistics
import sys


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def per_step(metrics, key, control_key):
    """Per-step RL - control differences from step 2 on, where the control ran."""
    return [
        r[key] - r[control_key]
        for r in sorted(metrics, key=lambda r: r["step"])
        if r["step"] >= 2 and r.get(key) is not None and r.get(control_key) is not None
    ]


def mean_se(xs):
    if not xs:
        return None, None
    if len(xs) < 2:
        return xs[0], None
    return statistics.fmean(xs), statistics.stdev(xs) / math.sqrt(len(xs))


def draw(run_dir):
    """One draw's differences and sizes."""
    metrics = read_jsonl(os.path.join(run_dir, "rl_metrics.jsonl"))
    comp_path = os.path.join(run_dir, "export", "eval", "report", "comparison.json")
    if not os.path.exists(comp_path):
        comp_path = os.path.join(run_dir, "export", "eval.report", "comparison.json")
    # A draw whose RL run was cut short (scripts/gpu/rl_draw.sh FINAL=1) has the metrics rows of
    # its last save and no eval: it counts for RL - control only.
    comp = {}
    if os.path.exists(comp_path):
        with open(comp_path) as f:
            comp = json.load(f)
    partial = os.path.join(run_dir, "partial_step.txt")
    reward = per_step(metrics, "mean_reward", "control_reward")
    if not reward:
        sys.exit(f"{run_dir}: rl_metrics.jsonl has no control columns (rl-train.control = true)")
    d, se = mean_se(reward)
    prim, guard = comp.get("holdout_primary") or {}, comp.get("holdout_guardrail") or {}
    ms = comp.get("rl_multi_minus_single_turn") or {}
    cprim = comp.get("holdout_collab_primary") or {}
    cguard = comp.get("holdout_collab_guardrail") or {}
    return {
        "run": run_dir,
        "partial": os.path.exists(partial),
        "primary_metric": comp.get("primary_metric"),
        "guardrail_metric": comp.get("guardrail_metric"),
        "steps": len(metrics),
        "episodes": sum(r["episodes"] for r in metrics),
        "rl_minus_control": d,
        "rl_minus_control_se": se,
        "rl_minus_sft_holdout": prim.get("rl_minus_sft"),
        "rl_minus_sft_holdout_se": prim.get("se"),
        "holdout_pairs": prim.get("pairs"),
        "guardrail_rl_minus_sft": guard.get("rl_minus_sft"),
        "guardrail_rl_minus_sft_se": guard.get("se"),
        "rl_multi_minus_single_turn": ms.get("multi_minus_single"),
        "rl_multi_minus_single_turn_se": ms.get("se"),
        "collab_minus_sft_holdout": cprim.get("collab_minus_sft"),
        "collab_minus_sft_holdout_se": cprim.get("se"),
        "guardrail_collab_minus_sft": cguard.get("collab_minus_sft"),
        "guardrail_collab_minus_sft_se": cguard.get("se"),
    }


def pool(draws, key):
    """Mean over draws and its standard error (over draws; one draw: its own)."""
    xs = [d[key] for d in draws if d[key] is not None]
    if len(xs) >= 2:
        return mean_se(xs)
    if len(xs) == 1:
        one = next(d for d in draws if d[key] is not None)
        return xs[0], one[key + "_se"]
    return None, None


def above(d, se, k):
    return d is not None and se is not None and se > 0 and d > k * se


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--out")
    ap.add_argument("--gpu", default="")
    a = ap.parse_args()
    draws = [draw(r) for r in a.runs]
    names = {(d["primary_metric"], d["guardrail_metric"]) for d in draws if d["primary_metric"]}
    if len(names) > 1:
        sys.exit(f"the draws name different metrics: {sorted(names, key=str)}")
    primary, guardrail = next(iter(names), (None, None))
    out = {
        "gpu": a.gpu,
        "primary_metric": primary,
        "guardrail_metric": guardrail,
        "sft_draws": len(draws),
        "partial_draws": sum(d["partial"] for d in draws),
        "steps": [d["steps"] for d in draws],
        "episodes": [d["episodes"] for d in draws],
    }
    for key in (
        "rl_minus_control",
        "rl_minus_sft_holdout",
        "guardrail_rl_minus_sft",
        "rl_multi_minus_single_turn",
        "collab_minus_sft_holdout",
        "guardrail_collab_minus_sft",
    ):
        out[key], out[key + "_se"] = pool(draws, key)
    g, gse = out["guardrail_rl_minus_sft"], out["guardrail_rl_minus_sft_se"]
    out["acceptance"] = {
        "rl_minus_control_above_3_se": above(out["rl_minus_control"], out["rl_minus_control_se"], 3),
        "rl_minus_sft_holdout_above_2_se": above(out["rl_minus_sft_holdout"], out["rl_minus_sft_holdout_se"], 2),
        "guardrail_within_1_se": g is not None and gse is not None and g >= -gse,
        "multi_turn_above_single_turn_2_se": above(
            out["rl_multi_minus_single_turn"], out["rl_multi_minus_single_turn_se"], 2
        ),
        "at_least_3_draws": sum(not d["partial"] for d in draws) >= 3,
    }
    out["draws"] = draws
    text = json.dumps(out, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
