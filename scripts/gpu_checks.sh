#!/usr/bin/env bash
# GPU checks of the kernel harness (issue 3), run on the GPU machine in one call:
#   naive and optimized kernels of every task pass on all seeds and hold-out shapes, optimized
#   beats naive, timing the same kernel twice agrees, every reward hack in
#   tests/kernels/hacks/ is rejected with the expected reason and the run goes on, and compile
#   times (cold and cache hit). Writes $OUT/gpu_checks.json and prints a table last.
# Usage: BIN=.carry/cudarl-pipe OUT=out bash scripts/gpu_checks.sh
set -uo pipefail
BIN=${BIN:-.carry/cudarl-pipe}
OUT=${OUT:-out}
mkdir -p "$OUT"
W=$(mktemp -d)
if ! command -v nvcc >/dev/null; then
  for d in /usr/local/cuda/bin /usr/local/cuda-13.0/bin; do [ -x "$d/nvcc" ] && export PATH="$d:$PATH"; done
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader > "$W/gpu.txt" 2>&1
nvcc --version | tail -1 > "$W/nvcc.txt"
STORE="$W/store"
run_check() { # name task source [extra args]
  local name=$1 task=$2 src=$3; shift 3
  local t0=$(date +%s%N)
  timeout 300 "$BIN" --root . --store "$STORE" check --task "$task" --source "$src" --json "$@" > "$W/$name.json" 2> "$W/$name.err"
  echo $? > "$W/$name.rc"
  echo "$(( ($(date +%s%N) - t0) / 1000000 ))e-3" > "$W/$name.wall"
}
for task in vector_add row_sum; do
  run_check "${task}__naive" "$task" "datasets/tasks/$task/naive.cu"
  for f in $(python3 -c "import tomllib;print(' '.join(tomllib.load(open('datasets/tasks/$task/task.toml','rb'))['optimized']))"); do
    run_check "${task}__${f%.cu}" "$task" "datasets/tasks/$task/$f"
    run_check "${task}__${f%.cu}__again" "$task" "datasets/tasks/$task/$f"
  done
done
for f in tests/kernels/hacks/*.cu; do
  n=$(basename "$f" .cu)
  run_check "hack__$n" vector_add "$f" --timeout 10 --no-bench
done
# Cold compiles (5 distinct sources, fresh store) and a cache hit.
for i in 1 2 3 4 5; do
  (cat datasets/tasks/row_sum/warp_shuffle.cu; echo "// variant $i") > "$W/variant_$i.cu"
  "$BIN" --root . --store "$W/store2" check --task row_sum --source "$W/variant_$i.cu" --mode compile --json > "$W/compile_$i.json"
done
t0=$(date +%s%N)
"$BIN" --root . --store "$W/store2" check --task row_sum --source "$W/variant_1.cu" --mode compile --json > "$W/compile_hit.json"
echo "$(( ($(date +%s%N) - t0) / 1000000 ))e-3" > "$W/compile_hit.wall"
# The validate stage on the GPU (cold store): kernels per hour.
t0=$(date +%s%N)
"$BIN" --root . --store "$W/vstore" run validate --json > "$W/validate_run.jsonl" 2> "$W/validate_run.err"
echo "$(( ($(date +%s%N) - t0) / 1000000 ))e-3" > "$W/validate_run.wall"
"$BIN" --root . --store "$W/vstore" show validate --json --head 100 > "$W/validate_rows.jsonl" 2>/dev/null
# torch.utils.cpp_extension.load_inline on the same vector_add kernel, cold, for comparison.
python3 scripts/load_inline_timing.py > "$W/load_inline.json" 2> "$W/load_inline.err"
python3 scripts/gpu_summary.py "$W" "$OUT"
