#!/usr/bin/env python3
"""transformers' perplexity of a model folder on a text, with `arbor perplexity`'s
semantics (docs/perplexity.md), for tests/fixtures/perplexity/reference.json.

The text is tokenized whole with the folder's tokenizer.json, special tokens added
(as `arbor tokenize` does); the ids are cut into consecutive non-overlapping windows
of ctx ids (a last shorter window counts if it has >= 2 ids); every id after a
window's first is predicted from that window's earlier ids; perplexity =
exp(mean NLL) over all predicted ids. Float32 weights and math (TF32 off, eager
attention), log-softmax in float64.

On the GPU machine (torch, transformers, tokenizers; no internet):
  python3 tools/perplexity/reference_ppl.py --model models/arbor-tiny-sotu \
      --file tests/fixtures/perplexity/sotu_heldout.txt --ctx 16,64,256,1024 --out $OUT/reference.json
  python3 tools/perplexity/reference_ppl.py --model tests/fixtures/eval-model \
      --file tests/fixtures/eval-model/heldout.txt --ctx 128,512,1024 --out $OUT/eval_reference.json

--ids FILE takes the ids `arbor tokenize --json --file TEXT` printed and checks the
tokenizers library's ids equal them (the run stops if not); without it the ids'
FNV-1a hash in the output is what arbor's test compares.
"""
import argparse
import json
import math
import os
import sys
import time


def fnv1a64(ids):
    """FNV-1a 64 over the ids as 4-byte little-endian integers: the `ids_hash` that
    arbor's perplexity logits files and tests use (src/engine/perplexity.h)."""
    h = 0xCBF29CE484222325
    for i in ids:
        for b in int(i).to_bytes(4, "little", signed=True):
            h ^= b
            h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def windows_of(ids, ctx):
    ws = [ids[i:i + ctx] for i in range(0, len(ids), ctx)]
    return [w for w in ws if len(w) >= 2]


def window_nlls(model, torch, ids, ctx, device, max_batch_tokens):
    """Per-window lists of the NLL of each predicted id (float64), in window order."""
    ws = windows_of(ids, ctx)
    out = [None] * len(ws)
    by_len = {}
    for k, w in enumerate(ws):
        by_len.setdefault(len(w), []).append(k)
    for L, ks in sorted(by_len.items()):
        batch = max(1, max_batch_tokens // L)
        for s in range(0, len(ks), batch):
            part = ks[s:s + batch]
            x = torch.tensor([ws[k] for k in part], dtype=torch.long, device=device)
            with torch.no_grad():
                logits = model(input_ids=x, use_cache=False).logits[:, :-1]
                logp = torch.log_softmax(logits.double(), dim=-1)
                nll = -logp.gather(-1, x[:, 1:, None])[..., 0]
            for j, k in enumerate(part):
                out[k] = nll[j].cpu().tolist()
    return ws, out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="folder with config.json, safetensors and tokenizer.json")
    p.add_argument("--file", required=True, help="UTF-8 text, tokenized whole with special tokens")
    p.add_argument("--ctx", default="16,64,256,1024", help="comma-separated window sizes")
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--ids", help="`arbor tokenize --json --file` output to check the ids against")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--max-batch-tokens", type=int, default=8192, help="ids per forward (windows batched)")
    a = p.parse_args()

    import tokenizers
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    dev = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")

    raw = open(a.file, "rb").read()
    tok = tokenizers.Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    ids = tok.encode(raw.decode("utf-8"), add_special_tokens=True).ids
    if a.ids:
        theirs = json.load(open(a.ids))["ids"]
        if theirs != ids:
            first = next((i for i, (x, y) in enumerate(zip(theirs, ids)) if x != y), min(len(theirs), len(ids)))
            sys.exit(f"ids differ from {a.ids}: {len(ids)} vs {len(theirs)} ids, first difference at index {first}")

    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32, attn_implementation="eager")
    model = model.float().eval().to(dev)

    result = {
        "model": a.model,
        "file": a.file,
        "file_bytes": len(raw),
        "ids": len(ids),
        "ids_hash": fnv1a64(ids),
        "ids_hash_kind": "fnv1a64 over int32 little-endian",
        "reference": f"transformers {transformers.__version__} {type(model).__name__} float32, eager attention, "
                     f"log-softmax in float64, torch {torch.__version__} on "
                     f"{torch.cuda.get_device_name() if dev == 'cuda' else 'cpu'}",
        "by_ctx": {},
    }
    for ctx in [int(c) for c in a.ctx.split(",") if c]:
        t0 = time.time()
        ws, nlls = window_nlls(model, torch, ids, ctx, dev, a.max_batch_tokens)
        flat = [v for w in nlls for v in w]
        n = len(flat)
        nll_sum = math.fsum(flat)
        mean = nll_sum / n
        var = math.fsum((v - mean) ** 2 for v in flat) / (n - 1) if n > 1 else 0.0
        ppl = math.exp(mean)
        entry = {
            "perplexity": ppl,
            "perplexity_stderr": ppl * math.sqrt(var / n),
            "tokens": n,
            "windows": len(ws),
            "nll_sum": nll_sum,
            "mean_nll": mean,
            "first_window_nll": nlls[0][:16],
            "seconds": round(time.time() - t0, 2),
        }
        result["by_ctx"][str(ctx)] = entry
        print(json.dumps({"ctx": ctx, **{k: v for k, v in entry.items() if k != "first_window_nll"}}), flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
