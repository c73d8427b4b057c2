"""Baseline of `cudarl-pipe bench decode`: greedy decoding of the same weights (the model the
trainer saved, loaded in bf16) through `transformers`' `generate` with its static KV cache and
the decode step compiled by `torch.compile(mode="reduce-overhead")` (CUDA graphs), at each batch
size, timed the way the trainer times its own paths: one untimed generation, then `reps` timed
runs of one new token (the prompts' forward pass) and of `gen_tokens` new tokens, medians, and
the allocator's peaks over them (GiB).

Usage: python bench_decode.py JOB.json  (the `bench-decode` job cudarl-pipe writes for the
trainer); prints one JSON object with one record per batch size.
"""

import json
import statistics
import sys
import time

import torch
from transformers import Qwen2ForCausalLM
from transformers.generation.configuration_utils import CompileConfig


def main() -> None:
    job = json.load(open(sys.argv[1]))
    dev = job["device"]
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    bf16 = job.get("precision", "auto") in ("bf16", "auto") and dev == "cuda"
    dtype = torch.bfloat16 if bf16 else torch.float32
    model = Qwen2ForCausalLM.from_pretrained(job["save_to"], dtype=dtype, attn_implementation="sdpa")
    model = model.to(dev).eval()
    n_new, plen, reps = max(2, job["gen_tokens"]), job["prompt_len"], max(1, job["reps"])
    compiled = dev == "cuda"
    records = []
    torch.manual_seed(0)
    for b in job["batches"]:
        ids = torch.randint(job["vocab_size"], (b, plen), device=dev)

        def run(n: int, ids: torch.Tensor = ids) -> float:
            kw = dict(
                do_sample=False,
                max_new_tokens=n,
                min_new_tokens=n,
                pad_token_id=0,
                eos_token_id=None,
                use_cache=True,
            )
            if compiled:
                kw["cache_implementation"] = "static"
                kw["compile_config"] = CompileConfig(mode="reduce-overhead", fullgraph=True)
            if dev == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            with torch.no_grad():
                out = model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
            if dev == "cuda":
                torch.cuda.synchronize()
            assert out.shape[1] == plen + n
            return time.perf_counter() - t

        if dev == "cuda":
            torch.cuda.reset_peak_memory_stats()
        run(n_new)
        run(n_new)
        pre = statistics.median(run(1) for _ in range(reps))
        full = statistics.median(run(n_new) for _ in range(reps))
        decode = max(full - pre, 1e-9)
        records.append(
            {
                "batch": b,
                "path": "transformers static cache + torch.compile(reduce-overhead)" if compiled else "transformers",
                "prefill_seconds": pre,
                "prefill_tokens_per_s": b * plen / pre,
                "decode_seconds": decode,
                "tokens_per_s": b * (n_new - 1) / decode,
                "step_ms": decode / (n_new - 1) * 1e3,
                "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30 if dev == "cuda" else None,
                "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30 if dev == "cuda" else None,
            }
        )
    import transformers

    print(
        json.dumps(
            {
                "impl": f"transformers {transformers.__version__} (torch {torch.__version__})",
                "device": dev,
                "compute_dtype": str(dtype),
                "records": records,
            }
        )
    )


if __name__ == "__main__":
    main()
