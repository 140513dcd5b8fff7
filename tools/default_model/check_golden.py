# Checks the shipped model against its golden on any CPU with torch (no
# transformers, no safetensors package): reads model.safetensors by hand,
# runs the greedy continuation of every golden case in float32 with
# llama_model.py, and compares ids; also checks the file is within 12 MB.
#   /usr/bin/python3 tools/default_model/check_golden.py [models/arbor-tiny-sotu]
import json
import os
import struct
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from llama_model import LlamaLM  # noqa: E402

MAX_BYTES = 12_000_000


def read_safetensors(path):
    """name -> float32 tensor; accepts BF16, F16 and F32 entries."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        body = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        raw = body[a:b]
        if e["dtype"] == "BF16":
            arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif e["dtype"] == "F16":
            arr = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        elif e["dtype"] == "F32":
            arr = np.frombuffer(raw, dtype="<f4")
        else:
            sys.exit(f"check_golden: {path}: tensor {name} has dtype {e['dtype']}")
        out[name] = torch.from_numpy(arr.copy()).reshape(e["shape"])
    return out


def main():
    model_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "..", "models", "arbor-tiny-sotu")
    st_path = os.path.join(model_dir, "model.safetensors")
    size = os.path.getsize(st_path)
    print(f"model.safetensors: {size} bytes")
    if size > MAX_BYTES:
        sys.exit(f"check_golden: {st_path} is {size} bytes, over {MAX_BYTES}")
    hf = json.load(open(os.path.join(model_dir, "config.json")))
    cfg = {k: hf[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                              "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
                              "tie_word_embeddings")}
    cfg["rope_theta"] = hf.get("rope_parameters", {}).get("rope_theta", hf.get("rope_theta", 10000.0))
    model = LlamaLM(cfg).eval()
    state = read_safetensors(st_path)
    state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
    model.load_state_dict(state, strict=True)

    golden = json.load(open(os.path.join(model_dir, "golden_greedy.json")))
    bad = 0
    for case in golden["cases"]:
        seq = list(case["prompt_ids"])
        with torch.no_grad():
            for _ in range(golden["n_new_tokens"]):
                seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
        got = seq[len(case["prompt_ids"]):]
        first = next((i for i, (x, y) in enumerate(zip(got, case["greedy_ids"])) if x != y), None)
        print(f"{case['name']}: " + ("match" if first is None else
              f"MISMATCH at step {first} (golden margin {case['greedy_margins'][first]})"))
        bad += first is not None
    if bad:
        sys.exit("check_golden: FAILED")
    print("check_golden: ok")


if __name__ == "__main__":
    main()
