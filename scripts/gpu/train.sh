#!/usr/bin/env bash
# Model training on a GPU host (binaries from `make carry`), one part per invocation, each under
# ten minutes:
#   PART=sft    `bench train-throughput` (tch model vs transformers eager, same batch), then the
#               pipeline up to sft-eval with the `small` model (validation compile-only to fit
#               ten minutes: the synthetic kernels' GPU correctness is checked by scripts/gpu/checks.sh)
#   PART=rl     rl-train and eval with `small` on the same store (same host, same store);
#               a run cut by RL_LIMIT keeps what finished (cached): run again for the rest
# Carry (built by `make carry`, plus Python wheels of transformers in .carry/wheels for the
# baseline when the host's python lacks it).
#   PART=all    both, one after the other (what scripts/gpu/bg.sh runs in the background, to
#               outlast the shell that started it)
# RL_SETS: extra `--set` values for every stage, space-separated (e.g. "rl-train.lr=1e-5
#   rl-train.warmup=6"); every invocation of one experiment must give the same value.
# Usage: PART=sft OUT=out bash scripts/gpu/train.sh
set -uo pipefail
CARRY=${CARRY:-.carry}
OUT=${OUT:-out}
PART=${PART:-sft}
W=$OUT/work
mkdir -p "$W"
B=/tmp/cudarl-bin
mkdir -p "$B"
for z in "$CARRY"/*.gz; do [ -e "$z" ] && gzip -dc "$z" > "$B/$(basename "$z" .gz)" && chmod +x "$B/$(basename "$z" .gz)"; done
BIN=$B/cudarl-pipe
export CUDARL_WORKER=$B/cudarl-pipe-worker CUDARL_TRAINER=$B/cudarl-pipe-train
export LD_LIBRARY_PATH=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')/lib:${LD_LIBRARY_PATH:-}
if ! command -v nvcc >/dev/null; then
  for d in /usr/local/cuda/bin /usr/local/cuda-13.0/bin; do [ -x "$d/nvcc" ] && export PATH="$d:$PATH"; done
fi
export CUDARL_PYTHON=$(command -v python3)
if ! python3 -c 'import transformers' 2>/dev/null && [ -d "$CARRY/wheels" ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/pylib "$CARRY"/wheels/*.whl > "$W/pip.log" 2>&1
  export PYTHONPATH=/tmp/pylib:${PYTHONPATH:-}
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader > "$W/gpu.txt" 2>&1
SMALL=(--set 'tokenizer.model="small"' --set 'pretrain.model="small"' --set 'sft-train.model="small"'
       --set 'sft-train-optimizer.model="small"' --set 'validate.mode="compile"')
# RL_STEPS: rl-train steps (every PART=rl invocation of one experiment must give the same value)
[ -n "${RL_STEPS:-}" ] && SMALL+=(--set "rl-train.steps=$RL_STEPS")
# GEN_FAMILIES: that many generated elementwise families (and GEN_ROWS row reductions, 160 by
# default), 20 SFT rows per family, 4 per optimizer pair, 3% of the generated families held out
[ -n "${GEN_FAMILIES:-}" ] && SMALL+=(--set "synth-tasks.generate={elementwise=$GEN_FAMILIES,row_reduce=${GEN_ROWS:-160},seed=0}"
  --set 'sft-data.per_family=20' --set 'sft-data.optimizer_per_pair=4' --set 'splits.holdout_generated=0.03')
for kv in ${RL_SETS:-}; do SMALL+=(--set "$kv"); done
ts() { date +%s; }
if [ "$PART" = sft ] || [ "$PART" = all ]; then
  t0=$(ts)
  if [ -z "${SKIP_BENCH:-}" ]; then
    timeout 150 "$BIN" --root . bench train-throughput --model small --out "$W/train_throughput.json" > "$W/bench.log" 2>&1
    echo "bench $(( $(ts) - t0 ))s rc=$?" >> "$W/times.txt"
  fi
  t0=$(ts)
  timeout ${SFT_LIMIT:-560} "$BIN" --root . run sft-train sft-train-optimizer sft-eval "${SMALL[@]}" --json > "$W/sft_run.jsonl" 2> "$W/sft_run.err"
  echo "sft $(( $(ts) - t0 ))s rc=$?" >> "$W/times.txt"
  for o in metrics plots; do "$BIN" --root . show sft-train --output $o --json --head 100000 "${SMALL[@]}" > "$W/sft_$o.jsonl" 2>/dev/null; done
  "$BIN" --root . show pretrain --output metrics --json --head 100000 "${SMALL[@]}" > "$W/pretrain_metrics.jsonl" 2>/dev/null
  "$BIN" --root . show sft-eval --output sft_eval --json --head 1000 "${SMALL[@]}" > "$W/sft_eval.jsonl" 2>/dev/null
  "$BIN" --root . export sft-train --output plots --to "$W/export" "${SMALL[@]}" > /dev/null 2>&1
fi
if [ "$PART" = rl ] || [ "$PART" = all ]; then
  # rl-train first (cached once done, so a call cut during eval keeps it), then eval.
  start=$(ts)
  timeout ${RL_LIMIT:-560} "$BIN" --root . run rl-train "${SMALL[@]}" --json > "$W/rl_run.jsonl" 2> "$W/rl_run.err"
  rc=$?; echo "rl-train $(( $(ts) - start ))s rc=$rc" >> "$W/times.txt"
  left=$(( ${RL_LIMIT:-560} - ($(ts) - start) ))
  if [ $rc = 0 ] && [ $left -gt 30 ]; then
    t0=$(ts)
    timeout $left "$BIN" --root . run eval "${SMALL[@]}" --json > "$W/eval_run.jsonl" 2> "$W/eval_run.err"
    echo "eval $(( $(ts) - t0 ))s rc=$?" >> "$W/times.txt"
  fi
  "$BIN" --root . show rl-train --output turns --json --head 100000 "${SMALL[@]}" > "$W/rl_turns.jsonl" 2>/dev/null
  "$BIN" --root . show rl-train --output metrics --json --head 100000 "${SMALL[@]}" > "$W/rl_metrics.jsonl" 2>/dev/null
  "$BIN" --root . show rl-train --output tiers --json --head 100 "${SMALL[@]}" > "$W/rl_tiers.jsonl" 2>/dev/null
  "$BIN" --root . show eval --output summary --json --head 100 "${SMALL[@]}" > "$W/eval_summary.jsonl" 2>/dev/null
  "$BIN" --root . export eval --output report --to "$W/export" "${SMALL[@]}" > /dev/null 2>&1
  "$BIN" --root . export rl-train --output plots --to "$W/export" "${SMALL[@]}" > /dev/null 2>&1
fi
echo "--- $PART"; cat "$W/times.txt"; tail -3 "$W"/*.err 2>/dev/null | cut -c1-300
