# Checks the shipped model against its golden on any CPU with torch (no
# transformers, no safetensors package): reads model.safetensors (or the
# shards an index names) by hand, runs the greedy continuation of every
# golden case in float32 with llama_model.py, and compares ids; also checks
# the weights are within 12 MB (--max-bytes for another model).
#   /usr/bin/python3 tools/default_model/check_golden.py [models/arbor-tiny-sotu]
#   /usr/bin/python3 tools/default_model/check_golden.py tests/fixtures/eval-model --max-bytes 16500000
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


def read_checkpoint(model_dir):
    """name -> float32 tensor from model.safetensors or the shards of
    model.safetensors.index.json; returns (tensors, total bytes of the files)."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        weight_map = json.load(open(index))["weight_map"]
        files = sorted(set(weight_map.values()))
    else:
        weight_map, files = None, ["model.safetensors"]
    state, size = {}, 0
    for f in files:
        path = os.path.join(model_dir, f)
        size += os.path.getsize(path)
        part = read_safetensors(path)
        for name in part:
            if name in state:
                sys.exit(f"check_golden: tensor {name} is in two files")
            if weight_map is not None and weight_map.get(name) != f:
                sys.exit(f"check_golden: {f} holds {name}, which the index puts in {weight_map.get(name)}")
        state.update(part)
    if weight_map is not None and set(weight_map) != set(state):
        sys.exit(f"check_golden: the index and the shards name different tensors: {sorted(set(weight_map) ^ set(state))}")
    return state, size


def main():
    args = list(sys.argv[1:])
    max_bytes = MAX_BYTES
    if "--max-bytes" in args:
        i = args.index("--max-bytes")
        max_bytes = int(args[i + 1])
        del args[i:i + 2]
    model_dir = args[0] if args else os.path.join(HERE, "..", "..", "models", "arbor-tiny-sotu")
    state, size = read_checkpoint(model_dir)
    print(f"weights: {size} bytes")
    if size > max_bytes:
        sys.exit(f"check_golden: {model_dir}: weights are {size} bytes, over {max_bytes}")
    hf = json.load(open(os.path.join(model_dir, "config.json")))
    cfg = {k: hf[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                              "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
                              "tie_word_embeddings")}
    cfg["rope_theta"] = hf.get("rope_parameters", {}).get("rope_theta", hf.get("rope_theta", 10000.0))
    model = LlamaLM(cfg).eval()
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
