#!/usr/bin/env python3
"""MLX affine parity fixtures: tiny quantized checkpoints made by arbor, with golden logits from Hugging Face
transformers run in float32 on their dequantized weights, and transformers' own bf16 error on the GPU.

Two stages:

  affine_fixtures.py make ARBOR OUT_DIR [NAME ...]
      Here, with nothing but python3 and the arbor binary ARBOR. For every fixture (or the NAMEs given): writes a
      config, `arbor synth` makes a dense bf16 checkpoint of it, and `arbor quantize` (or `arbor synth --bits`)
      the quantized one. Per-module overrides come from the recipes (mlx-lm's mixed_*), and from splicing: a
      module taken from a second `arbor quantize` of the same dense weights at other bits / group size (config
      entry {"group_size", "bits"}), or left dense with its dense weight (config entry false). Writes
      OUT_DIR/<name>/{config.json, model.safetensors}. Nothing here computes a weight: every code, scale and bias
      is arbor's.

  affine_fixtures.py golden DIR [DIR ...]
      On the GPU machine (python3 with numpy, torch, transformers; no internet, no weights needed). For each
      fixture directory: dequantizes every affine module with numpy, independently of arbor (code j of a row at
      bits [j*B, j*B + B) of the row's little-endian bit stream; w = float32(scale) * q + float32(bias), one
      float32 multiply and one float32 add), builds the transformers model in float32 from those weights (CPU,
      eager attention), and writes
        golden.json  prompt_ids, generated_ids (greedy, a full forward per step), rows, vocab, max_abs_logit,
                     min_margin (the smallest top-1 minus top-2 gap of the greedy steps, relative to
                     max_abs_logit), coverage (what the fixture exercises), and "bf16": transformers itself in
                     bfloat16 on the GPU on the same dequantized weights: max_rel_error (max |bf16 - f32| over
                     every row / max_abs_logit), row_rel_errors, its own greedy ids, the device;
        logits.bin   little-endian float32 [rows, vocab]: one row per token fed (the prompt, then each greedy
                     token except the last); row i predicts token i + 1.
      The prompt is drawn from a seeded generator, redrawn (next seed) while a greedy step's margin is below
      1e-3 of max_abs_logit, so that an exact implementation's ids cannot flip on rounding.
      Prints one line per fixture; exits 1 if any failed.

The fixtures live in tests/fixtures/affine/ (tests/model/affine_fixture_test.cpp: the CPU within 2e-3 of
max|ref| with the greedy ids; tests/cuda/affine_fixture_test.cpp: CUDA no worse than transformers' bf16).
"""
import json
import os
import shutil
import struct
import subprocess
import sys

VOCAB = 256
PROMPT_LEN = 21   # crosses a 16-token KV block and gemma3's sliding window below
NEW_TOKENS = 8

LLAMA = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=64, intermediate_size=128,
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
             rope_theta=500000.0, max_position_embeddings=4096, hidden_act="silu")
QWEN3 = dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], hidden_size=128, intermediate_size=256,
             num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-6,
             rope_theta=1000000.0, max_position_embeddings=40960, hidden_act="silu")
GEMMA3 = dict(model_type="gemma3_text", architectures=["Gemma3ForCausalLM"], hidden_size=128, intermediate_size=256,
              num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=128, rms_norm_eps=1e-6,
              rope_theta=1000000.0, rope_local_base_freq=10000.0, sliding_window=5, sliding_window_pattern=2,
              query_pre_attn_scalar=128, max_position_embeddings=131072, hidden_activation="gelu_pytorch_tanh")


def cfg(base, **kw):
    return dict(base, vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=0, torch_dtype="bfloat16", **kw)


# name -> config, how ("quantize", bits, group, recipe or None) | ("synth", bits, group), overrides
# {module: (bits, group) | False}.
FIXTURES = {
    # Untied: quantized embedding and quantized head; one module at 8-bit g32 and one left dense (false).
    "llama_q4_g64": (cfg(LLAMA, tie_word_embeddings=False), ("quantize", 4, 64, None),
                     {"model.layers.0.mlp.down_proj": (8, 32), "model.layers.1.self_attn.o_proj": False}),
    # Tied 2-bit embedding; mlx-lm's mixed_2_6 recipe: 6-bit v_proj/down_proj in its "more bits" layers.
    "llama_q2_g32_mixed": (cfg(LLAMA, tie_word_embeddings=True, num_hidden_layers=3), ("quantize", 2, 32, "mixed_2_6"), {}),
    # Untied, group 128; mixed_3_6: 6-bit head and v_proj/down_proj in some layers, 3-bit elsewhere.
    "qwen3_q3_g128_mixed": (cfg(QWEN3, tie_word_embeddings=False), ("quantize", 3, 128, "mixed_3_6"), {}),
    # Tied, 5-bit g32, the embedding (hence the head) kept dense by the config (false).
    "qwen3_q5_g32": (cfg(QWEN3, tie_word_embeddings=True, hidden_size=64, intermediate_size=192, head_dim=32,
                         num_hidden_layers=2),
                     ("quantize", 5, 32, None), {"model.embed_tokens": False, "model.layers.1.mlp.gate_proj": (2, 64)}),
    # Gemma 3 (tied, scaled embedding, sliding window): 6-bit g64.
    "gemma3_q6_g64": (cfg(GEMMA3, tie_word_embeddings=True), ("quantize", 6, 64, None),
                      {"model.layers.0.self_attn.q_proj": (3, 128)}),
    # Gemma 3, random codes from `arbor synth --bits 8 --group-size 128`.
    "gemma3_q8_g128_synth": (cfg(GEMMA3, tie_word_embeddings=True), ("synth", 8, 128), {}),
}


# ---------------------------------------------------------------------------------------------- safetensors I/O
ELEM = {"F32": 4, "F16": 2, "BF16": 2, "U32": 4, "I32": 4, "U8": 1, "I64": 8}


def read_raw(path):
    """{name: (dtype, shape, bytes)} in file order"""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        out[name] = (e["dtype"], list(e["shape"]), data[8 + n + a:8 + n + b])
    return out


def read_dir_raw(d):
    files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    if not files:
        raise RuntimeError(f"{d}: no .safetensors files")
    out = {}
    for f in files:
        out.update(read_raw(os.path.join(d, f)))
    return out


def write_raw(path, tensors, metadata):
    header, off = {}, 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for _, (_, _, raw) in tensors.items():
            f.write(raw)


# ---------------------------------------------------------------------------------------------------- make
def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}")
    return r.stdout


def make_one(arbor, out, name, config, how, overrides):
    work = os.path.join(out, ".work", name)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    with open(os.path.join(work, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    dense = os.path.join(work, "dense")
    run([arbor, "synth", "--config", os.path.join(work, "config.json"), "--out", dense, "--dtype", "bf16"])
    q = os.path.join(work, "q")
    if how[0] == "synth":
        run([arbor, "synth", "--config", os.path.join(work, "config.json"), "--out", q, "--dtype", "bf16",
             "--bits", str(how[1]), "--group-size", str(how[2])])
    else:
        cmd = [arbor, "quantize", "--model", dense, "--out", q, "--bits", str(how[1]), "--group-size", str(how[2]),
               "--threads", "2"]
        if how[3]:
            cmd += ["--recipe", how[3]]
        run(cmd)
    with open(os.path.join(q, "config.json")) as f:
        qcfg = json.load(f)
    tensors = read_dir_raw(q)
    dense_t = read_dir_raw(dense)
    for module, o in overrides.items():
        if module + ".scales" not in tensors:
            raise RuntimeError(f"{name}: override of {module}: it is not quantized in the base checkpoint")
        for part in (".weight", ".scales", ".biases"):
            del tensors[module + part]
        if o is False:
            tensors[module + ".weight"] = dense_t[module + ".weight"]
            entry = False
        else:
            bits, group = o
            src = os.path.join(work, f"q{bits}g{group}")
            if not os.path.exists(src):
                run([arbor, "quantize", "--model", dense, "--out", src, "--bits", str(bits), "--group-size", str(group),
                     "--threads", "2"])
            other = read_dir_raw(src)
            for part in (".weight", ".scales", ".biases"):
                tensors[module + part] = other[module + part]
            entry = {"group_size": group, "bits": bits}
        for key in ("quantization", "quantization_config"):
            qcfg[key][module] = entry
    d = os.path.join(out, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(qcfg, f, indent=2)
    write_raw(os.path.join(d, "model.safetensors"), dict(sorted(tensors.items())), {"format": "mlx"})
    size = os.path.getsize(os.path.join(d, "model.safetensors"))
    print(f"{name:24s} {size / 1024:7.1f} KiB  {how}  overrides {overrides}", flush=True)


def make(argv):
    if len(argv) < 2:
        sys.exit("usage: affine_fixtures.py make ARBOR OUT_DIR [NAME ...]")
    arbor, out, only = os.path.abspath(argv[0]), argv[1], set(argv[2:])
    unknown = only - set(FIXTURES)
    if unknown:
        sys.exit(f"affine_fixtures: unknown fixture(s) {sorted(unknown)}; known: {list(FIXTURES)}")
    for name, (config, how, overrides) in FIXTURES.items():
        if not only or name in only:
            make_one(arbor, out, name, config, how, overrides)
    shutil.rmtree(os.path.join(out, ".work"), ignore_errors=True)


# -------------------------------------------------------------------------------------------------- golden
def golden(argv):
    import numpy as np
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM
    from safetensors.torch import save_file

    np_dtype = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "U32": np.uint32}

    def array(dtype, shape, raw):
        return np.frombuffer(raw, dtype=np.dtype(np_dtype[dtype]).newbyteorder("<")).reshape(shape)

    def to_f32(dtype, a):
        if dtype == "BF16":
            return (a.astype(np.uint32) << 16).view(np.float32)
        return a.astype(np.float32)

    def dequantize(codes, scales, biases, bits, group):
        """codes uint32 [rows, cols*bits/32]; scales, biases float32 [rows, cols/group] -> float32 [rows, cols]"""
        rows, words = codes.shape
        cols = words * 32 // bits
        assert scales.shape == (rows, cols // group), (scales.shape, rows, cols, group)
        stream = np.unpackbits(codes.astype("<u4").view(np.uint8).reshape(rows, words * 4), axis=1, bitorder="little")
        q = stream[:, :cols * bits].reshape(rows, cols, bits).astype(np.uint32)
        q = (q << np.arange(bits, dtype=np.uint32)).sum(axis=2, dtype=np.uint32).astype(np.float32)
        s = np.repeat(scales, group, axis=1)
        b = np.repeat(biases, group, axis=1)
        prod = (s * q).astype(np.float32)   # one float32 rounding
        return (prod + b).astype(np.float32)  # and another

    def params_for(qc, module):
        if module in qc:
            e = qc[module]
            if e is False:
                return None
            if e is True:
                return qc["bits"], qc["group_size"]
            return e["bits"], e["group_size"]
        return qc["bits"], qc["group_size"]

    def forward_logits(model, ids, device):
        with torch.no_grad():
            return model(torch.tensor([ids], device=device)).logits[0].float().cpu()

    torch.set_num_threads(8)
    cuda = torch.cuda.is_available()
    failed = []
    for i, d in enumerate(argv):
        name = os.path.basename(os.path.normpath(d))
        try:
            with open(os.path.join(d, "config.json")) as f:
                config = json.load(f)
            qc = config.get("quantization", config.get("quantization_config"))
            raw = read_dir_raw(d)
            state, cov = {}, {"bits": set(), "group_sizes": set(), "overrides": 0, "dense_by_config": [], "affine": []}
            for tname, (dtype, shape, data) in raw.items():
                if tname.endswith(".scales") or tname.endswith(".biases"):
                    continue
                module = tname[:-len(".weight")] if tname.endswith(".weight") else None
                if module and module + ".scales" in raw:
                    p = params_for(qc, module)
                    if p is None:
                        raise RuntimeError(f"{module}: .scales stored but the config keeps it dense")
                    bits, group = p
                    sd, ss, sdata = raw[module + ".scales"]
                    bd, bs, bdata = raw[module + ".biases"]
                    w = dequantize(array(dtype, shape, data), to_f32(sd, array(sd, ss, sdata)), to_f32(bd, array(bd, bs, bdata)),
                                   bits, group)
                    state[tname] = torch.from_numpy(w.copy())
                    cov["bits"].add(bits), cov["group_sizes"].add(group), cov["affine"].append(module)
                else:
                    state[tname] = torch.from_numpy(to_f32(dtype, array(dtype, shape, data)).copy())
                    if module and module in qc and qc[module] is False:
                        cov["dense_by_config"].append(module)
            cov["overrides"] = sum(1 for k, v in qc.items() if isinstance(v, (dict, bool)))
            embed_q = "model.embed_tokens" in cov["affine"]
            tied = bool(config.get("tie_word_embeddings", False))
            coverage = {"model_type": config["model_type"], "bits": sorted(cov["bits"]), "group_sizes": sorted(cov["group_sizes"]),
                        "override_entries": cov["overrides"], "dense_by_config": cov["dense_by_config"],
                        "quantized_embedding": embed_q, "tied": tied,
                        "quantized_head": (embed_q if tied else "lm_head" in cov["affine"]),
                        "affine_modules": len(cov["affine"])}
            # The dense float32 model: config without the quantization blocks, the dequantized weights.
            tmp = os.path.join(d, ".hf_f32")
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
            hf_cfg = {k: v for k, v in config.items() if k not in ("quantization", "quantization_config")}
            hf_cfg["torch_dtype"] = "float32"
            with open(os.path.join(tmp, "config.json"), "w") as f:
                json.dump(hf_cfg, f, indent=2)
            save_file(state, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
            ref, info = AutoModelForCausalLM.from_pretrained(tmp, torch_dtype=torch.float32, attn_implementation="eager",
                                                             output_loading_info=True)
            ref.eval()
            missing = [k for k in info.get("missing_keys", []) if not (tied and k == "lm_head.weight")]
            if missing or info.get("unexpected_keys") or info.get("mismatched_keys"):
                raise RuntimeError(f"transformers did not take every weight: missing {missing}, "
                                   f"unexpected {info.get('unexpected_keys')}, mismatched {info.get('mismatched_keys')}")
            vocab = config["vocab_size"]
            for attempt in range(20):
                g = torch.Generator().manual_seed(7 + 100 * i + attempt)
                prompt = torch.randint(3, vocab, (PROMPT_LEN,), generator=g).tolist()
                ids, margins = list(prompt), []
                for _ in range(NEW_TOKENS):
                    last = forward_logits(ref, ids, "cpu")[-1]
                    top = torch.topk(last, 2).values
                    margins.append(float(top[0] - top[1]))
                    ids.append(int(last.argmax()))
                logits = forward_logits(ref, ids[:-1], "cpu")
                max_abs = float(logits.abs().max())
                if min(margins) >= 1e-3 * max_abs:
                    break
            else:
                raise RuntimeError("no prompt in 20 draws without a near-tie greedy step")
            generated = ids[len(prompt):]
            logits.numpy().astype("<f4").tofile(os.path.join(d, "logits.bin"))
            golden = {"prompt_ids": prompt, "generated_ids": generated, "rows": logits.shape[0], "vocab": logits.shape[1],
                      "max_abs_logit": max_abs, "min_margin": min(margins) / max_abs, "prompt_draw": attempt,
                      "coverage": coverage, "transformers": transformers.__version__, "torch": torch.__version__}
            # transformers itself in bf16 on the GPU, on the same weights: the error CUDA must not exceed.
            if cuda:
                m16 = AutoModelForCausalLM.from_pretrained(tmp, torch_dtype=torch.bfloat16, attn_implementation="eager").cuda().eval()
                l16 = forward_logits(m16, ids[:-1], "cuda")
                row_err = ((l16 - logits).abs().max(dim=1).values / max_abs).tolist()
                ids16 = list(prompt)
                for _ in range(NEW_TOKENS):
                    ids16.append(int(forward_logits(m16, ids16, "cuda")[-1].argmax()))
                golden["bf16"] = {"max_rel_error": max(row_err), "row_rel_errors": row_err, "generated_ids": ids16[len(prompt):],
                                  "device": torch.cuda.get_device_name(0), "attn_implementation": "eager"}
                del m16
            else:
                golden["bf16"] = None
            with open(os.path.join(d, "golden.json"), "w") as f:
                json.dump(golden, f, indent=1)
            shutil.rmtree(tmp, ignore_errors=True)
            b = golden["bf16"]
            print(f"{name:24s} max|logit| {max_abs:.4f}  min margin {golden['min_margin']:.2e}  gen {generated}  "
                  f"bf16 err {b['max_rel_error'] if b else float('nan'):.3e} gen {b['generated_ids'] if b else '-'}  {coverage}",
                  flush=True)
        except Exception as e:  # one broken fixture must not hide the others' results
            import traceback
            traceback.print_exc()
            print(f"{name}: FAILED: {type(e).__name__}: {e}", flush=True)
            failed.append(name)
    if failed:
        sys.exit(f"affine_fixtures: failed: {failed}")


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("make", "golden"):
        sys.exit(__doc__)
    (make if sys.argv[1] == "make" else golden)(sys.argv[2:])
