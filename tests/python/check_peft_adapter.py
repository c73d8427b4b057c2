"""Loads LoRA adapters that `sft-train` saved in PEFT's layout onto their base checkpoint with
`peft.PeftModel.from_pretrained` and compares the logits with those of the merged checkpoint
`sft-train` saved beside them (transformers, float32, CPU), on fixed token ids.

Usage: python check_peft_adapter.py BASE_DIR ADAPTER_DIR MERGED_DIR
Prints one JSON object: `peft_vs_merged` (max |logit difference| between the base with the
adapters applied by PEFT and the merged checkpoint), `adapter_effect` (max |difference| between
the base alone and the base with the adapters: zero would mean the adapters were never trained),
`lora_tensors` (how many adapter tensors PEFT loaded), `r`, `lora_alpha`.
"""

import json
import sys

import torch
from peft import PeftConfig, PeftModel
from transformers import AutoModelForCausalLM


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def main():
    base_dir, adapter_dir, merged_dir = sys.argv[1:4]
    load = dict(dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(base_dir, **load).eval()
    vocab = base.config.vocab_size
    ids = (torch.arange(48).view(2, 24) * 7919 % vocab).long()
    plain = logits(base, ids)
    peft_model = PeftModel.from_pretrained(base, adapter_dir).eval()
    lora = [n for n, _ in peft_model.named_parameters() if "lora_" in n]
    adapted = logits(peft_model, ids)
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, **load).eval()
    cfg = PeftConfig.from_pretrained(adapter_dir)
    print(
        json.dumps(
            {
                "peft_vs_merged": (adapted - logits(merged, ids)).abs().max().item(),
                "adapter_effect": (adapted - plain).abs().max().item(),
                "lora_tensors": len(lora),
                "r": cfg.r,
                "lora_alpha": cfg.lora_alpha,
            }
        )
    )


if __name__ == "__main__":
    main()
