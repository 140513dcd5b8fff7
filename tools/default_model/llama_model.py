# A minimal Llama decoder for training arbor's default model, with the module
# and parameter names of transformers' LlamaForCausalLM so its state_dict loads
# there unchanged (export_hf.py checks the logits match).
#
# Math follows HF Llama exactly: pre-norm RMSNorm (fp32 inside), RoPE on
# rotate_half layout (cos/sin of cat(freqs, freqs)), GQA by repeating kv heads,
# SwiGLU MLP, no biases, tied lm_head. Residual dropout is training-only and
# leaves no trace in the weights.
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))  # [dim]
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_cos_sin(positions, head_dim, theta, dtype):
    """positions [T] -> cos, sin [T, head_dim], computed in fp32 as HF does."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device).float() / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]  # [T, head_dim/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_heads = cfg["num_attention_heads"]
        self.n_kv = cfg["num_key_value_heads"]
        self.head_dim = cfg["head_dim"]
        h = cfg["hidden_size"]
        self.q_proj = nn.Linear(h, self.n_heads * self.head_dim, bias=False)  # [n_heads*head_dim, hidden]
        self.k_proj = nn.Linear(h, self.n_kv * self.head_dim, bias=False)     # [n_kv*head_dim, hidden]
        self.v_proj = nn.Linear(h, self.n_kv * self.head_dim, bias=False)     # [n_kv*head_dim, hidden]
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, h, bias=False)  # [hidden, n_heads*head_dim]

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # [B, H, T, D]
        k = self.k_proj(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)     # [B, KV, T, D]
        v = self.v_proj(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.n_heads // self.n_kv
        k = k[:, :, None].expand(B, self.n_kv, rep, T, self.head_dim).reshape(B, self.n_heads, T, self.head_dim)
        v = v[:, :, None].expand(B, self.n_kv, rep, T, self.head_dim).reshape(B, self.n_heads, T, self.head_dim)
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch < 2.0 (the Debian CPU build used for smoke tests)
            att = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~mask, float("-inf")).float().softmax(-1).to(q.dtype)
            y = att @ v
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h, i = cfg["hidden_size"], cfg["intermediate_size"]
        self.gate_proj = nn.Linear(h, i, bias=False)  # [inter, hidden]
        self.up_proj = nn.Linear(h, i, bias=False)    # [inter, hidden]
        self.down_proj = nn.Linear(i, h, bias=False)  # [hidden, inter]

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, dropout):
        x = x + F.dropout(self.self_attn(self.input_layernorm(x), cos, sin), dropout, self.training)
        return x + F.dropout(self.mlp(self.post_attention_layernorm(x)), dropout, self.training)


class Body(nn.Module):
    """HF's LlamaModel: the `model.` prefix of the parameter names."""

    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])  # [vocab, hidden]
        self.layers = nn.ModuleList([DecoderLayer(cfg) for _ in range(cfg["num_hidden_layers"])])
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])


class LlamaLM(nn.Module):
    def __init__(self, cfg, dropout=0.0):
        super().__init__()
        self.cfg = cfg
        self.dropout = dropout
        self.model = Body(cfg)
        self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)
        assert cfg["tie_word_embeddings"], "this trainer writes tied embeddings only"
        self.lm_head.weight = self.model.embed_tokens.weight
        self._init_weights()

    def _init_weights(self):
        # GPT-2 init: N(0, 0.02), residual output projections scaled by
        # 1/sqrt(2 * layers) so the residual stream's variance stays ~1.
        std = 0.02
        for name, p in self.named_parameters():
            if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
                nn.init.normal_(p, 0.0, std / math.sqrt(2 * self.cfg["num_hidden_layers"]))
            else:
                nn.init.normal_(p, 0.0, std)

    def forward(self, ids):
        """ids [B, T] (positions 0..T-1) -> logits [B, T, vocab]."""
        T = ids.shape[1]
        x = self.model.embed_tokens(ids)
        cos, sin = rope_cos_sin(torch.arange(T, device=ids.device), self.cfg["head_dim"],
                                self.cfg["rope_theta"], x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin, self.dropout)
        return self.lm_head(self.model.norm(x))


def param_count(model):
    return sum(p.numel() for p in model.parameters())  # tied weights counted once
