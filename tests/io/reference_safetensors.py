#!/usr/bin/env python3
"""Cross-checks arbor's safetensors code against the reference implementation (the Hugging Face `safetensors`
package, with torch). Run where both are installed (the GPU machine):
    python3 tests/io/reference_safetensors.py tests/io/data OUT_DIR
1. Loads tests/io/data/arbor_written.safetensors (written by arbor's write_safetensors; see
   reference_compat_test.cpp) with the reference reader and checks every name, dtype, shape and value against
   the same formulas the C++ test uses. Exits non-zero on any difference.
2. Writes OUT_DIR/reference_written.safetensors with safetensors.torch.save_file, and
   OUT_DIR/reference_written.json with the metadata and each tensor's dtype, shape and values as torch holds
   them; copy both to tests/io/data/ for ReadsWhatTheReferenceWrote.
"""
import json
import os
import sys

import safetensors
import torch
from safetensors import safe_open
from safetensors.torch import save_file

src, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)

# 1. arbor's file through the reference reader.
formula = torch.tensor([(i % 7) * 0.25 - 1 for i in range(15)], dtype=torch.float32)
want = {
    "layers.0.f32": formula.reshape(3, 5),
    "layers.0.f16": formula[:6].to(torch.float16).reshape(2, 3),
    "bf16": formula[:4].to(torch.bfloat16),
    "f64": torch.tensor([0.1, -3.0], dtype=torch.float64),
    "i64": torch.tensor([[-5], [1 << 40]], dtype=torch.int64),
    "u8": torch.tensor([0, 128, 255], dtype=torch.uint8),
    "bool": torch.tensor([True, False]),
    "scalar": torch.tensor(2.5, dtype=torch.float32),
    "empty": torch.zeros(0, 2, dtype=torch.bfloat16),
}
with safe_open(os.path.join(src, "arbor_written.safetensors"), framework="pt") as f:
    assert f.metadata() == {"format": "pt", "producer": "arbor"}, f.metadata()
    assert sorted(f.keys()) == sorted(want), sorted(f.keys())
    for name, w in want.items():
        got = f.get_tensor(name)
        assert got.dtype == w.dtype and got.shape == w.shape and torch.equal(got, w), (name, got, w)
print(f"reference reader (safetensors {safetensors.__version__}, torch {torch.__version__}) accepts arbor_written.safetensors")

# 2. A file from the reference writer, with the values it was given.
g = torch.Generator().manual_seed(1234)
def rnd(*shape):
    return torch.randn(*shape, generator=g)
tensors = {
    "model.embed_tokens.weight": rnd(7, 3).to(torch.bfloat16),
    "model.layers.0.self_attn.q_proj.weight": rnd(5, 3).to(torch.float16),
    "model.norm.weight": rnd(3),
    "lm_head.bias": rnd(1).to(torch.float64),
    "scalar": torch.tensor(-1.75),
    "empty": torch.zeros(3, 0, dtype=torch.bfloat16),
    "ids.i64": torch.tensor([-7, 0, 123456789], dtype=torch.int64),
    "ids.i32": torch.tensor([[-3, 9]], dtype=torch.int32),
    "ids.i16": torch.tensor([-300, 300], dtype=torch.int16),
    "ids.i8": torch.tensor([-128, 127, 5], dtype=torch.int8),
    "ids.u8": torch.tensor([0, 255], dtype=torch.uint8),
    "mask": torch.tensor([True, False, True]),
}
meta = {"format": "pt", "note": "written by safetensors.torch.save_file"}
save_file(tensors, os.path.join(out, "reference_written.safetensors"), metadata=meta)
names = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.float64: "F64",
         torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
         torch.bool: "BOOL"}
record = {"metadata": meta, "tensors": {
    n: {"dtype": names[t.dtype], "shape": list(t.shape), "values": t.double().flatten().tolist()}
    for n, t in tensors.items()}}
with open(os.path.join(out, "reference_written.json"), "w") as f:
    json.dump(record, f, indent=1)
print("wrote", out)
