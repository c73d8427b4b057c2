#!/usr/bin/env bash
# Real model sizes on one GPU (binaries from `make carry`): `bench train-throughput` (SFT-shaped
# training steps, bf16 with float32 master weights, against transformers eager on the same
# random weights) and `bench decode` (the trainer's generation against transformers) for the
# published Qwen2.5-Coder shapes (configs/model/qwen2.5-coder-*.toml). Peak GPU memory per
# process (ours: cudarl-pipe-train; the baseline: python3) is sampled by nvidia-smi every 200 ms.
# A size that does not fit is recorded as such (exit status and the last error line).
# TRAIN_FLAGS: more `bench train-throughput` flags (e.g. --gradient-checkpointing, --weights
# bf16-kahan, --lora-r 16). SKIP_DECODE=1: training only. GEN_BATCHES, GEN_TOKENS: the
# training bench's own short generation check (default 1,32 and 128). SKIP_TRAIN=1: decode only.
# DECODE_PATHS: the trainer's decode paths measured (default all; `graphs` alone makes the
# process's peak that path's).
# Usage: SIZES="0.5b 1.5b 7b" OUT=out bash scripts/gpu/model_scale.sh
set -uo pipefail
CARRY=${CARRY:-.carry}
OUT=${OUT:-out}
SIZES=${SIZES:-0.5b 1.5b 7b}
TRAIN_BS=${TRAIN_BS:-8}
SEQ=${SEQ:-1024}
STEPS=${STEPS:-10}
B=/tmp/cudarl-bin
mkdir -p "$B" "$OUT"
for z in "$CARRY"/*.gz; do [ -e "$z" ] && gzip -dc "$z" > "$B/$(basename "$z" .gz)" && chmod +x "$B/$(basename "$z" .gz)"; done
export CUDARL_WORKER=$B/cudarl-pipe-worker CUDARL_TRAINER=$B/cudarl-pipe-train
export LD_LIBRARY_PATH=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')/lib:${LD_LIBRARY_PATH:-}
export CUDARL_PYTHON=$(command -v python3)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1
python3 -c 'import transformers, torch; print("transformers", transformers.__version__, "torch", torch.__version__)' > "$OUT/versions.txt" 2>&1
# peak MiB per process name over the run of "$@"
with_peak() {
  local tag=$1; shift
  ( while :; do nvidia-smi --query-compute-apps=process_name,used_memory --format=csv,noheader,nounits 2>/dev/null; sleep 0.2; done ) > "$OUT/$tag.mem" &
  local poll=$!
  local t0=$(date +%s)
  "$@" > "$OUT/$tag.log" 2>&1
  local rc=$?
  kill $poll 2>/dev/null; wait $poll 2>/dev/null
  echo "$tag rc=$rc $(( $(date +%s) - t0 ))s" >> "$OUT/times.txt"
}
for s in $SIZES; do
  m=qwen2.5-coder-$s
  bs=$TRAIN_BS; [ "$s" = 7b ] && bs=${TRAIN_BS_7B:-1}
  [ "${SKIP_TRAIN:-0}" = 1 ] || with_peak "train_$s" timeout ${TRAIN_LIMIT:-240} "$B/cudarl-pipe" --root . --profile none bench train-throughput \
    --model $m --device cuda --batch-size $bs --seq-len $SEQ --steps $STEPS --gen-batches ${GEN_BATCHES:-1,32} --gen-tokens ${GEN_TOKENS:-128} ${TRAIN_FLAGS:-} \
    --out "$OUT/train_$s.json"
  [ "${SKIP_DECODE:-0}" = 1 ] && continue
  with_peak "decode_$s" timeout ${DECODE_LIMIT:-240} "$B/cudarl-pipe" --root . --profile none bench decode \
    --model $m --device cuda --batches ${DECODE_BATCHES:-1,32,128} --prompt-len 512 --gen-tokens 256 --reps 2 ${DECODE_PATHS:+--paths $DECODE_PATHS} \
    --out "$OUT/decode_$s.json"
done
python3 - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
def peaks(tag):
    p = {}
    for line in open(os.path.join(out, tag + ".mem")) if os.path.exists(os.path.join(out, tag + ".mem")) else []:
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[1].isdigit():
            name = os.path.basename(parts[0])
            p[name] = max(p.get(name, 0), int(parts[1]))
    return p
summary = {}
for f in sorted(glob.glob(os.path.join(out, "*.log"))):
    tag = os.path.basename(f)[:-4]
    j = os.path.join(out, tag + ".json")
    r = {"peak_mib": peaks(tag)}
    if os.path.exists(j):
        d = json.load(open(j))
        if tag.startswith("train"):
            r.update(params=d["ours"].get("parameters"), ours_tok_s=d["ours"].get("train_tokens_per_s"),
                     base_tok_s=d["baseline"].get("train_tokens_per_s"), train_ratio=d.get("train_ratio"),
                     gen_ratio=d.get("generate_ratio"))
        else:
            r.update(rows=d.get("rows"))
    else:
        r["error"] = [l for l in open(f).read().splitlines() if l.strip()][-3:]
    summary[tag] = r
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
for k, v in summary.items():
    print(k, json.dumps({a: b for a, b in v.items() if a != "rows"})[:400])
    for r in v.get("rows") or []:
        print("  b=%s tok/s %s vs %s (%s), peak alloc GiB %s vs %s" % (
            r["batch"], r.get("tokens_per_s"), r.get("transformers_tokens_per_s"),
            r.get("speedup_vs_transformers"), r.get("peak_allocated_gib"),
            r.get("transformers_peak_allocated_gib")))
PY
cat "$OUT/times.txt"
