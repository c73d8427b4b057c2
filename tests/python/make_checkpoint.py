"""A Hugging Face checkpoint directory like a downloaded chat model's, built offline: a tiny
random Qwen2 (transformers, sharded safetensors), a byte-level BPE `tokenizer.json` with the
ChatML special tokens (Hugging Face `tokenizers`), `tokenizer_config.json` with a chat template,
and a README that no stage reads. The input of the checkpoint-directory tests in
`tests/models.rs`.

Usage: python make_checkpoint.py OUT_DIR [--template system-default|inst]

`system-default` (the default) renders ChatML and adds a default system prompt when a
conversation has none, as Qwen2.5's chat templates do; `inst` is a Llama-2-style template that
is not ChatML. The model's vocabulary is the tokenizer's rounded up to a multiple of 64 (Qwen2.5
pads its embeddings the same way). Prints one JSON object: parameters, vocabulary sizes.
"""

import json
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import Qwen2Config, Qwen2ForCausalLM

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

TEMPLATES = {
    "system-default": (
        "{%- if messages[0].role != 'system' %}"
        "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
        "{%- for message in messages %}"
        "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    ),
    "inst": (
        "{%- for message in messages %}{%- if message.role == 'user' %}"
        "{{- '[INST] ' + message.content + ' [/INST]' }}"
        "{%- else %}{{- message.content }}{%- endif %}{%- endfor %}"
    ),
}


def main():
    out = Path(sys.argv[1])
    template = sys.argv[sys.argv.index("--template") + 1] if "--template" in sys.argv else "system-default"
    out.mkdir(parents=True, exist_ok=True)
    texts = [
        f"__global__ void add_{i}(const float* a, float* b, int n) {{ int i = blockIdx.x; b[i] = a[i] + {i}; }}"
        for i in range(200)
    ] + ["You write CUDA kernels. Write a kernel that adds two vectors.\n```cuda\n```"] * 20
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=360,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.save(str(out / "tokenizer.json"))
    n_tok = tok.get_vocab_size()
    vocab = (n_tok + 63) // 64 * 64
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=tok.token_to_id("<|endoftext|>"),
        eos_token_id=tok.token_to_id("<|im_end|>"),
    )
    model = Qwen2ForCausalLM(cfg).eval()
    model.save_pretrained(out, safe_serialization=True, max_shard_size="100KB")
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "chat_template": TEMPLATES[template],
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "additional_special_tokens": SPECIALS[1:],
                "model_max_length": 2048,
            },
            indent=2,
        )
        + "\n"
    )
    (out / "README.md").write_text("A tiny random Qwen2 for tests.\n")
    params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"params": params, "tokenizer_vocab": n_tok, "vocab": vocab}))


if __name__ == "__main__":
    main()
