"""Baseline of `cudarl-pipe bench train-throughput`: the same Qwen2 architecture, batch and
steps in PyTorch eager through `transformers` (Qwen2ForCausalLM, SDPA attention), with the
same recipe as cudarl-train's trainer: bf16 autocast with float32 master weights on CUDA
(float32 on CPU), AdamW, global gradient-norm clipping at 1.0, every step ending with a host
read of the loss (as cudarl-train does). Then greedy generation with the KV cache at each batch
size, no early stop.

Usage: python bench_transformers.py JOB.json  (the `bench` job cudarl-pipe writes for the
trainer); prints one JSON object.
"""

import json
import sys
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def qwen2_config(spec: dict, vocab_size: int) -> Qwen2Config:
    """transformers' config of an architecture as `configs/model/*.toml`'s `[model]` gives it."""
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=spec["hidden_size"],
        intermediate_size=spec["intermediate_size"],
        num_hidden_layers=spec["num_hidden_layers"],
        num_attention_heads=spec["num_attention_heads"],
        num_key_value_heads=spec["num_key_value_heads"],
        max_position_embeddings=spec["max_position_embeddings"],
        tie_word_embeddings=spec.get("tie_word_embeddings", True),
        rope_theta=spec.get("rope_theta", 10000.0),
        use_sliding_window=False,
    )


def main() -> None:
    job = json.load(open(sys.argv[1]))
    spec = job["model"]
    dev = job["device"]
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    prec = job.get("precision", "auto")
    bf16 = prec == "bf16" or (prec == "auto" and dev == "cuda")
    cfg = qwen2_config(spec, job["vocab_size"])
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    lora = job.get("lora")
    # Initialized where it runs (a 7B model's random init on the CPU takes minutes). A LoRA
    # base under autocast is created in bf16, as `from_pretrained(torch_dtype=torch.bfloat16)`
    # loads it, so no float32 copy of the frozen base is in the peak (as on our side).
    dtype = torch.bfloat16 if lora and bf16 else torch.float32
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(dev):
            model = Qwen2ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(default)
    # bf16 weights (`weights` other than f32): the model held in bf16, torch's AdamW on it
    # (bf16 moments, round to nearest), no autocast.
    narrow = job.get("weights", "f32") != "f32"
    if narrow:
        model = model.to(torch.bfloat16)
        bf16 = False
    # LoRA (`lora`): PEFT's adapters on all seven projections of the base held in bf16 (float32
    # adapters, PEFT's default), under autocast as ours.
    if lora:
        from peft import LoraConfig, get_peft_model

        if bf16:
            model = model.to(torch.bfloat16)
        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        peft_cfg = LoraConfig(r=lora["r"], lora_alpha=lora["alpha"], target_modules=targets, lora_dropout=0.0)
        model = get_peft_model(model, peft_cfg)
    model.train()
    if job.get("gradient_checkpointing"):
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    bs, n, steps, warm = job["batch_size"], job["seq_len"], job["steps"], job["warmup_steps"]
    data = torch.randint(job["vocab_size"], (steps + warm, bs, n), device=dev)

    def step(ids: torch.Tensor) -> float:
        with torch.autocast(device_type="cuda" if dev == "cuda" else "cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model(input_ids=ids, labels=ids)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        return out.loss.item()

    for i in range(warm):
        step(data[i])
    t0 = time.perf_counter()
    for i in range(warm, warm + steps):
        step(data[i])
    secs = time.perf_counter() - t0
    if lora:
        model = model.merge_and_unload()
    model.eval()
    gens = {}
    for b in (b for b in job["gen_batches"] if b > 0):
        prompts = torch.randint(job["vocab_size"], (b, job["prompt_len"]), device=dev)
        kw = dict(
            do_sample=False,
            max_new_tokens=job["gen_tokens"],
            min_new_tokens=job["gen_tokens"],
            pad_token_id=0,
            eos_token_id=None,
            use_cache=True,
        )
        with (
            torch.no_grad(),
            torch.autocast(device_type="cuda" if dev == "cuda" else "cpu", dtype=torch.bfloat16, enabled=bf16),
        ):
            model.generate(prompts, **{**kw, "max_new_tokens": 4, "min_new_tokens": 4})
            if dev == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            out = model.generate(prompts, **kw)
            if dev == "cuda":
                torch.cuda.synchronize()
            s = time.perf_counter() - t
        new = (out.shape[1] - prompts.shape[1]) * b
        gens[str(b)] = {"new_tokens": new, "seconds": s, "tokens_per_s": new / s}
    print(
        json.dumps(
            {
                "impl": f"transformers {__import__('transformers').__version__} eager (torch {torch.__version__})",
                "device": dev,
                "compute_dtype": "bfloat16" if bf16 or narrow else "float32",
                "weights": "bf16" if narrow else "f32",
                "parameters": sum(p.numel() for p in model.parameters()),
                "trainable_parameters": sum(p.numel() for p in trainable),
                "batch_size": bs,
                "seq_len": n,
                "timed_steps": steps,
                "train_seconds": secs,
                "train_tokens_per_s": steps * bs * n / secs,
                "generate": gens,
            }
        )
    )


if __name__ == "__main__":
    main()
