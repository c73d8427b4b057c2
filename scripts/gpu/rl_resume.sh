#!/usr/bin/env bash
# A long `rl-train` cut into commands of at most BUDGET_S seconds each, on one GPU host without
# a Rust toolchain (binaries from `make carry`): every invocation runs
# `cudarl-pipe run rl-train --set rl-train.steps=$STEPS` on the same store until it finishes or
# its time is up: then it gets SIGTERM, finishes the RL step in flight, saves it and exits 130
# (docs/architecture.md, "Interrupts"), or is killed GRACE_S seconds later (SIGKILL, as at the end
# of a command's time: it then loses the steps since its last save), and the next invocation
# continues from the last saved step (docs/architecture.md, "Resuming"). The first invocation
# also builds everything before rl-train (pretrain, SFT, validate) on a cold store.
#   STEPS     RL steps of the run (default 100)
#   BUDGET_S  seconds before the SIGTERM (default 540)
#   GRACE_S   seconds from the SIGTERM to the SIGKILL (default 45)
#   FRESH=1   starts over on an empty store
#   SETS      extra `--set` values, space-separated (e.g. rl-train.control=true); every
#             invocation of one run must give the same ones (they are part of the stage's key)
#   EVAL=1    once the run has finished, `run eval` on it too (same SETS and STEPS) and write
#             $OUT/draw/ (rl_metrics.jsonl, export/eval/report/ with comparison.json), the layout
#             scripts/rl_learning.py pools over SFT draws
#   FROM_STORE a store to start from instead (hard-linked, e.g. the main job's
#             /tmp/cudarl-main/store): its stages before rl-train are cached, and a run with
#             more steps continues its shorter rl-train (docs/architecture.md, "Resuming")
# Each invocation appends one line to $D/commands.jsonl (the saved step before and after, its
# seconds, the exit code: 0 finished, 130 stopped by the SIGTERM after saving, 137 killed) and copies it to $OUT; the invocation that finishes also writes
# $OUT/rl_resume.json: the commands, rl-train's metrics and the node's stats.
# CUDARL_HOST_TMP: the folder the run lives in on the host (default /tmp), as in
# scripts/gpu/main_job.sh.
set -uo pipefail
H=${CUDARL_HOST_TMP:-/tmp}
D=$H/cudarl-resume
B=$H/cudarl-bin
STEPS=${STEPS:-100}
BUDGET_S=${BUDGET_S:-540}
GRACE_S=${GRACE_S:-45}
OUT=${OUT:-/tmp/cudarl-resume-out}
mkdir -p "$OUT"
# What the previous invocation's kill left: the trainer and the GPU workers run in their own
# sessions (so a candidate cannot escape the harness's kill), out of reach of `timeout`'s.
# Anchored: a shell whose command line names the binaries (the one that started this script)
# is not one of them.
pkill -KILL -f "^$B/cudarl-pipe" 2>/dev/null && sleep 1
if [ "${FRESH:-0}" = 1 ] || [ ! -d "$D" ]; then
  rm -rf "$D"; mkdir -p "$D" "$B"
  for z in .carry/*.gz; do gzip -dc "$z" > "$B/$(basename "$z" .gz)"; chmod +x "$B/$(basename "$z" .gz)"; done
  if [ -n "${FROM_STORE:-}" ]; then cp -al "$FROM_STORE" "$D/store"; rm -rf "$D/store/locks"; fi
fi
export CUDARL_WORKER=$B/cudarl-pipe-worker CUDARL_TRAINER=$B/cudarl-pipe-train
LD_LIBRARY_PATH=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')/lib:${LD_LIBRARY_PATH:-}
export LD_LIBRARY_PATH
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
CUDARL_PYTHON=$(command -v python3)
export CUDARL_PYTHON
nvidia-smi ${CUDA_VISIBLE_DEVICES:+-i ${CUDA_VISIBLE_DEVICES%%,*}} --query-gpu=name,driver_version --format=csv,noheader > "$D/gpu.txt"
# The step of the run's saved progress (0: none).
saved() {
  find "$D/store/memo/rl-train-progress" -name stage.json 2>/dev/null |
    xargs -r python3 -c 'import json,sys; print(max([json.load(open(f))["step"] for f in sys.argv[1:]] or [0]))' 2>/dev/null || echo 0
}
n=$(( $(wc -l < "$D/commands.jsonl" 2>/dev/null || echo 0) + 1 ))
before=$(saved); [ -n "$before" ] || before=0
t0=$(date +%s.%N)
EXTRA=()
for kv in ${SETS:-}; do EXTRA+=(--set "$kv"); done
timeout --preserve-status -s TERM -k "$GRACE_S" "$BUDGET_S" "$B/cudarl-pipe" --root . --store "$D/store" run rl-train \
  --set "rl-train.steps=$STEPS" "${EXTRA[@]}" --json > "$D/run_$n.jsonl" 2> "$D/run_$n.err"
rc=$?
t1=$(date +%s.%N)
after=$(saved); [ -n "$after" ] || after=0
python3 - "$n" "$before" "$after" "$t0" "$t1" "$rc" "$D/run_$n.err" >> "$D/commands.jsonl" <<'PY'
import json, sys
n, before, after, t0, t1, rc, err = sys.argv[1:]
notes = [l.strip() for l in open(err, errors="replace")
         if "note rl-train" in l or "ran " in l or "stopped " in l or "interrupted" in l]
print(json.dumps({"command": int(n), "saved_step_before": int(before), "saved_step_after": int(after),
                  "seconds": round(float(t1) - float(t0), 1), "rc": int(rc), "said": notes[-12:]}))
PY
cp "$D/commands.jsonl" "$OUT/"
if [ "$rc" = 0 ]; then
  "$B/cudarl-pipe" --root . --store "$D/store" show rl-train --output metrics --json --head 100000 \
    --set "rl-train.steps=$STEPS" "${EXTRA[@]}" > "$D/metrics.jsonl"
  python3 - "$D" "$STEPS" > "$OUT/rl_resume.json" <<'PY'
import glob, json, sys
d, steps = sys.argv[1], int(sys.argv[2])
recs = [json.loads(l) for p in sorted(glob.glob(f"{d}/run_*.jsonl")) for l in open(p) if l.strip()]
ran = [r for r in recs if r.get("node") == "rl-train" and r.get("status") == "ran"]
nodes = {r["node"]: round(r.get("seconds") or 0, 1) for r in recs if r.get("node") and r.get("status") == "ran"}
print(json.dumps({"gpu": open(f"{d}/gpu.txt").read().strip(), "steps": steps,
                  "commands": [json.loads(l) for l in open(f"{d}/commands.jsonl")],
                  "nodes_ran_seconds": nodes,
                  "rl_train": {k: ran[-1].get(k) for k in ("seconds", "stats")} if ran else None,
                  "metrics": [json.loads(l) for l in open(f"{d}/metrics.jsonl")]}, indent=1))
PY
  if [ "${EVAL:-0}" = 1 ]; then
    mkdir -p "$OUT/draw"
    cp "$D/metrics.jsonl" "$OUT/draw/rl_metrics.jsonl"
    "$B/cudarl-pipe" --root . --store "$D/store" run eval --set "rl-train.steps=$STEPS" "${EXTRA[@]}" \
      --json > "$D/eval.jsonl" 2> "$D/eval.err"
    echo "eval rc=$?" >> "$OUT/draw/eval_rc.txt"
    "$B/cudarl-pipe" --root . --store "$D/store" export eval --output report --to "$OUT/draw/export" \
      --set "rl-train.steps=$STEPS" "${EXTRA[@]}" > /dev/null 2>&1
  fi
fi
tail -1 "$D/commands.jsonl"
