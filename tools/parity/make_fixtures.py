#!/usr/bin/env python3
"""Builds the architecture parity fixtures: one tiny random checkpoint per supported architecture,
shaped like a real model of its family (the family's head_dim where it sets one, else hidden/heads = 32, rope settings, norms), saved in bf16,
and float32 reference logits from Hugging Face transformers computed on the CPU.

Runs on the GPU machine (it has torch + transformers; no weights needed):
    python3 tools/parity/make_fixtures.py OUT_DIR [NAME ...]
Writes OUT_DIR/<name>/{config.json, model.safetensors, golden.json, logits.bin} for every fixture (or
only the NAMEs given), then copy the folders to tests/fixtures/models/. OUT_DIR/summary.json gets one
entry per fixture built (merged into the file when OUT_DIR already has one). logits.bin is
little-endian float32 [rows, vocab]: one row per token fed to the model (the prompt, then each greedy
token except the last); row i predicts token i+1.
Some fixtures keep the config.json layout real Hub checkpoints use (rope_scaling, rope_theta,
sliding_window_pattern ...) instead of the transformers-5 layout that save_pretrained writes.

Goldens: by default greedy decoding with a full forward over the whole sequence at every step, and the
logits of one forward over every row. Fixtures whose rope depends on the forward's length (longrope:
transformers takes the long factors for a whole forward once max(position) + 1 exceeds
original_max_position_embeddings) are made as transformers generates with a KV cache instead
(golden "cache"): the prompt in one forward, then one token per forward with past_key_values, each
row's logits from the forward that fed its token (keys already in the cache stay as they were rotated).
"""
import json
import os
import sys

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

VOCAB = 256
PROMPT_LEN = 21   # longer than the sliding windows below, and crosses a 16-token KV block
NEW_TOKENS = 8

# Longrope factors for rotary dims of 2 * n.
def longrope_factors(n):
    return {"type": "longrope", "short_factor": [1.0 + 0.05 * i for i in range(n)],
            "long_factor": [1.0 + 0.5 * i for i in range(n)]}


# A llama-shaped model of the given head_dim (head_dims the tuned CUDA attention kernels do not take).
def odd_head_dim(head_dim, heads, kv_heads, **extra):
    return dict(dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=heads,
                     num_key_value_heads=kv_heads, head_dim=head_dim, rms_norm_eps=1e-5, rope_theta=10000.0,
                     max_position_embeddings=4096, tie_word_embeddings=False), **extra)


# name -> (model_type, config kwargs in the Hub layout, keep_hub_layout[, options]); options:
# prompt_len, new_tokens, golden ("forward", the default, or "cache": see the module docstring).
FIXTURES = {
    "llama3": ("llama", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-5, rope_theta=500000.0,
                             max_position_embeddings=131072, tie_word_embeddings=True,
                             rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}), False),
    "llama2_linear": ("llama", dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=2,
                                    num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=10000.0,
                                    max_position_embeddings=4096, tie_word_embeddings=False,
                                    rope_scaling={"type": "linear", "factor": 2.0}), True),
    "mistral": ("mistral", dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=1, head_dim=128, rms_norm_eps=1e-5, rope_theta=1000000.0,
                                sliding_window=7, max_position_embeddings=32768, tie_word_embeddings=False), True),
    "qwen2_yarn": ("qwen2", dict(hidden_size=64, intermediate_size=144, num_hidden_layers=2, num_attention_heads=2,
                                 num_key_value_heads=1, rms_norm_eps=1e-6, rope_theta=1000000.0,
                                 max_position_embeddings=131072, tie_word_embeddings=False,
                                 rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}), True),
    "qwen3": ("qwen3", dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=128, rms_norm_eps=1e-6, rope_theta=1000000.0,
                            max_position_embeddings=40960, tie_word_embeddings=True), False),
    "gemma": ("gemma", dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=2,
                            num_key_value_heads=1, head_dim=256, rms_norm_eps=1e-6, rope_theta=10000.0,
                            hidden_activation="gelu_pytorch_tanh", max_position_embeddings=8192), True),
    "gemma2": ("gemma2", dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=2,
                              num_key_value_heads=1, head_dim=256, rms_norm_eps=1e-6, rope_theta=10000.0,
                              query_pre_attn_scalar=224, sliding_window=6, attn_logit_softcapping=50.0,
                              final_logit_softcapping=30.0, hidden_activation="gelu_pytorch_tanh",
                              max_position_embeddings=8192), False),
    "gemma3": ("gemma3_text", dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=1, head_dim=256, rms_norm_eps=1e-6, rope_theta=1000000.0,
                                   rope_local_base_freq=10000.0, rope_scaling={"rope_type": "linear", "factor": 8.0},
                                   sliding_window=5, sliding_window_pattern=2, query_pre_attn_scalar=256,
                                   max_position_embeddings=131072), True),
    "gemma3_v5": ("gemma3_text", dict(hidden_size=32, intermediate_size=96, num_hidden_layers=3, num_attention_heads=2,
                                      num_key_value_heads=1, head_dim=256, rms_norm_eps=1e-6, rope_theta=1000000.0,
                                      rope_local_base_freq=10000.0, sliding_window=8, sliding_window_pattern=3,
                                      query_pre_attn_scalar=256, max_position_embeddings=32768), False),
    "phi3": ("phi3", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                          num_key_value_heads=1, rms_norm_eps=1e-5, rope_theta=10000.0, partial_rotary_factor=0.75,
                          max_position_embeddings=131072, original_max_position_embeddings=4096,
                          tie_word_embeddings=False,
                          rope_scaling={"type": "longrope",
                                        "short_factor": [1.0 + 0.05 * i for i in range(12)],
                                        "long_factor": [1.0 + 0.5 * i for i in range(12)]}), True),
    "granite": ("granite", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                                num_key_value_heads=1, rms_norm_eps=1e-5, rope_theta=10000.0,
                                embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0625,
                                logits_scaling=8.0, max_position_embeddings=4096, tie_word_embeddings=True), True),
    "olmo2": ("olmo2", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                            num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=500000.0,
                            max_position_embeddings=4096, tie_word_embeddings=False), False),
    "starcoder2": ("starcoder2", dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=1, norm_epsilon=1e-5, rope_theta=100000.0, use_bias=True,
                                      sliding_window=9, hidden_act="gelu_pytorch_tanh", max_position_embeddings=16384,
                                      tie_word_embeddings=True), True),
    "smollm3": ("smollm3", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=2,
                                num_key_value_heads=1, rms_norm_eps=1e-6, rope_theta=2000000.0,
                                no_rope_layer_interval=4, max_position_embeddings=65536,
                                tie_word_embeddings=True), False),
    # Phi-3 longrope past the original context (original_max_position_embeddings 32): a 37-token prompt
    # (every position takes the long factors), full rotary dims (the CUDA fused q/k prep and decode).
    "phi3_longrope_prompt": ("phi3", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                                          num_key_value_heads=1, rms_norm_eps=1e-5, rope_theta=10000.0,
                                          max_position_embeddings=256, original_max_position_embeddings=32,
                                          tie_word_embeddings=False, rope_scaling=longrope_factors(16)), True,
                             dict(prompt_len=37, new_tokens=8, golden="cache")),
    # A 27-token prompt (short factors) whose decoding crosses position 32: tokens from there on take
    # the long factors, the keys before keep the short ones. Partial rotary (24 of 32 dims).
    "phi3_longrope_cross": ("phi3", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                                         num_key_value_heads=1, rms_norm_eps=1e-5, rope_theta=10000.0,
                                         partial_rotary_factor=0.75, max_position_embeddings=256,
                                         original_max_position_embeddings=32, tie_word_embeddings=False,
                                         rope_scaling=longrope_factors(12)), True,
                            dict(prompt_len=27, new_tokens=12, golden="cache")),
    # head_dims the CUDA tuned attention kernels do not take (the generic kernel serves them).
    "llama_hd16": ("llama", odd_head_dim(16, 4, 2), True),
    "llama_hd24": ("llama", odd_head_dim(24, 4, 1), True),
    "qwen3_hd40": ("qwen3", odd_head_dim(40, 4, 2, rms_norm_eps=1e-6, tie_word_embeddings=True), False),
    "mistral_hd48": ("mistral", odd_head_dim(48, 4, 2, sliding_window=7), True),
    "llama_hd80": ("llama", odd_head_dim(80, 2, 2), True),
    "llama_hd112": ("llama", odd_head_dim(112, 2, 1), True),  # transformers wants hidden % heads == 0
}


def randomize(model, seed):
    """Non-trivial weights: matrices ~N(0, 0.08); 1-d weights (norms, biases) spread around their
    initial value (1 for plain norms, 0 for Gemma's (1 + w) norms and biases)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.08)
            else:
                center = 1.0 if torch.allclose(p, torch.ones_like(p)) else 0.0
                p.copy_(center + torch.randn(p.shape, generator=g) * 0.1)


def forward_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def cached_greedy(model, prompt, new_tokens):
    """Greedy decoding as transformers generates with a KV cache: the prompt in one forward, then one
    token per forward. Returns the generated ids and the logits of every token fed [rows, vocab]."""
    with torch.no_grad():
        out = model(torch.tensor([prompt]), use_cache=True)
        rows, past, generated = [out.logits[0].float()], out.past_key_values, []
        for step in range(new_tokens):
            generated.append(int(rows[-1][-1].argmax()))
            if step + 1 == new_tokens:
                break
            out = model(torch.tensor([[generated[-1]]]), past_key_values=past, use_cache=True)
            rows.append(out.logits[0].float())
            past = out.past_key_values
    return generated, torch.cat(rows, 0)


def main():
    out = sys.argv[1]
    torch.set_num_threads(8)
    os.makedirs(out, exist_ok=True)
    summary_path = os.path.join(out, "summary.json")
    summary = {}
    if os.path.exists(summary_path):
        with open(summary_path) as f:
            summary = json.load(f)
    only = set(sys.argv[2:])
    unknown = only - set(FIXTURES)
    if unknown:
        sys.exit(f"make_fixtures: unknown fixture(s) {sorted(unknown)}; known: {list(FIXTURES)}")
    failed = []
    for i, (name, spec) in enumerate(FIXTURES.items()):
        if only and name not in only:
            continue
        model_type, kw, keep_hub = spec[:3]
        options = spec[3] if len(spec) > 3 else {}
        try:
            build(out, i, name, model_type, kw, keep_hub, options, summary)
        except Exception as e:  # one broken family must not hide the others' results
            print(f"{name}: FAILED: {type(e).__name__}: {e}", flush=True)
            failed.append(name)
    with open(summary_path, "w") as f:
        json.dump(summary, f, indent=1)
    if failed:
        sys.exit(f"make_fixtures: failed: {failed}")


def build(out, i, name, model_type, kw, keep_hub, options, summary):
    if True:
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        kw = dict(kw, vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=0)
        cfg = AutoConfig.for_model(model_type, **kw)
        torch.manual_seed(1000 + i)
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", torch_dtype=torch.float32)
        randomize(model, 1000 + i)
        model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
        if keep_hub:  # the layout Hub checkpoints use, not the one transformers 5 writes
            hub = dict(kw, model_type=model_type, architectures=[type(model).__name__], torch_dtype="bfloat16")
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(hub, f, indent=2)
        # The reference: the saved bf16 checkpoint, upcast to float32, eager attention, on the CPU.
        ref = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager").eval()
        g = torch.Generator().manual_seed(7 + i)
        prompt_len, new_tokens = options.get("prompt_len", PROMPT_LEN), options.get("new_tokens", NEW_TOKENS)
        prompt = torch.randint(3, VOCAB, (prompt_len,), generator=g).tolist()
        mode = options.get("golden", "forward")
        if mode == "cache":
            generated, logits = cached_greedy(ref, prompt, new_tokens)
        else:
            ids = list(prompt)
            for _ in range(new_tokens):  # greedy, full forward each step (no cache)
                ids.append(int(forward_logits(ref, ids)[-1].argmax()))
            generated = ids[len(prompt):]
            logits = forward_logits(ref, ids[:-1])
        assert logits.shape[0] == len(prompt) + len(generated) - 1, (logits.shape, len(prompt), len(generated))
        logits.numpy().astype("<f4").tofile(os.path.join(d, "logits.bin"))
        golden = {"prompt_ids": prompt, "generated_ids": generated, "rows": logits.shape[0], "vocab": logits.shape[1],
                  "max_abs_logit": float(logits.abs().max()), "golden": mode, "transformers": transformers.__version__,
                  "torch": torch.__version__}
        with open(os.path.join(d, "golden.json"), "w") as f:
            json.dump(golden, f, indent=1)
        for junk in ("generation_config.json",):
            if os.path.exists(os.path.join(d, junk)):
                os.remove(os.path.join(d, junk))
        size = os.path.getsize(os.path.join(d, "model.safetensors"))
        summary[name] = {"bytes": size, "generated": generated}
        print(f"{name:14s} {model_type:12s} {size/1024:7.1f} KiB  max|logit| {golden['max_abs_logit']:.3f}  gen {generated}",
              flush=True)


if __name__ == "__main__":
    main()
