#!/usr/bin/env bash
# GPU checks of the kernel harness on a GPU host (binaries from `make carry`), one part per
# invocation, each under ten minutes:
#   PART=tests  the gated GPU tests (tests/gpu.rs): every task family's naive and optimized
#               kernels pass on all seeds and hold-out shapes, optimized beats naive, the same
#               kernel timed twice agrees within 2%, every reward hack in tests/kernels/hacks/ is
#               rejected with its reason inside one validate run that goes on; then the judge's
#               and the trainer's library tests, whose GPU tests are gated (torch-tests: the
#               comparison kernel against libtorch; train-tests: the fused AdamW, decoding);
#   PART=shard  sharded validation with GPU verdicts: `run validate` whole vs two shards (run at
#               the same time, separate stores, one shared cache) + `--merge` on a third store;
#               the merged table must equal the whole run's;
#   PART=serve  `bench serve`: the HTTP service under load (64 clients, 60 s) and its overhead vs `check`;
#   PART=bench  cold compiles and a cache hit, `run validate` over every task kernel (speedups vs
#               naive and vs torch), `bench validate` (kernels/hour), load_inline for comparison.
# Carry (built on the CPU machine by `make carry`): .carry/{cudarl-pipe,cudarl-pipe-worker,gpu-tests,torch-tests,train-tests}.gz
# Usage: PART=tests OUT=out bash scripts/gpu/checks.sh
set -uo pipefail
CARRY=${CARRY:-.carry}
OUT=${OUT:-out}
PART=${PART:-tests}
mkdir -p "$OUT"
W=$OUT/work
mkdir -p "$W"
B=$(mktemp -d)
for z in "$CARRY"/*.gz; do [ -e "$z" ] && gzip -dc "$z" > "$B/$(basename "$z" .gz)" && chmod +x "$B/$(basename "$z" .gz)"; done
BIN=$B/cudarl-pipe
export CUDARL_WORKER=$B/cudarl-pipe-worker
# The worker loads libtorch: use the host's torch wheel.
export LD_LIBRARY_PATH=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')/lib:${LD_LIBRARY_PATH:-}
if ! command -v nvcc >/dev/null; then
  for d in /usr/local/cuda/bin /usr/local/cuda-13.0/bin; do [ -x "$d/nvcc" ] && export PATH="$d:$PATH"; done
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader > "$W/gpu.txt" 2>&1
nvcc --version | tail -1 > "$W/nvcc.txt"
ms() { echo "$(( ($(date +%s%N) - $1) / 1000000 ))e-3"; }
if [ "$PART" = curriculum ]; then
  # `make curriculum` on the GPU host: the whole chain into the default store (artifacts/,
  # kept between invocations on the same host), cold then cached; a run cut by a time limit
  # resumes from the row memos and the compile cache.
  t0=$(date +%s%N)
  s0=$(date +%s)
  timeout ${CURRICULUM_LIMIT:-540} "$BIN" --root . run curriculum kb-specs testgen 2>&1 \
    | while IFS= read -r l; do echo "$(( $(date +%s) - s0 ))s $l"; done > "$W/curriculum_run.err"
  echo "${PIPESTATUS[0]}" > "$W/curriculum.rc"
  ms $t0 > "$W/curriculum_cold.wall"
  if [ "$(cat "$W/curriculum.rc")" = 0 ]; then
    t0=$(date +%s%N)
    "$BIN" --root . run curriculum kb-specs testgen --json > "$W/curriculum_cached.jsonl" 2>/dev/null
    ms $t0 > "$W/curriculum_cached.wall"
    "$BIN" --root . show validate --output agreement --json --head 100000 > "$W/agreement.jsonl" 2>/dev/null
    "$BIN" --root . show validate --output validations --json --head 100000 > "$W/validations.jsonl" 2>/dev/null
    "$BIN" --root . show testgen --output kb_testgen --json --head 100000 > "$W/kb_testgen.jsonl" 2>/dev/null
    "$BIN" --root . export validate --to "$W/validate_export" > /dev/null 2>&1
  fi
  # KernelBench references of every covered problem on the GPU (testgen with device = cuda).
  if [ -n "${REFS_ON_GPU:-}" ]; then
    t0=$(date +%s%N)
    "$BIN" --root . --store "$B/refstore" run testgen --set 'testgen.device="cuda"' --json > "$W/testgen_cuda.jsonl" 2> "$W/testgen_cuda.err"
    ms $t0 > "$W/testgen_cuda.wall"
    "$BIN" --root . --store "$B/refstore" show testgen --output kb_testgen --json --head 1000 > "$W/kb_testgen_cuda.jsonl" 2>/dev/null
  fi
elif [ "$PART" = serve ]; then
  # `serve` under load on loopback (bench serve: SERVE_CLIENTS clients for SERVE_SECONDS s,
  # distinct kernels, full mode on the GPU), and the HTTP path vs `check`.
  t0=$(date +%s%N)
  timeout ${SERVE_LIMIT:-500} "$BIN" --root . bench serve --clients ${SERVE_CLIENTS:-64} --seconds ${SERVE_SECONDS:-60} \
    --out "$OUT/serve_bench.json" > /dev/null 2> "$W/serve_bench.err"
  echo "serve bench rc=$? $(( ($(date +%s%N) - t0) / 1000000 )) ms"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: d[k] for k in ['requests','ok','rejected_429','lost','duplicated','wrong_task_in_verdict','server_verdicts','verdicts_per_second','latency_ms']}); print({k: v for k, v in d['overhead'].items() if not isinstance(v, list)})" "$OUT/serve_bench.json"
  tail -3 "$W/serve_bench.err"
  exit 0
elif [ "$PART" = shard ]; then
  SET="--set validate.archive=${SHARD_ARCHIVE:-false}"
  export CUDARL_HIDDEN_SALT=gpu-shard-check
  t0=$(date +%s%N)
  "$BIN" --root . --store "$B/whole" run validate $SET --json > "$W/shard_whole.jsonl" 2> "$W/shard_whole.err"
  ms $t0 > "$W/shard_whole.wall"
  unset CUDARL_HIDDEN_SALT
  # The job's salt in the shared cache (as the first machine of a job would publish it).
  mkdir -p "$B/shared" && echo -n gpu-shard-check > "$B/shared/hidden-salt"
  t0=$(date +%s%N)
  "$BIN" --root . --store "$B/s0" --shared-cache "$B/shared" run validate --shard 0/2 $SET --json > "$W/shard_0.jsonl" 2> "$W/shard_0.err" &
  "$BIN" --root . --store "$B/s1" --shared-cache "$B/shared" run validate --shard 1/2 $SET --json > "$W/shard_1.jsonl" 2> "$W/shard_1.err" &
  wait
  ms $t0 > "$W/shard_both.wall"
  t0=$(date +%s%N)
  "$BIN" --root . --store "$B/s2" --shared-cache "$B/shared" run validate --merge $SET --json > "$W/shard_merge.jsonl" 2> "$W/shard_merge.err"
  ms $t0 > "$W/shard_merge.wall"
  CUDARL_HIDDEN_SALT=gpu-shard-check "$BIN" --root . --store "$B/whole" show validate --output validations --json --head 100000 $SET > "$W/rows_whole.jsonl" 2>/dev/null
  "$BIN" --root . --store "$B/s2" --shared-cache "$B/shared" show validate --output validations --json --head 100000 $SET > "$W/rows_merge.jsonl" 2>/dev/null
  python3 - "$W" <<'PY' > "$W/shard_summary.json"
import json, sys, pathlib
w = pathlib.Path(sys.argv[1])
def rec(name):
    for l in (w / name).read_text().splitlines():
        r = json.loads(l)
        if r["node"] == "validate":
            return r
    return {}
whole, s0, s1, merge = (rec(n) for n in ["shard_whole.jsonl", "shard_0.jsonl", "shard_1.jsonl", "shard_merge.jsonl"])
h = lambda r: r.get("outputs", {}).get("validations", {}).get("hash")
def rows(f):
    return {r["kernel_id"]: r for r in map(json.loads, (w / f).read_text().splitlines())}
a, b = rows("rows_whole.jsonl"), rows("rows_merge.jsonl")
cols = list(next(iter(a.values())).keys()) if a else []
diff = {c: sum(1 for k in a if a[k].get(c) != b.get(k, {}).get(c)) for c in cols}
ratios = [b[k]["speedup_vs_naive"] / a[k]["speedup_vs_naive"] for k in a
          if k in b and a[k].get("speedup_vs_naive") and b[k].get("speedup_vs_naive")]
print(json.dumps({
    "whole": {"status": whole.get("status"), "stats": whole.get("stats"), "hash": h(whole), "seconds": whole.get("seconds")},
    "shard_0": {"status": s0.get("status"), "stats": s0.get("stats"), "seconds": s0.get("seconds")},
    "shard_1": {"status": s1.get("status"), "stats": s1.get("stats"), "seconds": s1.get("seconds")},
    "merge": {"status": merge.get("status"), "stats": merge.get("stats"), "hash": h(merge), "seconds": merge.get("seconds"), "error": merge.get("error")},
    "merged_equals_whole": h(whole) is not None and h(whole) == h(merge),
    "columns_differing": diff,
    "correct": [sum(1 for r in a.values() if r.get("correct")), sum(1 for r in b.values() if r.get("correct"))],
    "speedup_vs_naive_ratio_merge_over_whole": sorted(ratios)[len(ratios) // 2] if ratios else None,
}, indent=1))
PY
  cat "$W/shard_summary.json"
elif [ "$PART" = tests ]; then
  t0=$(date +%s%N)
  # TESTS: name filters (all gated tests without).
  CUDARL_GPU=1 CUDARL_BIN=$BIN CUDARL_TEST_REPO=$PWD timeout ${LIMIT:-540} "$B/gpu-tests" --include-ignored --test-threads 1 ${TESTS:-} > "$W/gpu_tests.log" 2>&1
  echo $? > "$W/gpu_tests.rc"
  ms $t0 > "$W/gpu_tests.wall"
  for t in torch-tests train-tests; do
    [ -x "$B/$t" ] || continue
    CUDARL_GPU=1 timeout 300 "$B/$t" --test-threads 1 > "$W/$t.log" 2>&1
    echo $? > "$W/$t.rc"
  done
else
  # Cold compiles (5 distinct sources, fresh store) and a cache hit.
  for i in 1 2 3 4 5; do
    (cat datasets/tasks/row_sum/warp_shuffle.cu; echo "// variant $i") > "$B/variant_$i.cu"
    "$BIN" --root . --store "$B/store2" check --task row_sum --source "$B/variant_$i.cu" --mode compile --json > "$W/compile_$i.json"
  done
  t0=$(date +%s%N)
  "$BIN" --root . --store "$B/store2" check --task row_sum --source "$B/variant_1.cu" --mode compile --json > "$W/compile_hit.json"
  ms $t0 > "$W/compile_hit.wall"
  # The validate stage over every task kernel (cold store).
  t0=$(date +%s%N)
  "$BIN" --root . --store "$B/vstore" run validate --json > "$W/validate_run.jsonl" 2> "$W/validate_run.err"
  ms $t0 > "$W/validate_run.wall"
  "$BIN" --root . --store "$B/vstore" show validate --json --head 1000 > "$W/validate_rows.jsonl" 2>/dev/null
  # Throughput on many distinct kernels.
  "$BIN" --root . bench validate --kernels ${BENCH_KERNELS:-480} --out "$W/bench_validate.json" > /dev/null 2> "$W/bench_validate.err"
  # torch.utils.cpp_extension.load_inline on the same vector_add kernel, cold, for comparison.
  timeout 150 python3 scripts/gpu/load_inline_timing.py > "$W/load_inline.json" 2> "$W/load_inline.err"
fi
python3 scripts/gpu/summary.py "$W" "$OUT"
