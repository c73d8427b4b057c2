#!/usr/bin/env bash
# One device call: `bench train-throughput --model small` (decoding and training tokens/s of the
# tch model vs transformers eager, same run) and `run sft-eval` on a cold store (the sampling
# job batches every prompt's samples together since 2026-11-23), with per-target times.
# Results in $OUT: train_throughput.json, times.txt, sft_eval.jsonl.
set -uo pipefail
CARRY=${CARRY:-.carry}; B=/tmp/cudarl-bin; mkdir -p "$B"
for z in "$CARRY"/*.gz; do gzip -dc "$z" > "$B/$(basename "$z" .gz)"; chmod +x "$B/$(basename "$z" .gz)"; done
export CUDARL_WORKER=$B/cudarl-pipe-worker CUDARL_TRAINER=$B/cudarl-pipe-train
export LD_LIBRARY_PATH=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')/lib:${LD_LIBRARY_PATH:-}
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
export CUDARL_PYTHON=$(command -v python3)
if ! python3 -c 'import transformers' 2>/dev/null && [ -d "$CARRY/wheels" ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/pylib "$CARRY"/wheels/*.whl > /dev/null 2>&1
  export PYTHONPATH=/tmp/pylib:${PYTHONPATH:-}
fi
S=/tmp/cudarl-dc; rm -rf $S
for t in validate sft-data tokenizer pretrain sft-train sft-eval; do
  t0=$(date +%s)
  $B/cudarl-pipe --root . --store $S run $t --json >> $OUT/run.jsonl 2>> $OUT/run.err
  echo "$t $(( $(date +%s) - t0 ))s rc=$?" | tee -a $OUT/times.txt
done
$B/cudarl-pipe --root . --store $S show sft-eval --output sft_eval --json --head 100 > $OUT/sft_eval.jsonl
t0=$(date +%s)
timeout 200 $B/cudarl-pipe --root . bench train-throughput --model small --out $OUT/train_throughput.json > $OUT/bench.log 2>&1
echo "bench $(( $(date +%s) - t0 ))s" | tee -a $OUT/times.txt
python3 -c "
import json; d=json.load(open('$OUT/train_throughput.json'))
print('train ratio', round(d['train_ratio'],3), 'gen ratio', d['generate_ratio'])
for k in ('ours','baseline'): print(k, {b: round(v['tokens_per_s'],1) for b,v in d[k]['generate'].items()}, round(d[k]['train_tokens_per_s']))
"
tail -3 $OUT/run.err
