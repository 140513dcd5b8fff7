#!/usr/bin/env python3
"""Builds the architecture parity fixtures: one tiny random checkpoint per supported architecture,
shaped like a real model of its family (the family's head_dim where it sets one, else hidden/heads = 32, rope settings, norms), saved in bf16,
and float32 reference logits from Hugging Face transformers computed on the CPU.

Runs on the GPU machine (it has torch + transformers; no weights needed):
    python3 tools/parity/make_fixtures.py OUT_DIR
Writes OUT_DIR/<name>/{config.json, model.safetensors, golden.json, logits.bin}, then copy the folders
to tests/fixtures/models/. logits.bin is little-endian float32 [rows, vocab]: one row per token fed to
the model (the prompt, then each greedy token except the last); row i predicts token i+1.
Some fixtures keep the config.json layout real Hub checkpoints use (rope_scaling, rope_theta,
sliding_window_pattern ...) instead of the transformers-5 layout that save_pretrained writes.
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

# name -> (model_type, config kwargs in the Hub layout, keep_hub_layout)
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


def main():
    out = sys.argv[1]
    torch.set_num_threads(8)
    summary = {}
    only = set(sys.argv[2:])
    for i, (name, (model_type, kw, keep_hub)) in enumerate(FIXTURES.items()):
        if only and name not in only:
            continue
        try:
            build(out, i, name, model_type, kw, keep_hub, summary)
        except Exception as e:  # one broken family must not hide the others' results
            print(f"{name}: FAILED: {type(e).__name__}: {e}", flush=True)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)


def build(out, i, name, model_type, kw, keep_hub, summary):
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
        prompt = torch.randint(3, VOCAB, (PROMPT_LEN,), generator=g).tolist()
        ids = list(prompt)
        for _ in range(NEW_TOKENS):  # greedy, full forward each step (no cache)
            ids.append(int(forward_logits(ref, ids)[-1].argmax()))
        generated = ids[len(prompt):]
        logits = forward_logits(ref, ids[:-1])
        logits.numpy().astype("<f4").tofile(os.path.join(d, "logits.bin"))
        golden = {"prompt_ids": prompt, "generated_ids": generated, "rows": logits.shape[0], "vocab": logits.shape[1],
                  "max_abs_logit": float(logits.abs().max()), "transformers": transformers.__version__,
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
