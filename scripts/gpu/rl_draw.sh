#!/usr/bin/env bash
# One SFT draw of the pre-registered RL comparison (scripts/rl_learning.py) on a GPU host without
# a Rust toolchain (binaries from `make carry`), detached with setsid so it outlasts the command
# that started it; later commands on the same host follow it and collect it:
#   1. the chain up to both SFT checkpoints (and their cross-agent fine-tunes with COLLAB=1) on a
#      cold store, or on SEED_STORE's copy (scripts/gpu/main_job.sh),
#   2. STEPS RL steps with the frozen control, then eval (scripts/gpu/rl_resume.sh with EVAL=1 from
#      that store, as one command without a time cut).
#   ACTION=start  starts it, then waits like `wait`
#   ACTION=wait   waits up to WAIT_S seconds (default 540) printing progress; once it has finished,
#                 writes $OUT/draw.tar.gz (the RUN_DIR of scripts/rl_learning.py: rl_metrics.jsonl,
#                 export/eval/report/ with comparison.json), $OUT/rl_resume.json and
#                 $OUT/main_job.json
#   DRAW       the draw's seed (pretrain, sft-train and sft-train-optimizer; default 1)
#   STEPS      RL steps (default 50)
#   COLLAB     1 (default): also the cross-agent fine-tunes (collab-sft, collab-sft-optimizer) and
#              their checkpoint in eval (eval.collab=true); 0: SFT and RL alone
#   SETS       further `--set` values, space-separated, the same in every draw of a comparison;
#              the comparison's own are always given: rl-train.control=true (the frozen control
#              on the same task sequence and seeds), splits.holdout_generated=0.33 (about 150
#              generated hold-out families of 460) and eval.samples=4 (about 640 episodes a
#              checkpoint, paired by seed)
#   SEED_STORE a store the draw starts from (hard-linked; its cached nodes do not run again)
#   DRAWS      several draws at once on a host of several GPUs, e.g. DRAWS="1 2 3": the nodes no
#              draw seed reaches (ingest, compile, validate, sft-repairs, tokenizer, sft-data) run
#              once, validate in one shard per draw's GPU (`run validate --shard k/N` with a
#              shared cache, then `--merge`) beside each draw's pretrain on its GPU and
#              sft-repairs; then draw k of the list runs on GPU k-1
#              (CUDA_VISIBLE_DEVICES) from that store, in its own copy of the working tree under
#              /tmp/cudarl-gpu<k-1>/ (CUDARL_HOST_TMP of the scripts it runs); `wait` waits for
#              all of them and writes $OUT/draw<N>.tar.gz for each finished one (the RUN_DIR plus
#              main_job.json and rl_resume.json). Compile and validate are nvcc- and CPU-bound:
#              four cold chains at once on a 64-core, 4-GPU H200 host were still in validate
#              after 13 minutes, where one alone on 16 cores is through it in 3.5.
#   PIN        with DRAWS: 1 (default) pins draw k to the k-th equal share of the host's cores
#              (taskset), 0 leaves them unpinned (four unpinned RL runs on a 64-core host were at
#              least twice as slow as one alone on a 16-core host; two pinned ones on a 32-core
#              host with two H200s ran as fast as one alone: docs/experiments.md)
#   FINAL=1    with DRAWS: also packs the draws not finished yet (what they have: the RL metrics
#              of a run that is evaluating), for a host about to go back
# A draw alone takes about 25 minutes on an H200 (SFT chain 290 s, collab-data and its fine-tunes
# 140 s, 50 steps with the control 670 s, eval of three checkpoints on the hold-out 260 s); with
# COLLAB=0 about 20. Everything lives under /tmp on the host: collect it there before it goes.
set -uo pipefail
. "$(dirname "$0")/detach.sh"
ACTION=${ACTION:-wait}
COLLAB=${COLLAB:-1}
# The comparison's settings without the draw seed.
COMMON="rl-train.control=true splits.holdout_generated=0.33 eval.samples=4 ${SETS:-}"
[ "$COLLAB" = 1 ] && COMMON="eval.collab=true $COMMON"
if [ -n "${DRAWS:-}" ]; then
  M=/tmp/cudarl-draws
  if [ "$ACTION" = shared ]; then
    # Run detached by `start`: the nodes no draw seed reaches, once, then every draw from them.
    export CUDARL_WORKER=$M/bin/cudarl-pipe-worker CUDARL_TRAINER=$M/bin/cudarl-pipe-train
    LD_LIBRARY_PATH=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')/lib:${LD_LIBRARY_PATH:-}
    export LD_LIBRARY_PATH
    command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
    CUDARL_PYTHON=$(command -v python3)
    export CUDARL_PYTHON
    EXTRA=()
    for kv in $COMMON; do EXTRA+=(--set "$kv"); done
    # `cudarl-pipe` on store $1 with lock file $2 (every process its own: runs at once must not
    # write one lock file), the rest its arguments.
    pipe() {
      local s=$1 l=$2; shift 2
      "$M/bin/cudarl-pipe" --root . --store "$s" --lock "$l" "$@" "${EXTRA[@]}" --json
    }
    # A hard-linked copy of store $1 at $2 (the store replaces files by rename, never in place)
    # without the locks of the runs that made it.
    copy() { cp -al "$1" "$2" && rm -rf "$2/locks"; }
    date +%s > "$M/start"
    set -- $DRAWS
    G=$#
    # 1. The inputs every later step shares (synth-tasks, tokenizer: seconds).
    CUDA_VISIBLE_DEVICES=0 pipe "$M/store" "$M/tokenizer.lock" run tokenizer > "$M/run.jsonl" 2> "$M/run.err"
    # 2. At once: validate in G shards, shard k on GPU k (the rows pooled in $M/shared), each
    #    draw's pretrain on its GPU (the same GPU lock as the shard's: timing stays exclusive),
    #    and sft-repairs (nvcc only) in the shared store.
    k=0
    for n in $DRAWS; do
      copy "$M/store" "$M/v$k"
      copy "$M/store" "$M/p$k"
      CUDA_VISIBLE_DEVICES=$k pipe "$M/v$k" "$M/v$k.lock" --shared-cache "$M/shared" run validate --shard "$k/$G" \
        > "$M/v$k.jsonl" 2> "$M/v$k.err" &
      CUDA_VISIBLE_DEVICES=$k pipe "$M/p$k" "$M/p$k.lock" run pretrain --set "pretrain.seed=$n" \
        > "$M/p$k.jsonl" 2> "$M/p$k.err" &
      k=$((k + 1))
    done
    CUDA_VISIBLE_DEVICES=0 pipe "$M/store" "$M/repairs.lock" run sft-repairs >> "$M/run.jsonl" 2>> "$M/run.err" &
    wait
    echo "validate shards, pretrain, sft-repairs: $(( $(date +%s) - $(cat "$M/start") )) s" > "$M/times.txt"
    # 3. The validate table from the shards' rows, then sft-data.
    CUDA_VISIBLE_DEVICES=0 pipe "$M/store" "$M/cudarl.lock" --shared-cache "$M/shared" run validate --merge \
      >> "$M/run.jsonl" 2>> "$M/run.err"
    CUDA_VISIBLE_DEVICES=0 pipe "$M/store" "$M/cudarl.lock" run sft-data >> "$M/run.jsonl" 2>> "$M/run.err"
    rc=$?
    echo "shared nodes: $(( $(date +%s) - $(cat "$M/start") )) s rc=$rc" >> "$M/times.txt"
    # 4. Each draw from the shared store plus its own pretrain, pinned to its share of the cores
    #    (taskset): its nvcc builds, judges and trainer size their thread pools from the cores
    #    they may use, as on a host of that many cores, instead of each sizing them to the whole
    #    host (PIN=0: unpinned).
    C=$(( $(nproc) / G ))
    k=0
    for n in $DRAWS; do
      PINNED=()
      [ "${PIN:-1}" = 1 ] && [ "$C" -ge 1 ] && PINNED=(taskset -c "$((k * C))-$((k * C + C - 1))")
      h=/tmp/cudarl-gpu$k
      mkdir -p "$h/repo"
      copy "$M/store" "$M/seed$k"
      cp -aln "$M/p$k/." "$M/seed$k/" && rm -rf "$M/seed$k/locks"
      tar --exclude=./.git -cf - . | tar -xf - -C "$h/repo"
      (cd "$h/repo" && DRAWS='' CUDA_VISIBLE_DEVICES=$k CUDARL_HOST_TMP=$h DRAW=$n SEED_STORE=$M/seed$k \
        ACTION=start WAIT_S=0 OUT=$h/out "${PINNED[@]}" bash scripts/gpu/rl_draw.sh > "$h/start.log" 2>&1)
      k=$((k + 1))
    done
    touch "$M/started"
    exit 0
  fi
  if [ "$ACTION" = start ]; then
    rm -rf "$M" /tmp/cudarl-gpu[0-9]*; mkdir -p "$M/bin"
    for z in .carry/*.gz; do gzip -dc "$z" > "$M/bin/$(basename "$z" .gz)"; chmod +x "$M/bin/$(basename "$z" .gz)"; done
    ACTION=shared setsid nohup bash scripts/gpu/rl_draw.sh > "$M/log" 2>&1 < /dev/null &
    sleep 1
  fi
  [ -d "$M" ] || { echo "no draws on this host: start them (ACTION=start)"; exit 3; }
  end=$(( $(date +%s) + ${WAIT_S:-540} ))
  while [ "$(date +%s)" -lt "$end" ]; do
    left=0
    [ -f "$M/started" ] || left=1
    for h in /tmp/cudarl-gpu[0-9]*/; do [ -f "$h/cudarl-draw/done" ] || left=1; done
    [ $left = 0 ] && break
    sleep 5
  done
  cat "$M/times.txt" 2>/dev/null || {
    echo "shared nodes running: $(( $(date +%s) - $(cat "$M/start" 2>/dev/null || date +%s) )) s"
    tail -c 400 "$M/run.err" 2>/dev/null
  }
  k=0
  for n in $DRAWS; do
    h=/tmp/cudarl-gpu$k
    k=$((k + 1))
    [ -f "$h/cudarl-draw/job.sh" ] || continue
    echo "== draw $n on GPU $((k - 1))"
    (cd "$h/repo" && DRAWS='' CUDARL_HOST_TMP=$h ACTION=wait WAIT_S=0 OUT=$h/out bash scripts/gpu/rl_draw.sh 2>&1 | tail -n 12)
    # The RL run's latest saved step and its metrics rows (stage.json of its saved progress,
    # docs/architecture.md "Resuming"; kilobytes, where the entry's trainer state is gigabytes).
    st=$(ls -t "$h"/cudarl-resume/store/memo/rl-train-progress/*/*/stage.json 2>/dev/null | head -1)
    [ -n "$st" ] && python3 -c 'import json,sys; print("RL saved step", json.load(open(sys.argv[1]))["step"])' "$st"
    if [ -f "$h/cudarl-draw/done" ] || [ "${FINAL:-0}" = 1 ]; then
      mkdir -p "$h/pack/draw" "$OUT"
      cp -r "$h/cudarl-draw/resume/draw/." "$h/pack/draw/" 2>/dev/null
      [ -f "$h/pack/draw/rl_metrics.jsonl" ] || [ ! -f "$h/cudarl-resume/metrics.jsonl" ] ||
        cp "$h/cudarl-resume/metrics.jsonl" "$h/pack/draw/rl_metrics.jsonl"
      # An RL run still going: the rows of its last save, marked partial.
      [ -f "$h/pack/draw/rl_metrics.jsonl" ] || [ -z "$st" ] ||
        python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); [print(json.dumps(r)) for r in d["rows"]]; print(d["step"], file=open(sys.argv[2], "w"))' \
          "$st" "$h/pack/draw/partial_step.txt" > "$h/pack/draw/rl_metrics.jsonl"
      cp "$h/cudarl-draw/main/main_job.json" "$h/cudarl-draw/resume/rl_resume.json" "$h/pack/draw/" 2>/dev/null
      tar czf "$OUT/draw$n.tar.gz" -C "$h/pack" draw
    fi
  done
  exit 0
fi
H=${CUDARL_HOST_TMP:-/tmp}
D=$H/cudarl-draw
if [ "$ACTION" = start ]; then
  rm -rf "$D" "$H/cudarl-resume"; mkdir -p "$D"
  N=${DRAW:-1}
  S="$COMMON pretrain.seed=$N sft-train.seed=$N sft-train-optimizer.seed=$N"
  TARGETS="sft-train sft-train-optimizer"
  [ "$COLLAB" = 1 ] && TARGETS="collab-sft collab-sft-optimizer"
  echo "$S" > "$D/sets.txt"
  cat > "$D/job.sh" <<EOF
set -uo pipefail
date +%s > $D/start
OUT=$D/main ACTION=start WAIT_S=100000 MAIN_TARGETS="$TARGETS" SEED_STORE="${SEED_STORE:-}" SETS="$S" bash scripts/gpu/main_job.sh > $D/main.log 2>&1
OUT=$D/resume FROM_STORE=$H/cudarl-main/store STEPS=${STEPS:-50} BUDGET_S=100000 SETS="$S" EVAL=1 bash scripts/gpu/rl_resume.sh > $D/resume.log 2>&1
date +%s > $D/end
touch $D/done
EOF
  start_detached "$D"
  ACTION=wait
fi
if [ "$ACTION" = wait ]; then
  wait_done "$D" "${WAIT_S:-540}"
  echo "sets: $(cat "$D/sets.txt")"
  echo "done: $([ -f "$D/done" ] && echo yes || echo no); elapsed $(( $(date +%s) - $(cat "$D/start") )) s"
  cat "$H/cudarl-main/times.txt" 2>/dev/null
  tail -c 600 "$H/cudarl-main/run.err" 2>/dev/null
  # The RL run's latest progress lines (steps, saves).
  ls "$H"/cudarl-resume/run_*.err >/dev/null 2>&1 && tail -n 4 "$(ls -t "$H"/cudarl-resume/run_*.err | head -1)"
  if [ -f "$D/done" ]; then
    mkdir -p "$OUT"
    cp "$D/main/main_job.json" "$OUT/" 2>/dev/null
    cp "$D/resume/rl_resume.json" "$OUT/" 2>/dev/null
    cat "$D/resume/draw/eval_rc.txt" 2>/dev/null
    tail -c 800 "$H/cudarl-resume/eval.err" 2>/dev/null
    [ -d "$D/resume/draw" ] && tar czf "$OUT/draw.tar.gz" -C "$D/resume" draw
    cat "$D/resume/draw/export/eval/report/comparison.json" 2>/dev/null
  fi
fi
