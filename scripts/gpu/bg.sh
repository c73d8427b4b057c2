#!/usr/bin/env bash
# Runs scripts/gpu/train.sh PART=all detached (setsid) on a GPU host, so one experiment
# outlasts the shell that started it; later shells on the same host wait for it and collect
# it. Results go to /tmp/cudarl-run/work.
#   ACTION=start  starts it (same environment knobs as train.sh), then waits like `wait`
#   ACTION=wait   waits up to WAIT_S seconds (default 560) for it to finish, printing progress
#   ACTION=collect copies the results (small files) to $OUT
set -uo pipefail
D=/tmp/cudarl-run
ACTION=${ACTION:-wait}
if [ "$ACTION" = start ]; then
  rm -rf "$D"; mkdir -p "$D"
  setsid nohup env OUT="$D" PART=all SKIP_BENCH=1 SFT_LIMIT=${SFT_LIMIT:-1200} RL_LIMIT=${RL_LIMIT:-1500} \
    bash -c 'bash scripts/gpu/train.sh; touch /tmp/cudarl-run/done' > "$D/log" 2>&1 < /dev/null &
  ACTION=wait
fi
if [ "$ACTION" = wait ]; then
  end=$(( $(date +%s) + ${WAIT_S:-560} ))
  while [ ! -f "$D/done" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 10; done
  echo "done: $([ -f "$D/done" ] && echo yes || echo no)"
  cat "$D/work/times.txt" 2>/dev/null
  # rl-train's progress: the last step lines of its log
  grep -ho '"step":[0-9]*' "$D/work/rl_run.jsonl" 2>/dev/null | tail -1
  tail -c 600 "$D/log"
fi
if [ "$ACTION" = collect ]; then
  W=$D/work
  cp "$W"/times.txt "$W"/gpu.txt "$W"/rl_metrics.jsonl "$W"/rl_tiers.jsonl "$W"/eval_summary.jsonl "$OUT"/ 2>/dev/null
  cp "$W"/sft_eval.jsonl "$OUT"/ 2>/dev/null
  [ -f "$W/export/eval/report/report.md" ] && cp "$W/export/eval/report/report.md" "$OUT/eval_report.md"
  ls -la "$OUT"
fi
