# Checks export_hf.shard_safetensors, the step that splits the evaluation
# model's weights into files the device tool can return (<= 16 MiB each):
# random bf16/f32 tensors written as one model.safetensors come back equal,
# through the index, from shards that each respect the limit. Any CPU with torch:
#   /usr/bin/python3 tools/eval_model/test_shard.py
import json
import os
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "default_model"))
from check_golden import read_checkpoint  # noqa: E402
from export_hf import shard_safetensors  # noqa: E402


def write_single(path, tensors):
    """A plain safetensors writer, independent of the one under test."""
    header, chunks, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        raw = t.contiguous().view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32).numpy().tobytes()
        header[name] = {"dtype": {torch.bfloat16: "BF16", torch.float32: "F32"}[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + b"".join(chunks))


def main():
    torch.manual_seed(0)
    tensors = {f"layers.{i}.w": torch.randn(64 + i, 96).to(torch.bfloat16) for i in range(9)}
    tensors["norm.weight"] = torch.randn(33)  # float32, odd size
    limit = 40_000
    with tempfile.TemporaryDirectory() as d:
        write_single(os.path.join(d, "model.safetensors"), tensors)
        shard_safetensors(d, limit)
        files = sorted(os.listdir(d))
        assert "model.safetensors" not in files, files
        shards = [f for f in files if f.endswith(".safetensors")]
        assert len(shards) >= 3, shards
        for f in shards:
            size = os.path.getsize(os.path.join(d, f))
            assert size <= limit, (f, size)
            with open(os.path.join(d, f), "rb") as fh:
                assert int.from_bytes(fh.read(8), "little") % 8 == 0, f"{f}: header length not 8-aligned"
        index = json.load(open(os.path.join(d, "model.safetensors.index.json")))
        assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in tensors.values())
        back, _ = read_checkpoint(d)
        assert set(back) == set(tensors)
        for k, t in tensors.items():
            assert torch.equal(back[k], t.float()), k
        shard_safetensors(d, limit)  # already sharded: only checked
    print(f"test_shard: ok ({len(shards)} shards of <= {limit} bytes)")


if __name__ == "__main__":
    main()
