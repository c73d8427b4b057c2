"""An exported cudarl-pipe checkpoint in the Hugging Face stack.

Usage: check_chat_template.py MODEL_DIR

Loads MODEL_DIR with transformers' AutoTokenizer, AutoModelForCausalLM and GenerationConfig,
renders a system + user conversation with `apply_chat_template(add_generation_prompt=True)`,
and generates up to 8 tokens from it with the checkpoint's generation settings. Prints one JSON
object: the rendered text, its token ids (`tokenizer(text, add_special_tokens=False)`), the
end-of-sequence and padding ids, the generation config's stop ids, temperature and top_p, and
the number of tokens generated. Exits non-zero on any failure.
"""

import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

MESSAGES = [
    {"role": "system", "content": "You write CUDA kernels."},
    {"role": "user", "content": "Write a kernel that adds two vectors."},
]


def main():
    d = sys.argv[1]
    tok = AutoTokenizer.from_pretrained(d)
    text = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    gen = GenerationConfig.from_pretrained(d)
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    torch.manual_seed(0)
    prompt = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8)
    eos = gen.eos_token_id if isinstance(gen.eos_token_id, list) else [gen.eos_token_id]
    print(
        json.dumps(
            {
                "text": text,
                "ids": ids,
                "eos_token_id": tok.eos_token_id,
                "pad_token_id": tok.pad_token_id,
                "generation_eos_token_id": eos,
                "temperature": gen.temperature,
                "top_p": gen.top_p,
                "generated": out.shape[1] - prompt.shape[1],
            }
        )
    )


if __name__ == "__main__":
    main()
