# Checks llama_model.py against an independent float64 numpy transcription of
# HF Llama (rmsnorm, rotate_half RoPE, GQA, causal softmax, SwiGLU, tied head)
# on random weights at odd shapes; runs on any CPU with torch, no transformers.
#   /usr/bin/python3 tools/default_model/check_llama_math.py
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_model import LlamaLM  # noqa: E402


def reference_logits(sd, cfg, ids):
    W = {k: v.detach().double().numpy() for k, v in sd.items()}
    H, KV, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps, T = cfg["rms_norm_eps"], len(ids)

    def rms(x, w):
        return w * (x / np.sqrt((x * x).mean(-1, keepdims=True) + eps))

    inv = 1.0 / (cfg["rope_theta"] ** (np.arange(0, D, 2) / D))
    ang = np.arange(T)[:, None] * inv[None, :]            # [T, D/2]
    cos, sin = np.cos(ang), np.sin(ang)

    def rope(x):                                           # x [T, heads, D], pairs (i, i + D/2)
        a, b = x[..., :D // 2], x[..., D // 2:]
        c, s = cos[:, None, :], sin[:, None, :]
        return np.concatenate([a * c - b * s, b * c + a * s], -1)

    x = W["model.embed_tokens.weight"][ids]                # [T, hidden]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms(x, W[p + "input_layernorm.weight"])
        q = rope((h @ W[p + "self_attn.q_proj.weight"].T).reshape(T, H, D))
        k = rope((h @ W[p + "self_attn.k_proj.weight"].T).reshape(T, KV, D))
        v = (h @ W[p + "self_attn.v_proj.weight"].T).reshape(T, KV, D)
        out = np.zeros((T, H, D))
        for hh in range(H):
            kv = hh // (H // KV)                           # query head hh reads kv head hh // group
            s = q[:, hh] @ k[:, kv].T / np.sqrt(D)
            s[np.triu_indices(T, 1)] = -np.inf
            s = np.exp(s - s.max(-1, keepdims=True))
            out[:, hh] = (s / s.sum(-1, keepdims=True)) @ v[:, kv]
        x = x + out.reshape(T, H * D) @ W[p + "self_attn.o_proj.weight"].T
        h = rms(x, W[p + "post_attention_layernorm.weight"])
        g = h @ W[p + "mlp.gate_proj.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * (h @ W[p + "mlp.up_proj.weight"].T)) @ W[p + "mlp.down_proj.weight"].T
    return rms(x, W["model.norm.weight"]) @ W["model.embed_tokens.weight"].T


def main():
    torch.manual_seed(0)
    worst = 0.0
    for layers, hidden, heads, kv, dim, inter, T in ((1, 48, 3, 1, 16, 40, 7), (2, 64, 4, 2, 16, 96, 13),
                                                     (3, 96, 6, 6, 16, 80, 5)):
        cfg = {"vocab_size": 101, "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
               "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": dim, "rms_norm_eps": 1e-5,
               "rope_theta": 10000.0, "tie_word_embeddings": True}
        m = LlamaLM(cfg).eval()
        with torch.no_grad():  # norms away from 1 so a missing weight would show
            for n, p in m.named_parameters():
                p.add_(torch.randn_like(p) * (0.3 if "norm" in n else 0.05))
        ids = torch.randint(0, 101, (T,))
        with torch.no_grad():
            ours = m(ids[None])[0].double().numpy()
        ref = reference_logits(m.state_dict(), cfg, ids.numpy())
        err = np.abs(ours - ref).max() / max(1.0, np.abs(ref).max())
        print(f"layers {layers} hidden {hidden} heads {heads}/{kv} T {T}: max rel err {err:.2e}")
        worst = max(worst, err)
    if worst > 1e-4:
        sys.exit(f"check_llama_math: FAILED, worst {worst:.2e}")
    print("check_llama_math: ok")


if __name__ == "__main__":
    main()
