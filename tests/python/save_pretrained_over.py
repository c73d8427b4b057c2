"""Loads a Hugging Face checkpoint directory and writes it back over itself with
`save_pretrained` (model and tokenizer), its generation settings changed, as a user fine-tuning
an exported checkpoint does. Usage: save_pretrained_over.py DIR; prints `saved`."""

import sys

from transformers import AutoModelForCausalLM, AutoTokenizer


def main(path: str) -> None:
    model = AutoModelForCausalLM.from_pretrained(path)
    model.generation_config.top_k = 7
    model.generation_config.do_sample = True
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(path).save_pretrained(path)
    print("saved")


if __name__ == "__main__":
    main(sys.argv[1])
