#!/usr/bin/env bash
# One SFT draw of the pre-registered RL comparison (scripts/rl_learning.py) on a GPU host without
# a Rust toolchain (binaries from `make carry`), detached with setsid so it outlasts the command
# that started it; later commands on the same host follow it and collect it:
#   1. the chain up to both SFT checkpoints and their cross-agent fine-tunes on a cold store
#      (scripts/gpu_main_job.sh with MAIN_TARGETS="collab-sft collab-sft-optimizer"),
#   2. STEPS RL steps with the frozen control, then eval (scripts/gpu_rl_resume.sh with EVAL=1 from
#      that store, as one command without a time cut).
#   ACTION=start  starts it, then waits like `wait`
#   ACTION=wait   waits up to WAIT_S seconds (default 540) printing progress; once it has finished,
#                 writes $OUT/draw.tar.gz (the RUN_DIR of scripts/rl_learning.py: rl_metrics.jsonl,
#                 export/eval.report/ with comparison.json), $OUT/rl_resume.json and
#                 $OUT/main_job.json
#   DRAW      the draw's seed (pretrain, sft-train and sft-train-optimizer; default 1)
#   STEPS     RL steps (default 50)
#   SETS      further `--set` values, space-separated, the same in every draw of a comparison;
#             the comparison's own are always given: rl-train.control=true (the frozen control on
#             the same task sequence and seeds), sft-data.holdout_generated=0.33 (about 150
#             generated hold-out families of 460), eval.samples=4 (about 640 episodes a
#             checkpoint, paired by seed) and eval.collab=true (the cross-agent fine-tuned
#             checkpoints beside SFT and RL)
# The whole draw takes about 25 minutes on an H200 (SFT chain 290 s, collab-data and its
# fine-tunes 140 s, 50 steps with the control 670 s, eval of three checkpoints on the hold-out
# 260 s). Everything lives under /tmp on the host: collect it there before the host goes.
set -uo pipefail
D=/tmp/cudarl-draw
ACTION=${ACTION:-wait}
if [ "$ACTION" = start ]; then
  rm -rf "$D" /tmp/cudarl-resume; mkdir -p "$D"
  N=${DRAW:-1}
  S="rl-train.control=true sft-data.holdout_generated=0.33 eval.samples=4 eval.collab=true pretrain.seed=$N sft-train.seed=$N sft-train-optimizer.seed=$N ${SETS:-}"
  echo "$S" > "$D/sets.txt"
  cat > "$D/job.sh" <<EOF
set -uo pipefail
date +%s > $D/start
OUT=$D/main ACTION=start WAIT_S=100000 MAIN_TARGETS="collab-sft collab-sft-optimizer" SETS="$S" bash scripts/gpu_main_job.sh > $D/main.log 2>&1
OUT=$D/resume FROM_STORE=/tmp/cudarl-main/store STEPS=${STEPS:-50} BUDGET_S=100000 SETS="$S" EVAL=1 bash scripts/gpu_rl_resume.sh > $D/resume.log 2>&1
date +%s > $D/end
touch $D/done
EOF
  bash -n "$D/job.sh" || { echo "$D/job.sh does not parse: fix scripts/gpu_rl_draw.sh"; exit 2; }
  setsid nohup bash "$D/job.sh" > "$D/log" 2>&1 < /dev/null &
  ACTION=wait
fi
if [ "$ACTION" = wait ]; then
  [ -f "$D/job.sh" ] || { echo "no draw on this host: start one (ACTION=start)"; exit 3; }
  end=$(( $(date +%s) + ${WAIT_S:-540} ))
  while [ ! -f "$D/done" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
  echo "sets: $(cat "$D/sets.txt")"
  echo "done: $([ -f "$D/done" ] && echo yes || echo no); elapsed $(( $(date +%s) - $(cat "$D/start") )) s"
  cat /tmp/cudarl-main/times.txt 2>/dev/null
  tail -c 600 /tmp/cudarl-main/run.err 2>/dev/null
  # The RL run's latest progress lines (steps, saves).
  ls /tmp/cudarl-resume/run_*.err >/dev/null 2>&1 && tail -n 4 "$(ls -t /tmp/cudarl-resume/run_*.err | head -1)"
  if [ -f "$D/done" ]; then
    mkdir -p "$OUT"
    cp "$D/main/main_job.json" "$OUT/" 2>/dev/null
    cp "$D/resume/rl_resume.json" "$OUT/" 2>/dev/null
    cat "$D/resume/draw/eval_rc.txt" 2>/dev/null
    tail -c 800 /tmp/cudarl-resume/eval.err 2>/dev/null
    [ -d "$D/resume/draw" ] && tar czf "$OUT/draw.tar.gz" -C "$D/resume" draw
    cat "$D/resume/draw/export/eval.report/comparison.json" 2>/dev/null
  fi
fi
