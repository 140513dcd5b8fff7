#!/usr/bin/python3
"""An independent numpy implementation of MLX's affine quantization (the Metal/CUDA `affine_quantize` kernels
that mlx_lm.convert runs) and of mlx_lm.convert's choices, used to check `arbor quantize` bit for bit.

Per group of G values along a row, in float32:
  w_min = min(w); w_max = max(0, max(w))       (the GPU kernels start the max at 0)
  scale = max((w_max - w_min) / (2^B - 1), 1e-7); negated unless |w_min| > |w_max|
  edge  = w_min if |w_min| > |w_max| else w_max; q0 = round(edge / scale)
  q0 != 0: scale = edge / q0, bias = edge; else bias = 0
  code  = clip(round((w - bias) / scale), 0, 2^B - 1)      round: half away from zero
Codes are packed as one little-endian bit stream per row (code j at bit j*B) into uint32 words; scales and
biases are stored in the model dtype (bf16/f16 round to nearest even).

Usage:
  mlx_affine_reference.py check --model IN --out OUT --bits B --group-size G [--recipe R]
      Recomputes every tensor OUT should hold from IN's weights and compares: codes, scales and biases bit for
      bit, dense tensors byte for byte (after the cast to torch_dtype), the set of tensors, and config.json's
      quantization blocks. Prints a summary; exits 1 naming the first differences.
Debian's python3 with python3-numpy; nothing else.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "U32": np.uint32, "I32": np.int32,
          "U8": np.uint8, "I64": np.int64}
ELEM = {"F32": 4, "F16": 2, "BF16": 2, "U32": 4, "I32": 4, "U8": 1, "I64": 8}


def read_safetensors(path):
    """{name: (dtype string, shape, raw numpy array of the stored element type)}"""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        arr = np.frombuffer(data[base + a:base + b], dtype=np.dtype(DTYPES[e["dtype"]]).newbyteorder("<"))
        out[name] = (e["dtype"], list(e["shape"]), arr.reshape(e["shape"]) if e["shape"] else arr)
    return out, header.get("__metadata__", {})


def read_checkpoint(d):
    index = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else \
        sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    tensors, metas = {}, {}
    for f in files:
        t, m = read_safetensors(os.path.join(d, f))
        for k in t:
            assert k not in tensors, f"{k} in two files"
        tensors.update(t)
        metas[f] = m
    return tensors, metas


def to_f32(dtype, arr):
    if dtype == "F32":
        return arr.astype(np.float32)
    if dtype == "F16":
        return arr.astype(np.float32)
    if dtype == "BF16":
        return (arr.astype(np.uint32) << 16).view(np.float32)
    raise ValueError(dtype)


def f32_to_bf16_bits(x):
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = u + 0x7FFF + ((u >> 16) & 1)
    return (u >> 16).astype(np.uint16)


def store(x, dtype):
    """float32 values -> the raw stored array of `dtype`"""
    if dtype == "F32":
        return x.astype(np.float32)
    if dtype == "F16":
        return x.astype(np.float16)
    if dtype == "BF16":
        return f32_to_bf16_bits(x)
    raise ValueError(dtype)


def round_half_away(x):
    # x is float32; float64 holds |x| + 0.5 exactly for every float32 below 2^52
    x64 = x.astype(np.float64)
    return (np.sign(x64) * np.floor(np.abs(x64) + 0.5)).astype(np.float32)


def quantize(w, group, bits):
    """w: float32 [rows, cols] -> codes uint32 [rows, cols], scales and biases float32 [rows, cols/group]"""
    rows, cols = w.shape
    g = w.reshape(rows, cols // group, group).astype(np.float32)
    n_bins = np.float32((1 << bits) - 1)
    eps = np.float32(1e-7)
    w_min = np.minimum(g.min(axis=-1), np.float32(np.finfo(np.float32).max))
    w_max = np.maximum(g.max(axis=-1), np.float32(0))
    scale = np.maximum((w_max - w_min) / n_bins, eps).astype(np.float32)
    side = np.abs(w_min) > np.abs(w_max)
    scale = np.where(side, scale, -scale).astype(np.float32)
    edge = np.where(side, w_min, w_max).astype(np.float32)
    q0 = round_half_away((edge / scale).astype(np.float32))
    nz = q0 != 0
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(nz, edge / np.where(nz, q0, np.float32(1)), scale).astype(np.float32)
    bias = np.where(nz, edge, np.float32(0)).astype(np.float32)
    q = round_half_away(((g - bias[..., None]) / scale[..., None]).astype(np.float32))
    codes = np.clip(q, 0, n_bins).astype(np.uint32).reshape(rows, cols)
    return codes, scale, bias


def pack(codes, bits):
    """codes uint32 [rows, cols] -> uint32 [rows, cols*bits/32]: bit k of code j at stream bit j*bits + k"""
    rows, cols = codes.shape
    bitplanes = ((codes[..., None] >> np.arange(bits, dtype=np.uint32)) & 1).astype(np.uint8)
    stream = np.packbits(bitplanes.reshape(rows, cols * bits), axis=-1, bitorder="little")
    return np.ascontiguousarray(stream).view("<u4").reshape(rows, cols * bits // 32)


RECIPES = {"mixed_2_6": (2, 6), "mixed_3_4": (3, 4), "mixed_3_6": (3, 6), "mixed_4_6": (4, 6)}


def recipe_bits(recipe, path, layer_location, num_layers):
    low, high = RECIPES[recipe]
    parts = path.split(".")
    index = int(parts[layer_location]) if len(parts) > layer_location else 0
    more = index < num_layers // 8 or index >= 7 * num_layers // 8 or (index - num_layers // 8) % 3 == 2
    if any(k in path for k in ("v_proj", "v_a_proj", "v_b_proj")) and more:
        return high
    if "down_proj" in path and more:
        return high
    if "lm_head" in path:
        return high
    return low


def cast_dtype(cfg):
    d = cfg.get("torch_dtype")
    if d is None and isinstance(cfg.get("text_config"), dict):
        d = cfg["text_config"].get("dtype")
    return {"float16": "F16", "bfloat16": "BF16", "float32": "F32"}.get(d)


def check(args):
    cfg = json.load(open(os.path.join(args.model, "config.json")))
    ocfg = json.load(open(os.path.join(args.out, "config.json")))
    src, _ = read_checkpoint(args.model)
    out, metas = read_checkpoint(args.out)
    G, B = args.group_size, args.bits
    cast = cast_dtype(cfg)
    errors = []
    names = sorted(src)
    layer_location = None
    if args.recipe:
        down = [n for n in names if "down_proj" in n]
        first = sorted(down, key=lambda n: [int(p) if p.isdigit() else -1 for p in n.split(".")])[0]
        layer_location = next(i for i, p in enumerate(first.split(".")) if p.isdigit())
    expected_quant = {"group_size": G, "bits": B, "mode": "affine"}
    expected_names = set()
    quantized = 0
    for n in names:
        dt, shape, arr = src[n]
        odt = cast if (cast and dt in ("F32", "F16", "BF16")) else dt
        if n.endswith(".weight") and len(shape) == 2 and dt in ("F32", "F16", "BF16") and shape[1] % G == 0:
            module = n[:-len(".weight")]
            bits = recipe_bits(args.recipe, module, layer_location, cfg["num_hidden_layers"]) if args.recipe else B
            if args.recipe:
                expected_quant[module] = {"group_size": G, "bits": bits, "mode": "affine"}
            w = to_f32(dt, arr)
            if odt != dt:  # mlx-lm casts the model to torch_dtype before quantizing
                w = to_f32(odt, store(w, odt))
            codes, scale, bias = quantize(w, G, bits)
            want = {module + ".weight": ("U32", pack(codes, bits)),
                    module + ".scales": (odt, store(scale, odt)),
                    module + ".biases": (odt, store(bias, odt))}
            quantized += 1
        else:
            v = arr if odt == dt else store(to_f32(dt, arr), odt)
            want = {n: (odt, v)}
        for k, (wdt, wv) in want.items():
            expected_names.add(k)
            if k not in out:
                errors.append(f"{k}: missing from the output")
                continue
            gdt, gshape, gv = out[k]
            if gdt != wdt or list(gshape) != list(wv.shape):
                errors.append(f"{k}: {gdt} {gshape}, expected {wdt} {list(wv.shape)}")
            elif not np.array_equal(gv.view(np.uint8), np.ascontiguousarray(wv).view(np.uint8)):
                diff = np.flatnonzero(gv.reshape(-1) != wv.reshape(-1))
                errors.append(f"{k}: {diff.size} of {wv.size} elements differ, first at flat index {diff[0]}: "
                              f"{gv.reshape(-1)[diff[0]]} vs expected {wv.reshape(-1)[diff[0]]}")
    for k in sorted(set(out) - expected_names):
        errors.append(f"{k}: in the output but not expected")
    for key in ("quantization", "quantization_config"):
        if ocfg.get(key) != expected_quant:
            errors.append(f"config.json {key}: {json.dumps(ocfg.get(key))[:300]} != expected {json.dumps(expected_quant)[:300]}")
    for f, m in metas.items():
        if m.get("format") != "mlx":
            errors.append(f"{f}: __metadata__ {m}, expected format mlx")
    if errors:
        print(f"mlx_affine_reference: {len(errors)} difference(s):")
        for e in errors[:30]:
            print("  " + e)
        return 1
    print(f"mlx_affine_reference: {len(expected_names)} tensors identical ({quantized} modules quantized, "
          f"{B}-bit group {G}{', recipe ' + args.recipe if args.recipe else ''})")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("--model", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--bits", type=int, default=4)
    c.add_argument("--group-size", type=int, default=64)
    c.add_argument("--recipe", choices=sorted(RECIPES))
    a = p.parse_args()
    sys.exit(check(a))


if __name__ == "__main__":
    main()
