"""One GRPO update's time and peak GPU memory at a published Qwen2.5-Coder size: this project's RL
trainer (`cudarl-pipe-train`, an `rl-serve` job driven over its stdin protocol) beside the same
update written with transformers (and PEFT for LoRA), in the same run, on the same random
weights and the same prompt and completion lengths.

The update (both sides): for every minibatch the sampling policy's and the frozen reference's
log-probabilities of the completion tokens without gradients, then per minibatch the policy's
with gradients, the clipped-ratio loss (clip 0.2) plus 0.04 x the k3 KL to the reference
(Shao et al. 2024, arXiv:2402.03300), backward, global-norm clipping at 1.0 and AdamW (lr 1e-5,
betas 0.9/0.95). The LM head runs on the completion positions only. `full`: float32 weights and
AdamW state, bf16 compute, the reference a frozen float32 copy; this project's trainer holds both
agents (generator and optimizer) and their references, as `rl-train` does, the baseline one agent.
`lora`: the base in bf16, frozen, float32 adapters on all seven projections, the reference the
base with the adapters off; this project's two agents share the one base.
`--gradient-checkpointing`: activation checkpointing on both sides (ours: the job's
`gradient_checkpointing`; transformers: `gradient_checkpointing_enable()`, non-reentrant).
`--baseline-agents 2` (full mode): the baseline also holds a second agent as ours does, a float32
model with its AdamW state (allocated by a zero-learning-rate step) and its float32 reference,
idle during the update, so the two processes' memory holds the same agents.

Usage:
  python bench_grpo_update.py checkpoint --size 7b --tokenizer-from DIR --out DIR
  python bench_grpo_update.py measure --train BIN --checkpoint DIR --mode lora --out JSON
      [--completions 32 --prompt-words 60 --max-new-tokens 512 --minibatch 8 --lora-r 16
       --lora-alpha 32 --gradient-checkpointing --baseline-agents 2]

`checkpoint` writes a random bf16 checkpoint of `configs/model/qwen2.5-coder-<size>.toml`'s
architecture with the tokenizer files of DIR (`tests/python/make_checkpoint.py` makes one);
`measure` runs both sides, each in its own process (peak memory is the process's, read from
nvidia-smi every 0.1 s), and writes one JSON object.
"""

import argparse
import json
import shutil
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SYSTEM = "You write CUDA kernels."
PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
CLIP, KL_COEF, LR, GRAD_CLIP = 0.2, 0.04, 1e-5, 1.0


def published_config(size):
    """transformers' Qwen2Config of `configs/model/qwen2.5-coder-<size>.toml`."""
    from bench_transformers import qwen2_config

    t = tomllib.loads((ROOT / f"configs/model/qwen2.5-coder-{size}.toml").read_text())
    return qwen2_config(t["model"], t["tokenizer"]["vocab_size"])


def make_checkpoint(args):
    import torch
    from transformers import Qwen2ForCausalLM

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = published_config(args.size)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(args.device):
        model = Qwen2ForCausalLM(cfg).eval()
    model.save_pretrained(out, safe_serialization=True, max_shard_size="4GB")
    for f in ["tokenizer.json", "tokenizer_config.json"]:
        shutil.copy(Path(args.tokenizer_from) / f, out / f)
    params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"size": args.size, "params": params}))


class PeakMemory:
    """The largest GPU memory nvidia-smi reports for process `pid`, MiB, polled every 0.1 s."""

    def __init__(self, pid):
        self.pid, self.peak, self.stop = pid, 0, threading.Event()
        self.thread = threading.Thread(target=self.poll, daemon=True)
        self.thread.start()

    def poll(self):
        if shutil.which("nvidia-smi") is None:
            return
        q = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
        while not self.stop.is_set():
            out = subprocess.run(q, capture_output=True, text=True).stdout
            for line in out.splitlines():
                parts = [x.strip() for x in line.split(",")]
                if len(parts) == 2 and parts[0] == str(self.pid) and parts[1].isdigit():
                    self.peak = max(self.peak, int(parts[1]))
            time.sleep(0.1)

    def finish(self):
        self.stop.set()
        self.thread.join()
        return self.peak / 1024.0


def prompt_text(words):
    return "Write a CUDA kernel for this operation. " + " ".join(["float"] * words)


def prompt_ids(checkpoint, words):
    """The rendered ChatML prompt's token ids (system, user, generation prompt)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(checkpoint) / "tokenizer.json"))
    text = (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{prompt_text(words)}"
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    return tok.encode(text, add_special_tokens=False).ids


def ours(args):
    """Two rounds of generate + update through the trainer's protocol; the second is timed."""
    lora = {"r": args.lora_r, "alpha": args.lora_alpha} if args.mode == "lora" else None
    job = {
        "kind": "rl-serve",
        "generator": args.checkpoint,
        "optimizer": args.checkpoint,
        "generator_system": SYSTEM,
        "optimizer_system": SYSTEM,
        "device": args.device,
        "lr": LR,
        "pg": {"clip": CLIP, "kl_coef": KL_COEF},
        "minibatch": args.minibatch,
        "warmup": 0,
    }
    if lora:
        job["lora"] = lora
    if args.gradient_checkpointing:
        job["gradient_checkpointing"] = True
    jp = Path(args.out).with_suffix(".job.json")
    jp.write_text(json.dumps(job))
    log = open(Path(args.out).with_suffix(".trainer.log"), "w")
    p = subprocess.Popen([args.train, str(jp)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
    mem = PeakMemory(p.pid)

    def ask(req):
        p.stdin.write(json.dumps(req) + "\n")
        p.stdin.flush()
        while True:
            line = p.stdout.readline()
            if not line:
                raise SystemExit(f"trainer exited; see {log.name}")
            r = json.loads(line)
            if "partial" not in r:
                return r

    t0 = time.time()
    first = json.loads(p.stdout.readline())
    assert first == "ready" or "ready" in str(first), first
    load_s = time.time() - t0
    rounds = []
    for rnd in range(2):
        g = ask(
            {
                "op": "generate",
                "agent": "generator",
                "conversations": [[{"role": "user", "content": prompt_text(args.prompt_words)}]] * args.completions,
                "max_new_tokens": args.max_new_tokens,
                "temperature": 1.0,
                "top_p": 1.0,
                "seed": rnd,
            }
        )
        if "generated" not in g:
            raise SystemExit(f"generate: {g}")
        comps = g["generated"]["completions"]
        samples = [{"id": c["id"], "advantage": 1.0 if i % 2 == 0 else -1.0} for i, c in enumerate(comps)]
        u = ask({"op": "update", "agent": "generator", "samples": samples})
        if "updated" not in u:
            raise SystemExit(f"update: {u}")
        tokens = [c["tokens"] for c in comps]
        rounds.append(
            {
                "generate_gpu_memory": g["generated"].get("gpu_memory"),
                "generate_seconds": g["generated"]["seconds"],
                "completion_tokens": tokens,
                "update": u["updated"],
            }
        )
    p.stdin.write(json.dumps({"op": "quit"}) + "\n")
    p.stdin.close()
    p.wait()
    last = rounds[-1]
    return {
        "load_seconds": load_s,
        "update_seconds": last["update"]["seconds"],
        "update_steps": last["update"]["steps"],
        "update_tokens": last["update"]["tokens"],
        "generate_seconds": last["generate_seconds"],
        "generate_tokens_per_s": sum(last["completion_tokens"]) / last["generate_seconds"],
        "completion_tokens": last["completion_tokens"],
        "peak_gib": mem.finish(),
        "rounds": [{"update_seconds": r["update"]["seconds"]} for r in rounds],
        # libtorch's allocator during the timed round's requests (bytes; absent on a CPU).
        "generate_gpu_memory": last["generate_gpu_memory"],
        "update_gpu_memory": last["update"].get("gpu_memory"),
    }


def baseline(args):
    """The same update in transformers (+ PEFT), in this process; prints one JSON object."""
    import torch
    from transformers import AutoModelForCausalLM

    lengths = json.loads(args.lengths)
    prompt = prompt_ids(args.checkpoint, args.prompt_words)
    dev = torch.device(args.device)
    load = dict(attn_implementation="sdpa")
    if args.mode == "lora":
        from peft import LoraConfig, get_peft_model

        base = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.bfloat16, **load)
        base = base.to(dev)
        cfg = LoraConfig(r=args.lora_r, lora_alpha=args.lora_alpha, target_modules=PROJECTIONS, lora_dropout=0.0)
        model = get_peft_model(base, cfg)
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.data = p.data.float()
        inner = model.get_base_model()

        def reference(fn):
            with model.disable_adapter():
                return fn(inner)

    else:
        model = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.float32, **load)
        model = model.to(dev)
        ref = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.float32, **load)
        ref = ref.to(dev).eval().requires_grad_(False)
        inner = model

        def reference(fn):
            return fn(ref)

    if args.gradient_checkpointing:
        # transformers checkpoints only in training mode; the model has no dropout.
        inner.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.95), weight_decay=0.0)
    idle = []
    if args.baseline_agents == 2:
        if args.mode != "full":
            raise SystemExit("--baseline-agents 2 is for full mode")
        second = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.float32, **load).to(dev)
        second_ref = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.float32, **load)
        second_ref = second_ref.to(dev).eval().requires_grad_(False)
        second_opt = torch.optim.AdamW(second.parameters(), lr=0.0, betas=(0.9, 0.95), weight_decay=0.0)
        for p in second.parameters():
            p.grad = torch.zeros_like(p)
        second_opt.step()
        second_opt.zero_grad(set_to_none=True)
        idle = [second, second_ref, second_opt]
    g = torch.Generator().manual_seed(0)
    vocab = 300
    seqs = [prompt + torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]

    def batch(rows):
        width = max(len(prompt) + lengths[i] for i in rows)
        tmax = max(lengths[i] for i in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        pos = torch.zeros(len(rows), tmax, dtype=torch.long)
        tgt = torch.zeros(len(rows), tmax, dtype=torch.long)
        mask = torch.zeros(len(rows), tmax)
        for b, i in enumerate(rows):
            s = seqs[i]
            ids[b, : len(s)] = torch.tensor(s)
            n = lengths[i]
            for j in range(tmax):
                jj = min(j, n - 1)
                pos[b, j] = len(prompt) - 1 + jj
                tgt[b, j] = s[len(prompt) + jj]
                mask[b, j] = 1.0 if j < n else 0.0
        return [t.to(dev) for t in (ids, pos, tgt, mask)]

    def logp(m, ids, pos, tgt):
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            h = m.model(input_ids=ids).last_hidden_state
            h = h.gather(1, pos.unsqueeze(-1).expand(-1, -1, h.shape[-1]))
            logits = m.lm_head(h).float()
        return logits.log_softmax(-1).gather(-1, tgt.unsqueeze(-1)).squeeze(-1)

    order = list(range(len(lengths)))
    mbs = [batch(order[k : k + args.minibatch]) for k in range(0, len(order), args.minibatch)]
    adv = [
        torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in order[k : k + args.minibatch]], device=dev)
        for k in range(0, len(order), args.minibatch)
    ]

    def update():
        fixed = []
        with torch.no_grad():
            for ids, pos, tgt, _ in mbs:
                fixed.append((logp(inner, ids, pos, tgt), reference(lambda m, x=(ids, pos, tgt): logp(m, *x))))
        for (ids, pos, tgt, mask), (old, rf), a in zip(mbs, fixed, adv, strict=True):
            lp = logp(inner, ids, pos, tgt)
            ratio = (lp - old).exp()
            a = a.unsqueeze(1)
            pg = -torch.min(ratio * a, ratio.clamp(1 - CLIP, 1 + CLIP) * a)
            d = (rf - lp).clamp(-20, 20)
            kl = d.exp() - d - 1
            n = mask.sum().clamp_min(1)
            loss = ((pg + KL_COEF * kl) * mask).sum() / n
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, GRAD_CLIP)
            opt.step()

    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    times = []
    for _ in range(2):
        sync()
        t0 = time.time()
        update()
        sync()
        times.append(time.time() - t0)
    print(
        json.dumps(
            {
                "update_seconds": times[-1],
                "rounds": [{"update_seconds": t} for t in times],
                "max_allocated_gib": torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else None,
                "max_reserved_gib": torch.cuda.max_memory_reserved() / 2**30 if dev.type == "cuda" else None,
                "agents": 1 + (len(idle) > 0),
            }
        )
    )


def measure(args):
    import transformers

    mine = ours(args)
    cmd = [sys.executable, __file__, "baseline-run"] + [
        f"--{k.replace('_', '-')}={v}"
        for k, v in vars(args).items()
        if k not in ("cmd", "lengths", "gradient_checkpointing")
    ]
    if args.gradient_checkpointing:
        cmd.append("--gradient-checkpointing")
    cmd.append("--lengths=" + json.dumps(mine["completion_tokens"]))
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    mem = PeakMemory(p.pid)
    out, _ = p.communicate()
    theirs = json.loads(out.strip().splitlines()[-1]) if p.returncode == 0 else {"error": p.returncode}
    theirs["peak_gib"] = mem.finish()
    import peft
    import torch

    cfg = json.loads((Path(args.checkpoint) / "config.json").read_text())
    result = {
        "measures": "one GRPO update (old and reference log-probabilities, then one AdamW step "
        "per minibatch) over `completions` sampled completions, this project's rl-serve beside "
        "transformers" + (" + PEFT" if args.mode == "lora" else ""),
        "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "transformers_version": transformers.__version__,
        "peft": peft.__version__,
        "mode": args.mode,
        "hidden_size": cfg["hidden_size"],
        "num_hidden_layers": cfg["num_hidden_layers"],
        "completions": args.completions,
        "prompt_tokens": len(prompt_ids(args.checkpoint, args.prompt_words)),
        "max_new_tokens": args.max_new_tokens,
        "minibatch": args.minibatch,
        "gradient_checkpointing": args.gradient_checkpointing,
        "lora": {"r": args.lora_r, "alpha": args.lora_alpha} if args.mode == "lora" else None,
        "ours": {k: v for k, v in mine.items() if k != "completion_tokens"},
        "transformers": theirs,
    }
    if "update_seconds" in theirs:
        result["speed_vs_transformers"] = theirs["update_seconds"] / mine["update_seconds"]
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("mode", "hidden_size", "speed_vs_transformers") if k in result}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["checkpoint", "measure", "baseline-run"])
    ap.add_argument("--size")
    ap.add_argument("--tokenizer-from")
    ap.add_argument("--out")
    ap.add_argument("--train")
    ap.add_argument("--checkpoint")
    ap.add_argument("--mode", choices=["full", "lora"], default="lora")
    ap.add_argument("--completions", type=int, default=32)
    ap.add_argument("--prompt-words", type=int, default=60)
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--minibatch", type=int, default=8)
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--lora-alpha", type=float, default=32.0)
    ap.add_argument("--lengths", default="[]")
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--baseline-agents", type=int, choices=[1, 2], default=1)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    {"checkpoint": make_checkpoint, "measure": measure, "baseline-run": baseline}[args.cmd](args)


if __name__ == "__main__":
    main()
