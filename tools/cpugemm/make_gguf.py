#!/usr/bin/env python3
"""Writes a GGUF file with random bf16 weights in the shape of a Llama checkpoint, for llama.cpp's
llama-bench (llama.cpp has no dummy-weights mode; arbor's bench has --dummy-weights).

Usage: make_gguf.py --config bench/configs/llama-3.2-1b.json --out /tmp/llama-1b-bf16.gguf

The shape comes from the Hugging Face config.json (arbor's bench/configs/ hold them): Llama
architecture only (model_type "llama"). Matmul weights and the embedding are bf16 with std 0.02
(nothing overflows), norms f32 (ones), the llama3 rope factors f32 as llama.cpp's converter writes them.
Tied embeddings write no output.weight (llama.cpp then uses token_embd as the LM head).

The tokenizer is a minimal SentencePiece-style ("llama") vocabulary of vocab_size entries: <unk>, <s>,
</s>, the 256 byte tokens <0x00>..<0xFF>, then filler tokens. llama-bench's prompt test feeds random
token ids in [0, n_vocab) and never tokenizes text, so only the count and loadability matter.

GGUF is written here directly (format v3: header, key/values, tensor infos, 32-byte aligned data),
with numpy only, no gguf-py. The random values come from a 16 Mi-element pool (repeated with a
per-tensor offset): bf16 GEMM time does not depend on the values, and this keeps the 2.5 GB file
quick to write.
"""
import argparse
import json
import math
import struct
import sys
import time

import numpy as np

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
ALIGN = 32
# gguf value types
T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR = 4, 5, 6, 7, 8, 9
# ggml tensor types
GGML_F32, GGML_BF16 = 0, 30
FTYPE_MOSTLY_BF16 = 32
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_BYTE = 1, 2, 3, 6


def s_str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, value):
    out = s_str(key) + struct.pack("<I", vtype)
    if vtype == T_STR:
        return out + s_str(value)
    if vtype == T_U32:
        return out + struct.pack("<I", value)
    if vtype == T_I32:
        return out + struct.pack("<i", value)
    if vtype == T_F32:
        return out + struct.pack("<f", value)
    if vtype == T_BOOL:
        return out + struct.pack("<?", value)
    raise ValueError(f"kv {key}: type {vtype}")


def kv_arr(key, etype, values):
    out = s_str(key) + struct.pack("<IIQ", T_ARR, etype, len(values))
    if etype == T_STR:
        return out + b"".join(s_str(v) for v in values)
    if etype == T_F32:
        return out + np.asarray(values, dtype="<f4").tobytes()
    if etype == T_I32:
        return out + np.asarray(values, dtype="<i4").tobytes()
    raise ValueError(f"kv array {key}: type {etype}")


def llama3_rope_factors(cfg, head_dim):
    rs = cfg.get("rope_scaling") or {}
    if rs.get("rope_type", rs.get("type")) != "llama3":
        return None
    base = float(cfg.get("rope_theta", 10000.0))
    factor = float(rs.get("factor", 8.0))
    lo = float(rs.get("low_freq_factor", 1.0))
    hi = float(rs.get("high_freq_factor", 4.0))
    old_ctx = float(rs.get("original_max_position_embeddings", 8192))
    lo_wl, hi_wl = old_ctx / lo, old_ctx / hi
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / (base ** (i / head_dim))
        wl = 2 * math.pi / freq
        if wl < hi_wl:
            out.append(1.0)
        elif wl > lo_wl:
            out.append(factor)
        else:
            smooth = (old_ctx / wl - lo) / (hi - lo)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype="<f4")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="Hugging Face config.json of a Llama model")
    ap.add_argument("--out", required=True, help="GGUF file to write")
    ap.add_argument("--std", type=float, default=0.02, help="weight standard deviation (default 0.02)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--vocab", choices=["spm", "none"], default="spm",
                    help="spm: the minimal 'llama' vocabulary (default); none: tokenizer model 'no_vocab' "
                         "with vocab_size dummy tokens (a fallback for llama.cpp builds that reject the first)")
    a = ap.parse_args()

    with open(a.config) as f:
        cfg = json.load(f)
    if cfg.get("model_type") != "llama":
        sys.exit(f"make_gguf: {a.config}: model_type {cfg.get('model_type')!r}, only 'llama' is written")
    try:
        H = int(cfg["hidden_size"])
        FF = int(cfg["intermediate_size"])
        L = int(cfg["num_hidden_layers"])
        NH = int(cfg["num_attention_heads"])
        NKV = int(cfg.get("num_key_value_heads", NH))
        V = int(cfg["vocab_size"])
    except KeyError as e:
        sys.exit(f"make_gguf: {a.config}: missing key {e}")
    HD = int(cfg.get("head_dim", H // NH))
    tied = bool(cfg.get("tie_word_embeddings", False))
    if V < 259:
        sys.exit(f"make_gguf: {a.config}: vocab_size {V} < 259 (3 specials + 256 byte tokens)")

    # Tensors: (name, numpy-order shape [rows, cols], ggml type). ggml lists dims innermost first.
    tensors = [("token_embd.weight", (V, H), GGML_BF16)]
    rope = llama3_rope_factors(cfg, HD)
    if rope is not None:
        tensors.append(("rope_freqs.weight", (HD // 2,), GGML_F32))
    for i in range(L):
        p = f"blk.{i}."
        tensors += [
            (p + "attn_norm.weight", (H,), GGML_F32),
            (p + "attn_q.weight", (NH * HD, H), GGML_BF16),
            (p + "attn_k.weight", (NKV * HD, H), GGML_BF16),
            (p + "attn_v.weight", (NKV * HD, H), GGML_BF16),
            (p + "attn_output.weight", (H, NH * HD), GGML_BF16),
            (p + "ffn_norm.weight", (H,), GGML_F32),
            (p + "ffn_gate.weight", (FF, H), GGML_BF16),
            (p + "ffn_up.weight", (FF, H), GGML_BF16),
            (p + "ffn_down.weight", (H, FF), GGML_BF16),
        ]
    tensors.append(("output_norm.weight", (H,), GGML_F32))
    if not tied:
        tensors.append(("output.weight", (V, H), GGML_BF16))

    n_vocab_fill = V - 259
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + [f"tok{i}" for i in range(n_vocab_fill)]
    types = [TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_CONTROL] + [TOKEN_BYTE] * 256 + [TOKEN_NORMAL] * n_vocab_fill
    scores = [0.0] * 259 + [-float(i) for i in range(n_vocab_fill)]

    arch = "llama"
    kvs = [
        kv("general.architecture", T_STR, arch),
        kv("general.name", T_STR, f"random-bf16 {a.config.rsplit('/', 1)[-1]}"),
        kv("general.file_type", T_U32, FTYPE_MOSTLY_BF16),
        kv("general.alignment", T_U32, ALIGN),
        kv(f"{arch}.vocab_size", T_U32, V),
        kv(f"{arch}.context_length", T_U32, int(cfg.get("max_position_embeddings", 4096))),
        kv(f"{arch}.embedding_length", T_U32, H),
        kv(f"{arch}.block_count", T_U32, L),
        kv(f"{arch}.feed_forward_length", T_U32, FF),
        kv(f"{arch}.attention.head_count", T_U32, NH),
        kv(f"{arch}.attention.head_count_kv", T_U32, NKV),
        kv(f"{arch}.attention.key_length", T_U32, HD),
        kv(f"{arch}.attention.value_length", T_U32, HD),
        kv(f"{arch}.rope.dimension_count", T_U32, HD),
        kv(f"{arch}.rope.freq_base", T_F32, float(cfg.get("rope_theta", 10000.0))),
        kv(f"{arch}.attention.layer_norm_rms_epsilon", T_F32, float(cfg.get("rms_norm_eps", 1e-5))),
    ]
    if a.vocab == "spm":
        kvs += [
            kv("tokenizer.ggml.model", T_STR, "llama"),
            kv_arr("tokenizer.ggml.tokens", T_STR, tokens),
            kv_arr("tokenizer.ggml.scores", T_F32, scores),
            kv_arr("tokenizer.ggml.token_type", T_I32, types),
            kv("tokenizer.ggml.unknown_token_id", T_U32, 0),
            kv("tokenizer.ggml.bos_token_id", T_U32, 1),
            kv("tokenizer.ggml.eos_token_id", T_U32, 2),
            kv("tokenizer.ggml.add_bos_token", T_BOOL, True),
            kv("tokenizer.ggml.add_eos_token", T_BOOL, False),
        ]
    else:
        kvs.append(kv("tokenizer.ggml.model", T_STR, "no_vocab"))

    infos = []
    offset = 0
    sizes = []
    for name, shape, gtype in tensors:
        n = int(np.prod(shape))
        nbytes = n * (2 if gtype == GGML_BF16 else 4)
        dims = list(reversed(shape))
        infos.append(s_str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
                     + struct.pack("<IQ", gtype, offset))
        sizes.append(nbytes)
        offset += (nbytes + ALIGN - 1) // ALIGN * ALIGN

    t0 = time.time()
    rng = np.random.default_rng(a.seed)
    pool_n = 1 << 24
    f = (rng.standard_normal(pool_n, dtype=np.float32) * np.float32(a.std)).view(np.uint32)
    # Round to nearest even into bf16 (values are small and finite).
    pool = ((f + np.uint32(0x7FFF) + ((f >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype("<u2")
    pool2 = np.concatenate([pool, pool])  # any window of pool_n elements is contiguous

    with open(a.out, "wb") as out:
        out.write(GGUF_MAGIC + struct.pack("<IQQ", GGUF_VERSION, len(tensors), len(kvs)))
        for b in kvs:
            out.write(b)
        for b in infos:
            out.write(b)
        pos = out.tell()
        out.write(b"\0" * ((ALIGN - pos % ALIGN) % ALIGN))
        for ti, ((name, shape, gtype), nbytes) in enumerate(zip(tensors, sizes)):
            if gtype == GGML_F32:
                arr = rope if name == "rope_freqs.weight" else np.ones(shape, dtype="<f4")
                out.write(arr.astype("<f4").tobytes())
            else:
                n = nbytes // 2
                start = (ti * 7_919_987) % pool_n
                done = 0
                while done < n:
                    k = min(n - done, pool_n)
                    out.write(pool2[start:start + k].tobytes())
                    done += k
                    start = (start + k) % pool_n
            pad = (ALIGN - nbytes % ALIGN) % ALIGN
            out.write(b"\0" * pad)
        total = out.tell()
    print(f"make_gguf: wrote {a.out}: {len(tensors)} tensors, {total / 1e9:.3f} GB, vocab {V}, "
          f"{L} layers, hidden {H}, ffn {FF}, heads {NH}/{NKV}x{HD}, tied {tied}, {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
