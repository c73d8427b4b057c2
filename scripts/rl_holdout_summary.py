#!/usr/bin/env python3
"""RL - SFT on the hold-out families over every committed GPU run.

Walks `benchmarks/results/*.json`, finds each `eval` summary that holds an `sft` and an `rl`
row on the `test` split (the hold-out families), and prints one line per run (pass rate,
multi-turn compile rate, single-turn pass rate: SFT -> RL) and, over the runs with at least
`--min-episodes` episodes per checkpoint, the mean RL - SFT difference with its standard error
over runs (sd / sqrt(n)) and how many runs were above, equal to and below SFT.

It also pools RL minus its frozen control (`rl-train.control = true`: the SFT weights, frozen, on
the same tasks with the same sampling seeds) in mean reward over steps 2 on, per run that had the
control on: what RL learnt on the tasks it practised, with the task order taken out.

Each run's own RL - SFT difference has a standard error of about 0.035 (stratified by task) to
0.06 (two-proportion Wald) at 136 episodes per checkpoint (docs/experiments.md, "Does RL beat
SFT on the hold-out families?"); the spread over runs below includes that noise and the SFT draw's.

A results file keeps a smaller eval of checkpoints that a later eval measured again under a key
containing `superseded` (e.g. `superseded_eval_summary`): listed, not pooled, so a run counts once.

Usage: python3 scripts/rl_holdout_summary.py [--min-episodes 136] [--exclude SUBSTRING] [--json]
Standard library only.
"""

import argparse
import glob
import json
import math
import os
import statistics

METRICS = (
    "pass_rate",
    "compile_rate",
    "single_turn_pass_rate",
    "single_turn_compile_rate",
    "fast_1",
    "geomean_speedup_vs_naive",
)


def tables(obj, path, keep):
    """(path, rows) for every list under `obj` (a results file, any depth) holding dicts that
    `keep` accepts; other lists and dicts are searched further."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from tables(v, path + [str(k)], keep)
    elif isinstance(obj, list):
        rows = [r for r in obj if isinstance(r, dict) and keep(r)]
        if rows:
            yield path, rows
        else:
            for i, v in enumerate(obj):
                yield from tables(v, path + [str(i)], keep)


def pairs(obj):
    """(path, sft_row, rl_row) for every eval summary with both checkpoints on the hold-out."""

    def holdout(r):
        return r.get("checkpoint") in ("sft", "rl") and "pass_rate" in r and r.get("split", "test") == "test"

    for path, rows in tables(obj, [], holdout):
        sft = [r for r in rows if r["checkpoint"] == "sft"]
        rl = [r for r in rows if r["checkpoint"] == "rl"]
        if sft and rl:
            yield path, sft[0], rl[0]


def control_runs(obj):
    """(path, [RL - control mean reward per step from step 2 on]) for every metrics table with
    the control on."""

    def with_control(r):
        return "mean_reward" in r and r.get("control_reward") is not None

    for path, rows in tables(obj, [], with_control):
        diffs = [r["mean_reward"] - r["control_reward"] for r in rows if r.get("step", 0) >= 2]
        if diffs:
            yield path, diffs


def mean_se(xs):
    """Mean and standard error over `xs` (None for the s.e. of fewer than two)."""
    return statistics.fmean(xs), (statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) >= 2 else None)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=os.path.join(os.path.dirname(__file__), "..", "benchmarks", "results"))
    ap.add_argument("--min-episodes", type=int, default=136)
    ap.add_argument("--json", action="store_true", help="print the runs and the pooled means as JSON")
    ap.add_argument(
        "--exclude",
        action="append",
        default=["lr=0.0", "superseded"],
        help="leave out runs whose path contains this (default: the frozen-policy controls, lr=0.0, "
        "and evals a larger eval of the same checkpoints superseded)",
    )
    a = ap.parse_args()
    runs, controls = [], []
    for f in sorted(glob.glob(os.path.join(a.results, "*.json"))):
        with open(f) as fh:
            d = json.load(fh)
        for path, diffs in control_runs(d):
            m, se = mean_se(diffs)
            controls.append(
                {
                    "file": os.path.basename(f),
                    "run": "/".join(path),
                    "steps": len(diffs),
                    "rl_minus_control": m,
                    "se_over_steps": se,
                }
            )
        for path, s, r in pairs(d):
            runs.append(
                {
                    "file": os.path.basename(f),
                    "run": "/".join(p for p in path if p not in ("eval_summary", "eval", "eval_holdout", "result")),
                    "episodes": s.get("episodes"),
                    **{f"sft_{m}": s.get(m) for m in METRICS},
                    **{f"rl_{m}": r.get(m) for m in METRICS},
                }
            )
    big = [x for x in runs if (x["episodes"] or 0) >= a.min_episodes and not any(e in x["run"] for e in a.exclude)]
    pooled = {}
    for m in METRICS:
        diffs = [x[f"rl_{m}"] - x[f"sft_{m}"] for x in big if x[f"rl_{m}"] is not None and x[f"sft_{m}"] is not None]
        if len(diffs) >= 2:
            pooled[m] = {
                "runs": len(diffs),
                "mean": statistics.fmean(diffs),
                "se": statistics.stdev(diffs) / math.sqrt(len(diffs)),
                "above": sum(1 for x in diffs if x > 1e-9),
                "equal": sum(1 for x in diffs if abs(x) <= 1e-9),
                "below": sum(1 for x in diffs if x < -1e-9),
            }
    # The hold-out criterion per run: RL above SFT in both the pass and the compile rate.
    both = [
        x["file"] + ":" + x["run"]
        for x in big
        if x["rl_pass_rate"] > x["sft_pass_rate"] and x["rl_compile_rate"] > x["sft_compile_rate"]
    ]
    # Multi-turn (best turn) against single-turn pass rate of the RL checkpoint.
    gaps = [x["rl_pass_rate"] - x["rl_single_turn_pass_rate"] for x in big if x["rl_single_turn_pass_rate"] is not None]
    # Runs older than the single-turn rates have none.
    single = [x["rl_single_turn_pass_rate"] for x in big if x["rl_single_turn_pass_rate"] is not None]
    ctl = [c["rl_minus_control"] for c in controls]
    summary = {
        "control_runs": controls,
        "rl_minus_control": dict(
            zip(("mean", "se"), mean_se(ctl), strict=True), runs=len(ctl), above=sum(1 for x in ctl if x > 0)
        )
        if ctl
        else None,
        "runs_above_sft_in_pass_and_compile": both,
        "rl_pass_range": [min(x["rl_pass_rate"] for x in big), max(x["rl_pass_rate"] for x in big)] if big else None,
        "rl_single_turn_pass_range": [min(single), max(single)] if single else None,
        "multi_minus_single_turn_pass_min": min(gaps) if gaps else None,
    }
    if a.json:
        print(json.dumps({"runs": runs, "min_episodes": a.min_episodes, "pooled": pooled, **summary}, indent=1))
        return
    print(f"{'file':44s} {'run':40s} {'n':>4s}  {'pass SFT->RL':>20s}  {'compile SFT->RL':>20s}  {'1-turn pass':>20s}")

    def cell(x, m):
        return f"{x['sft_' + m]:.3f}->{x['rl_' + m]:.3f} {x['rl_' + m] - x['sft_' + m]:+.3f}"

    for x in runs:
        print(
            f"{x['file'][:44]:44s} {x['run'][:40]:40s} {x['episodes'] or 0:4d}  {cell(x, 'pass_rate'):>20s}  "
            f"{cell(x, 'compile_rate'):>20s}  {cell(x, 'single_turn_pass_rate'):>20s}"
        )
    print(
        f"\nRL - SFT over the {len(big)} runs with >= {a.min_episodes} episodes per checkpoint "
        "(mean +- se over runs; runs above / equal / below SFT):"
    )
    for m, p in pooled.items():
        print(
            f"  {m:26s} {p['mean']:+.4f} +- {p['se']:.4f}  ({p['above']} / {p['equal']} / {p['below']} of {p['runs']})"
        )
    print(f"runs above SFT in both pass and compile: {len(both)} of {len(big)}: {', '.join(both)}")
    if controls:
        print("\nRL - frozen control, mean reward over steps 2 on (mean +- se over steps):")
        for c in controls:
            se = f" +- {c['se_over_steps']:.3f}" if c["se_over_steps"] is not None else ""
            print(f"  {c['file'][:44]:44s} {c['run'][:40]:40s} {c['rl_minus_control']:+.3f}{se} ({c['steps']} steps)")
        rc = summary["rl_minus_control"]
        se = f" +- {rc['se']:.4f}" if rc["se"] is not None else ""
        print(f"  over {rc['runs']} runs: {rc['mean']:+.4f}{se}, {rc['above']} above their control")
    if gaps:
        print(
            f"RL pass {summary['rl_pass_range']}, single-turn {summary['rl_single_turn_pass_range']}; "
            f"multi-turn minus single-turn pass at least {summary['multi_minus_single_turn_pass_min']:+.3f}"
        )


if __name__ == "__main__":
    main()
