"""A tiny random Qwen2 built offline with Hugging Face `transformers`, saved in its own layout,
and the logits it computes: the reference for `crates/cudarl-train/tests/qwen2_parity.rs`.

Usage: python qwen2_reference.py OUT_DIR [--tied] [--sharded]
Writes OUT_DIR/model/{config.json, model.safetensors or shards + index} (save_pretrained) and
OUT_DIR/reference.safetensors with `input_ids` [2, 7] (int64), `logits` [2, 7, V] (float32,
no padding), `mask` [2, 7] (int64: row 1 left-padded by 3) and `logits_padded` [2, 7, V].
"""

import json
import sys

import torch
from safetensors.torch import save_file
from transformers import Qwen2Config, Qwen2ForCausalLM


def main():
    out = sys.argv[1]
    tied = "--tied" in sys.argv
    sharded = "--sharded" in sys.argv
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tied,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = Qwen2ForCausalLM(cfg).eval().to(torch.float32)
    # Non-trivial norms and biases (the default init makes them 1 and 0).
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif n.endswith(".bias"):
                p.copy_(0.05 * torch.randn_like(p))
    model.save_pretrained(f"{out}/model", safe_serialization=True, max_shard_size="100KB" if sharded else "10GB")
    ids = torch.randint(3, cfg.vocab_size, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
        mask = torch.ones_like(ids)
        mask[1, :3] = 0
        padded = ids.clone()
        padded[1, :3] = 0
        # Positions count real tokens only (what generation with left padding uses).
        pos = (mask.cumsum(-1) - 1).clamp_min(0)
        logits_padded = model(input_ids=padded, attention_mask=mask, position_ids=pos).logits.float()
    save_file(
        {
            "input_ids": ids,
            "logits": logits.contiguous(),
            "mask": mask,
            "padded": padded,
            "logits_padded": logits_padded.contiguous(),
        },
        f"{out}/reference.safetensors",
    )
    print(json.dumps({"params": sum(p.numel() for p in model.parameters()), "tied": tied}))


if __name__ == "__main__":
    main()
