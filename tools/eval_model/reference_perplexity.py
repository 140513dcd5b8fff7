# transformers' perplexity of a Hugging Face Llama folder on a text file, with
# `arbor perplexity`'s semantics (export_hf.window_perplexity): the reference
# figures of docs/quality.md. On the GPU machine (float32 math, eager attention):
#   python3 tools/eval_model/reference_perplexity.py --model models/arbor-tiny-sotu \
#       --file tests/fixtures/eval-model/heldout.txt --ctx 128 512 1024 --out shipped.json
import argparse
import hashlib
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "default_model"))
from export_hf import window_perplexity  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", required=True, help="folder with config.json, safetensors and tokenizer.json")
    p.add_argument("--file", required=True, help="UTF-8 text, tokenized whole with special tokens")
    p.add_argument("--ctx", type=int, nargs="+", default=[512])
    p.add_argument("--out", required=True, help="JSON file to write")
    a = p.parse_args()
    import tokenizers
    import transformers
    from transformers import LlamaForCausalLM

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = LlamaForCausalLM.from_pretrained(a.model, dtype=torch.float32, attn_implementation="eager").float().eval().to(dev)
    tok = tokenizers.Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    raw = open(a.file, "rb").read()
    ids = tok.encode(raw.decode("utf-8"), add_special_tokens=True).ids
    result = {"model": a.model, "file": a.file, "file_sha256": hashlib.sha256(raw).hexdigest(), "ids": len(ids),
              "reference": f"transformers {transformers.__version__} LlamaForCausalLM float32, eager attention, "
                           f"torch {torch.__version__} on {torch.cuda.get_device_name() if dev == 'cuda' else 'cpu'}",
              "by_ctx": []}
    for ctx in a.ctx:
        result["by_ctx"].append(window_perplexity(model, ids, ctx, dev, len(raw)))
        print(json.dumps(result["by_ctx"][-1]), flush=True)
    json.dump(result, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
