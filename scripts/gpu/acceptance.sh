#!/usr/bin/env bash
# The GPU acceptance of the harness and the pipeline on a GPU host (binaries from `make carry`),
# detached with setsid so it outlasts the shell that started it; results under /tmp/cudarl-acc:
#   tests/    the gated GPU tests (scripts/gpu/checks.sh PART=tests)
#   hacks/    every adversarial and honest kernel with its verdict (scripts/gpu/harness_checks.sh
#             PART=hacks)
#   bench/    `bench validate` and `bench serve` with this build and, when $OLD holds another
#             build's binaries and $OLD_ROOT its tree, with that one too (PART=bench): the cost of
#             the judge/runner split as a ratio in one run
#   main/     `run rl-train eval` in full mode, small: the CPU data set of `make run` (48 + 16
#             generated families), the tiny model, 2 RL steps of 16 episodes, 1 eval sample
# ACTION=start starts it and waits; ACTION=wait waits up to WAIT_S seconds (default 540);
# ACTION=collect copies the results to $OUT and prints the summaries.
set -uo pipefail
D=/tmp/cudarl-acc
ACTION=${ACTION:-wait}
if [ "$ACTION" = start ]; then
  rm -rf "$D"; mkdir -p "$D"
  setsid nohup bash -c '
    D=/tmp/cudarl-acc
    OUT=$D/tests PART=tests bash scripts/gpu/checks.sh > "$D/tests.log" 2>&1
    OUT=$D/hacks PART=hacks bash scripts/gpu/harness_checks.sh > "$D/hacks.log" 2>&1
    OUT=$D/bench PART=bench KERNELS=${KERNELS:-32} BENCH_LIMIT=${BENCH_LIMIT:-200} SERVE_SECONDS=15 \
      SERVE_LIMIT=90 bash scripts/gpu/harness_checks.sh > "$D/bench.log" 2>&1
    B=$(mktemp -d)
    for z in .carry/*.gz; do gzip -dc "$z" > "$B/$(basename "$z" .gz)"; chmod +x "$B/$(basename "$z" .gz)"; done
    export LD_LIBRARY_PATH=$(python3 -c "import torch,os;print(os.path.dirname(torch.__file__))")/lib:${LD_LIBRARY_PATH:-}
    mkdir -p "$D/main"
    t0=$(date +%s)
    M="--set synth-tasks.generate.elementwise=48 --set synth-tasks.generate.row_reduce=16"
    M="$M --set sft-data.per_family=150 --set splits.holdout_generated=0.15 --set eval.samples=1"
    M="$M --set rl-train.steps=2 --set rl-train.tasks_per_step=4 --set rl-train.group_size=4"
    M="$M --set rl-train.minibatch=8 --set pretrain.model=tiny --set sft-train.model=tiny"
    M="$M --set sft-train-optimizer.model=tiny"
    timeout ${MAIN_LIMIT:-420} "$B/cudarl-pipe" --root . --store "$D/main/store" run rl-train eval $M --json \
      > "$D/main/run.jsonl" 2> "$D/main/run.err"
    echo "rc=$? wall_s=$(( $(date +%s) - t0 ))" > "$D/main/rc.txt"
    for t in rl-train.metrics rl-train.tiers eval.summary; do
      "$B/cudarl-pipe" --root . --store "$D/main/store" show ${t%.*} --output ${t#*.} --json --head 100 $M \
        > "$D/main/$t.jsonl" 2>/dev/null
    done
    touch "$D/done"' > "$D/log" 2>&1 < /dev/null &
  ACTION=wait
fi
if [ "$ACTION" = wait ]; then
  end=$(( $(date +%s) + ${WAIT_S:-540} ))
  while [ ! -f "$D/done" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 10; done
  echo "done: $([ -f "$D/done" ] && echo yes || echo no)"
  ls "$D"
  tail -c 400 "$D/log"
fi
if [ "$ACTION" = collect ] || [ -f "$D/done" ]; then
  mkdir -p "$OUT"
  for p in tests hacks bench main; do
    [ -d "$D/$p" ] || continue
    mkdir -p "$OUT/$p"
    find "$D/$p" -maxdepth 2 -type f -size -4M ! -path "*/store/*" -exec cp {} "$OUT/$p/" \;
  done
  cp "$D"/*.log "$OUT/" 2>/dev/null
  tail -5 "$OUT/tests/gpu_tests.log" 2>/dev/null
  tail -3 "$OUT/hacks/hacks_summary.txt" 2>/dev/null
  cat "$OUT/bench/bench_summary.txt" 2>/dev/null
  cat "$OUT/main/rc.txt" 2>/dev/null
fi
