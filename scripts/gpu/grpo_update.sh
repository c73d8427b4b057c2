#!/usr/bin/env bash
# One GRPO update per published Qwen2.5-Coder size and mode (python/bench_grpo_update.py): this
# project's RL trainer (binaries from `make carry`) beside the same update in transformers, and
# PEFT for LoRA, on the same random bf16 checkpoint. Each size's checkpoint is written once to
# /tmp and removed after its last run.
# RUNS: "size:mode[:ck] ..." (default "0.5b:full 0.5b:lora 1.5b:full 1.5b:lora 7b:lora"); `:ck`
# adds activation checkpointing on both sides. MINIBATCH: completions per AdamW step (8).
# BASELINE_AGENTS=2: in full mode the baseline also holds a second agent, as ours does (names
# end in _2agents).
# ACTION=start runs it detached (log in $OUT/run.log); ACTION=wait waits up to WAIT_S seconds for
# it and prints the table; default: both, in turn.
# Usage: OUT=out bash scripts/gpu/grpo_update.sh
set -uo pipefail
CARRY=${CARRY:-.carry}
OUT=${OUT:-out}
RUNS=${RUNS:-0.5b:full 0.5b:lora 1.5b:full 1.5b:lora 7b:lora}
W=/tmp/grpo-update
B=/tmp/cudarl-bin
mkdir -p "$B" "$OUT" "$W"
if [ "${ACTION:-all}" != wait ]; then
  for z in "$CARRY"/*.gz; do [ -e "$z" ] && gzip -dc "$z" > "$B/$(basename "$z" .gz)" && chmod +x "$B/$(basename "$z" .gz)"; done
  export LD_LIBRARY_PATH=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')/lib:${LD_LIBRARY_PATH:-}
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1
  rm -f "$W/done"
  export W OUT RUNS B MINIBATCH BASELINE_AGENTS
  setsid bash -c '
    set -u
    python3 tests/python/make_checkpoint.py "$W/tok" > /dev/null 2>&1
    prev=""
    for run in $RUNS; do
      IFS=: read -r size mode ck <<< "$run"
      flags=""; name="${size}_$mode"
      [ "$ck" = ck ] && flags="--gradient-checkpointing" && name="${name}_ck"
      if [ "${BASELINE_AGENTS:-1}" = 2 ] && [ "$mode" = full ]; then
        flags="$flags --baseline-agents 2"; name="${name}_2agents"
      fi
      if [ "$size" != "$prev" ]; then
        [ -n "$prev" ] && rm -rf "$W/$prev"
        python3 python/bench_grpo_update.py checkpoint --size $size --tokenizer-from "$W/tok" --out "$W/$size" > "$OUT/checkpoint_$size.log" 2>&1
        prev=$size
      fi
      t0=$(date +%s)
      timeout ${LIMIT:-420} python3 python/bench_grpo_update.py measure --train "$B/cudarl-pipe-train" \
        --checkpoint "$W/$size" --mode $mode --minibatch ${MINIBATCH:-8} $flags \
        --out "$OUT/grpo_$name.json" > "$OUT/grpo_$name.log" 2>&1
      echo "$run rc=$? $(( $(date +%s) - t0 ))s" >> "$OUT/times.txt"
    done
    rm -rf "$W/$prev"
    touch "$W/done"
  ' > "$OUT/run.log" 2>&1 < /dev/null &
fi
[ "${ACTION:-all}" = start ] && exit 0
end=$(( $(date +%s) + ${WAIT_S:-560} ))
while [ ! -e "$W/done" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
cat "$OUT/times.txt" 2>/dev/null
python3 - "$OUT" <<'PY'
import glob, json, os, sys
for f in sorted(glob.glob(os.path.join(sys.argv[1], "grpo_*.json"))):
    if f.endswith(".job.json"):
        continue
    r = json.load(open(f))
    o, t = r["ours"], r["transformers"]
    print(f"{os.path.basename(f):24s} ours {o['update_seconds']:7.2f} s {o['peak_gib']:6.1f} GiB"
          f" | transformers {t.get('update_seconds', float('nan')):7.2f} s {t['peak_gib']:6.1f} GiB"
          f" | speed x{r.get('speed_vs_transformers', float('nan')):.2f} gen {o['generate_tokens_per_s']:.0f} tok/s")
PY
