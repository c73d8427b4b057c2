#!/usr/bin/env bash
# How fast verdicts come back on a GPU host, in one detached job (/tmp/cudarl-verdict-speed):
#   1. KernelBench native candidates after their problem's first: `check --task kb/L1/<name>`
#      with REPEAT distinct copies of tests/kernels/kb_native/<name>.cu (KB_ONLY, default
#      19_ReLU) on a fresh store after `run testgen`, with this checkout's judge and, when
#      BEFORE_WORKER names another `python/cudarl_worker.py` (e.g. `git show
#      <commit>:python/cudarl_worker.py`), with that one on its own store, one after the other;
#   2. `bench serve`: SERVE_CLIENTS (16) clients for SERVE_SECONDS (30) s of distinct task kernels,
#      then a batch of BATCH (256) distinct candidates, with the first of TESTERS (default "4,1")
#      as `serve --gpu-testers`, then the same load with each later one (the baselines);
#      then 64 clients for 20 s (nothing may be lost);
#      SERVE=0 skips this part;
#   JUDGE_OPS=1: the judge's per-window operations timed at 19_ReLU's sizes, this checkout's
#      worker against BEFORE_WORKER's (scripts/gpu/judge_ops.py; judge_ops.json);
#   3. GPU_TESTS: a filter of the gated GPU tests to run (.carry/gpu-tests; default the torch-format
#      and KernelBench ones; "" skips).
# ACTION=start starts the job and waits like `wait`; ACTION=wait waits up to WAIT_S (540) s and,
# once the job is done, copies the results to $OUT and prints a table.
# Binaries: `make carry` (.carry/*.gz).
# Usage: ACTION=start OUT=out bash scripts/gpu/verdict_speed.sh
set -uo pipefail
. "$(dirname "$0")/detach.sh"
CARRY=${CARRY:-.carry}
OUT=${OUT:-out}
TESTERS=${TESTERS:-4,1}
D=/tmp/cudarl-verdict-speed
mkdir -p "$OUT"
if [ "${ACTION:-start}" = start ]; then
  rm -rf "$D"; mkdir -p "$D/bin"
  for z in "$CARRY"/*.gz; do gzip -dc "$z" > "$D/bin/$(basename "$z" .gz)"; chmod +x "$D/bin/$(basename "$z" .gz)"; done
  TORCH_LIB=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")')
  cat > "$D/job.sh" <<EOF
set -uo pipefail
export LD_LIBRARY_PATH=$TORCH_LIB:\${LD_LIBRARY_PATH:-}
export CUDARL_WORKER=$D/bin/cudarl-pipe-worker CUDARL_RUNNER=$D/bin/cudarl-pipe-runner CUDARL_PYTHON=\$(command -v python3)
B=$D/bin/cudarl-pipe
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader > $D/gpu.txt
date -u +%Y-%m-%dT%H:%MZ > $D/date.txt
cp python/cudarl_worker.py $D/worker_this.py
variants=this; [ -n "${BEFORE_WORKER:-}" ] && variants="this before"
for v in \$variants; do
  if [ \$v = before ]; then cp "${BEFORE_WORKER:-}" python/cudarl_worker.py; else cp $D/worker_this.py python/cudarl_worker.py; fi
  S=$D/store_\$v; t0=\$(date +%s%N)
  \$B --root . --store \$S run testgen --json > $D/testgen_\$v.jsonl 2> $D/testgen_\$v.err
  echo "testgen \$v rc=\$? ms=\$(( (\$(date +%s%N) - t0) / 1000000 ))" >> $D/log.txt
  for n in ${KB_ONLY:-19_ReLU}; do
    f=tests/kernels/kb_native/\$n.cu; srcs="--source \$f"; mkdir -p $D/rep
    for r in \$(seq 2 ${REPEAT:-4}); do { cat \$f; echo "// \$v candidate \$r"; } > $D/rep/\$n.\$v.\$r.cu; srcs="\$srcs --source $D/rep/\$n.\$v.\$r.cu"; done
    t1=\$(date +%s%N)
    timeout 400 \$B --root . --store \$S check --task kb/L1/\$n \$srcs --json > $D/kb_\${n}_\$v.jsonl 2> $D/kb_\${n}_\$v.err
    echo "kb \$n \$v rc=\$? ms=\$(( (\$(date +%s%N) - t1) / 1000000 ))" >> $D/log.txt
  done
done
cp $D/worker_this.py python/cudarl_worker.py
S=$D/store_this
if [ -n "${JUDGE_OPS:-}" ]; then
  t0=\$(date +%s%N)
  timeout 300 python3 scripts/gpu/judge_ops.py ${BEFORE_WORKER:+--before "$BEFORE_WORKER"} --out $D/judge_ops.json > $D/judge_ops.txt 2>&1
  echo "judge ops rc=\$? ms=\$(( (\$(date +%s%N) - t0) / 1000000 ))" >> $D/log.txt
fi
if [ "${SERVE:-1}" = 1 ]; then
t0=\$(date +%s%N)
timeout 500 \$B --root . --store \$S bench serve --clients ${SERVE_CLIENTS:-16} --seconds ${SERVE_SECONDS:-30} \
  --batch ${BATCH:-256} --gpu-testers $TESTERS --overhead-reps 3 --out $D/serve_load.json > /dev/null 2> $D/serve_load.err
echo "serve load rc=\$? ms=\$(( (\$(date +%s%N) - t0) / 1000000 ))" >> $D/log.txt
t0=\$(date +%s%N)
timeout 300 \$B --root . --store \$S bench serve --clients 64 --seconds 20 --overhead-reps 1 \
  --gpu-testers ${TESTERS%%,*} --out $D/serve_64.json > /dev/null 2> $D/serve_64.err
echo "serve 64 rc=\$? ms=\$(( (\$(date +%s%N) - t0) / 1000000 ))" >> $D/log.txt
fi
if [ -n "${GPU_TESTS-torch_format kernelbench_native a_fault_in_one_runner torch_ops_standing_in}" ]; then
  for t in ${GPU_TESTS-torch_format kernelbench_native a_fault_in_one_runner torch_ops_standing_in}; do
    t0=\$(date +%s%N)
    CUDARL_GPU=1 CUDARL_BIN=\$B CUDARL_TEST_REPO=\$PWD timeout 400 $D/bin/gpu-tests --include-ignored --test-threads 1 \$t > $D/gpu_test_\$t.txt 2>&1
    echo "gpu-test \$t rc=\$? ms=\$(( (\$(date +%s%N) - t0) / 1000000 ))" >> $D/log.txt
  done
fi
touch $D/done
EOF
  start_detached "$D"
fi
wait_done "$D" "${WAIT_S:-540}"
cat "$D/log.txt" 2>/dev/null
[ -f "$D/done" ] || { echo "running: $(tail -c 300 "$D/log")"; exit 0; }
cp "$D"/*.txt "$D"/*.json "$D"/kb_*.jsonl "$OUT"/ 2>/dev/null
python3 - "$D" <<'PY'
import json, pathlib, sys
d = pathlib.Path(sys.argv[1])
print("gpu:", (d / "gpu.txt").read_text().strip(), (d / "date.txt").read_text().strip())
for f in sorted(d.glob("kb_*.jsonl")):
    for i, line in enumerate(x for x in f.read_text().splitlines() if x.strip()):
        v = json.loads(line)
        w = v.get("worker_ms") or {}
        print(f"{f.stem:28} #{i} correct={v.get('correct')} total={w.get('total', 0):7.0f} "
              f"timing={w.get('timing', 0):6.0f} full={w.get('full_size', 0):6.0f} "
              f"build_s={v.get('compile_seconds')} speedup={v.get('speedup_vs_torch')}")
        parts = {k[7:]: round(x) for k, x in w.items() if k.startswith("timing_")}
        if parts:
            print(f"{'':28}    timing parts ms {parts}")
        parts = {k[10:]: round(x) for k, x in w.items() if k.startswith("full_size_") and k != "full_size_wait"}
        if parts:
            print(f"{'':28}    full-size parts ms {parts}")
if (d / "judge_ops.txt").exists():
    print((d / "judge_ops.txt").read_text())
for name in ("serve_load", "serve_64"):
    p = d / f"{name}.json"
    if not p.exists():
        print(name, "missing:", (d / f"{name}.err").read_text()[-300:])
        continue
    r = json.loads(p.read_text())
    for x in [r] + r.get("baselines", []):
        print(f"{name} testers={x['gpu_testers']} ok={x['ok']} correct={x.get('correct')} "
              f"lost={x['lost']} v/s={x['verdicts_per_second']:.2f} p50={x['latency_ms']['p50']:.0f} "
              f"p90={x['latency_ms']['p90']:.0f} ratio={x.get('measured_over_baseline')}")
    if r.get("batch"):
        b = r["batch"]
        print(f"{name} batch n={b['candidates']} first={b['first_line_seconds']:.1f}s "
              f"all={b['seconds']:.1f}s statuses={b['statuses']} once={b['answered_once']}")
for f in sorted(d.glob("gpu_test_*.txt")):
    tail = [x for x in f.read_text().splitlines() if x.startswith("test result") or "FAILED" in x]
    print(f.stem, tail[-3:])
PY
