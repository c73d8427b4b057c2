#!/usr/bin/env bash
# GPU memory held per process while the harness judges (binaries from `make carry`): samples
# `nvidia-smi --query-compute-apps` every second into $OUT/gpu_memory.csv (time, pid, process,
# MiB) while it runs, in order,
#   1. the gated hack test (tests/gpu.rs `every_hack_is_rejected_with_its_reason_and_the_run_goes_on`:
#      `validate` of the hand-written tasks with every case of tests/kernels/hacks/), and
#   2. `run validate` of the default task set on a fresh store (VALIDATE_LIMIT s, default 300;
#      killed 5 s after the limit: on SIGTERM a run finishes the node it is on),
# then prints the largest holding of each process kind (worker, runner, trainer, other) per
# phase and the lines of the test's failure, if any.
# Usage: OUT=out bash scripts/gpu/judge_memory.sh
set -uo pipefail
CARRY=${CARRY:-.carry}
OUT=${OUT:-out}
mkdir -p "$OUT"
B=$(mktemp -d)
for z in "$CARRY"/*.gz; do gzip -dc "$z" > "$B/$(basename "$z" .gz)" && chmod +x "$B/$(basename "$z" .gz)"; done
export LD_LIBRARY_PATH=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')/lib:${LD_LIBRARY_PATH:-}
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
export CUDARL_WORKER=$B/cudarl-pipe-worker CUDARL_RUNNER=$B/cudarl-pipe-runner CUDARL_TRAINER=$B/cudarl-pipe-train
export CUDARL_PYTHON=$(command -v python3)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt"
echo phase,time,pid,process,mib > "$OUT/gpu_memory.csv"
phase=idle
sample() {
  while :; do
    t=$(date +%s)
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader,nounits 2>/dev/null \
      | sed "s/^/$(cat "$OUT/phase"),$t,/" >> "$OUT/gpu_memory.csv"
    sleep 1
  done
}
echo idle > "$OUT/phase"
sample & S=$!
sleep 2
echo hack_test > "$OUT/phase"
t0=$(date +%s)
CUDARL_JUDGE_TRACE=$OUT/judge_trace.txt CUDARL_GPU=1 CUDARL_BIN=$B/cudarl-pipe CUDARL_TEST_REPO=$PWD timeout "${TEST_LIMIT:-200}" \
  "$B/gpu-tests" every_hack --include-ignored --test-threads 1 --nocapture > "$OUT/hack_test.log" 2>&1
echo "hack test rc=$? $(( $(date +%s) - t0 )) s" | tee "$OUT/hack_test.rc"
echo validate > "$OUT/phase"
t0=$(date +%s)
timeout -k 5 "${VALIDATE_LIMIT:-300}" "$B/cudarl-pipe" --root . --store "$B/store" run validate --json \
  > "$OUT/validate.jsonl" 2> "$OUT/validate.err"
echo "validate rc=$? $(( $(date +%s) - t0 )) s" | tee "$OUT/validate.rc"
"$B/cudarl-pipe" --root . --store "$B/store" show validate --output validations --json --head 100000 \
  2>/dev/null | python3 -c "
import json, sys, collections
rows = [json.loads(l) for l in sys.stdin]
print(len(rows), 'rows', sum(r['correct'] is True for r in rows), 'correct', collections.Counter(r['failure'] for r in rows if r['correct'] is not True))"
kill $S
python3 - "$OUT/gpu_memory.csv" <<'PY'
import csv, collections, sys
one = collections.defaultdict(int)       # (phase, kind) -> the most one process held, MiB
pids = collections.defaultdict(set)      # (phase, kind) -> processes seen
at = collections.defaultdict(int)        # (phase, kind, time) -> held together, MiB
for r in csv.DictReader(open(sys.argv[1])):
    name = r["process"].strip().rsplit("/", 1)[-1]
    kind = next((k for k in ("worker", "runner", "train", "python") if k in name), name)
    key = (r["phase"], kind)
    mib = int(r["mib"] or 0)
    one[key] = max(one[key], mib)
    pids[key].add(r["pid"])
    at[key + (r["time"],)] += mib
together = collections.defaultdict(int)
for (phase, kind, _), mib in at.items():
    together[(phase, kind)] = max(together[(phase, kind)], mib)
print(f"{'phase':10s} {'process':24s} {'n':>4s} {'one, MiB':>9s} {'together, MiB':>14s}")
for key in sorted(one):
    print(f"{key[0]:10s} {key[1]:24s} {len(pids[key]):4d} {one[key]:9d} {together[key]:14d}")
PY
grep -A8 "wrong verdicts" "$OUT/hack_test.log" | head -20
gzip -f "$OUT/judge_trace.txt" 2>/dev/null
