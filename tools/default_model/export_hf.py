# Step 5 (called by train.py on the GPU machine): the trained weights become
# transformers' LlamaForCausalLM, saved with save_pretrained in bf16, reloaded
# from the shipped files in float32 to record the greedy golden and the
# README's sample generations (and, for the eval preset, the held-out
# perplexity that `arbor perplexity` must reproduce).
import glob
import hashlib
import json
import math
import os
import shutil

import torch

N_GOLDEN = 32
GOLDEN_PROMPT = "The state of the Union is"
GOLDEN_CHAT = [{"role": "user", "content": "Give a speech about education, schools and teachers."}]
SAMPLE_PROMPTS = [
    {"prompt": "The state of the Union is"},
    {"prompt": "Fellow-Citizens of the Senate and House of Representatives:"},
    {"prompt": "Our economy"},
    {"messages": [{"role": "user", "content": "Give a speech about taxes, tariffs and trade."}]},
    {"messages": [{"role": "system", "content": "You are Abraham Lincoln, President of the United States, "
                                                 "addressing Congress in 1862."},
                  {"role": "user", "content": "Talk about the war, the union and liberty."}]},
    {"messages": [{"role": "user", "content": "Hello! Who are you?"}]},
]
# Sampling settings of generation_config.json: a 5.6M-parameter model loops
# under greedy decoding, so the shipped default samples.
GEN_DEFAULTS = {"do_sample": True, "temperature": 0.8, "top_k": 40, "top_p": 0.95}

# Per preset: the folder name, the golden's plain-text prompts and chat
# prompts, the sample prompts, save_pretrained's shard size (the device tool
# returns files of at most 16 MiB) and the held-out text measured at each
# context.
EXPORTS = {
    "default": {"name": "arbor-tiny-sotu", "repo_dir": "models/arbor-tiny-sotu",
                "golden_prompts": [GOLDEN_PROMPT], "golden_chat": GOLDEN_CHAT, "samples": SAMPLE_PROMPTS,
                "max_shard_size": None, "heldout": None, "heldout_ctx": []},
    "eval": {"name": "arbor-eval-8m", "repo_dir": "tests/fixtures/eval-model",
             "golden_prompts": ["The state of the Union is", "Call me Ishmael. Some years ago"], "golden_chat": None,
             "samples": [{"prompt": p} for p in ("The state of the Union is", "Call me Ishmael.",
                                                   "The jury said", "Fellow-Citizens of the Senate and House of Representatives:",
                                                   "In the laboratory, the")],
             "max_shard_size": 15_000_000, "heldout": "tests/fixtures/eval-model/heldout.txt",
             "heldout_ctx": [128, 512, 1024]},
}
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read())
    return h.hexdigest()


class AsHF:
    """Calls our training module the way greedy() calls LlamaForCausalLM."""

    class Out:
        def __init__(self, logits):
            self.logits = logits

    def __init__(self, model):
        self.model = model

    def __call__(self, input_ids):
        return AsHF.Out(self.model(input_ids))


def render_chat(template, messages, bos, add_generation_prompt=True):
    # The environment transformers uses for apply_chat_template.
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=messages, bos_token=bos, add_generation_prompt=add_generation_prompt)


@torch.no_grad()
def greedy(model, ids, n, device):
    """Argmax continuation without KV cache or early stop: each step is a full
    forward over prompt + generated tokens. Returns ids, top1-top2 margins and
    the first step's top 10 (id, logit)."""
    seq, margins, first = list(ids), [], None
    for i in range(n):
        logits = model(input_ids=torch.tensor([seq], device=device)).logits[0, -1].float().cpu()
        top = torch.topk(logits, 10)
        if i == 0:
            first = [[int(t), float(v)] for v, t in zip(top.values, top.indices)]
        margins.append(float(top.values[0] - top.values[1]))
        seq.append(int(top.indices[0]))
    return seq[len(ids):], margins, first


@torch.no_grad()
def sample(model, ids, n, device, eos, seed, temperature, top_k, top_p):
    g = torch.Generator(device="cpu").manual_seed(seed)
    seq = list(ids)
    for _ in range(n):
        logits = model(input_ids=torch.tensor([seq], device=device)).logits[0, -1].float().cpu() / temperature
        v, idx = torch.topk(logits, top_k)
        p = torch.softmax(v, -1)
        keep = (torch.cumsum(p, -1) - p) < top_p  # smallest prefix with mass >= top_p
        p = p * keep
        t = int(idx[torch.multinomial(p / p.sum(), 1, generator=g)])
        seq.append(t)
        if t in eos:
            break
    return seq[len(ids):]


def shard_safetensors(folder, max_bytes):
    """Splits folder/model.safetensors into model-0000i-of-0000n.safetensors of
    at most max_bytes each (whole tensors, in file order, bytes copied as they
    are) plus model.safetensors.index.json, as save_pretrained's sharding
    writes them; a folder already sharded is only checked. Pure Python, so it
    is tested on any machine (tools/eval_model/test_shard.py)."""
    single = os.path.join(folder, "model.safetensors")
    if not os.path.exists(single):
        for f in glob.glob(os.path.join(folder, "*.safetensors")):
            if os.path.getsize(f) > max_bytes:
                raise SystemExit(f"export_hf: {f} is {os.path.getsize(f)} bytes, over {max_bytes}")
        return
    with open(single, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        body = f.read()
    meta = header.pop("__metadata__", {"format": "pt"})
    names = sorted(header, key=lambda k: header[k]["data_offsets"][0])
    groups, size = [[]], 0
    for k in names:
        a, b = header[k]["data_offsets"]
        if b - a + 4096 > max_bytes:
            raise SystemExit(f"export_hf: tensor {k} alone is {b - a} bytes, over the shard limit {max_bytes}")
        if groups[-1] and size + (b - a) + 4096 > max_bytes:  # 4096: room for the shard's header
            groups.append([])
            size = 0
        groups[-1].append(k)
        size += b - a
    weight_map, total = {}, 0
    for i, group in enumerate(groups):
        name = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        shard, chunks, off = {"__metadata__": meta}, [], 0
        for k in group:
            a, b = header[k]["data_offsets"]
            shard[k] = {"dtype": header[k]["dtype"], "shape": header[k]["shape"], "data_offsets": [off, off + b - a]}
            chunks.append(body[a:b])
            off += b - a
            weight_map[k] = name
        total += off
        text = json.dumps(shard, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
        with open(os.path.join(folder, name), "wb") as f:
            f.write(len(text).to_bytes(8, "little") + text + b"".join(chunks))
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
    os.remove(single)


@torch.no_grad()
def window_perplexity(model, ids, ctx, device, text_bytes=None, batch=8):
    """`arbor perplexity`'s semantics: ids cut into consecutive non-overlapping
    windows of ctx (a last shorter window counts if it has >= 2 ids); every id
    after a window's first is predicted from that window's earlier ids.
    Perplexity = exp(mean NLL); its standard error by the delta method. With
    text_bytes, also the summed NLL in bits per byte of text (the windows'
    first ids go unpredicted), which compares across tokenizers."""
    windows = [ids[i:i + ctx] for i in range(0, len(ids), ctx)]
    windows = [w for w in windows if len(w) >= 2]
    nlls = []
    for L in sorted({len(w) for w in windows}):
        same = [w for w in windows if len(w) == L]
        for i in range(0, len(same), batch):
            w = torch.tensor(same[i:i + batch], device=device)
            logp = torch.log_softmax(model(input_ids=w).logits[:, :-1].float(), -1)
            nlls.append(-logp.gather(-1, w[:, 1:, None])[..., 0].flatten().double().cpu())
    nll = torch.cat(nlls)
    mean = nll.mean().item()
    ppl = math.exp(mean)
    out = {"ctx": ctx, "windows": len(windows), "tokens": nll.numel(), "mean_nll": mean, "perplexity": ppl,
           "perplexity_stderr": ppl * nll.std().item() / math.sqrt(nll.numel())}
    if text_bytes:
        out["bits_per_byte"] = nll.sum().item() / math.log(2) / text_bytes
    return out


def build_hf_config(cfg, special, eos_token):
    import transformers
    from transformers import LlamaConfig
    kw = {k: cfg[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                              "num_attention_heads", "num_key_value_heads", "head_dim",
                              "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings")}
    if int(transformers.__version__.split(".")[0]) >= 5:
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg["rope_theta"]}
    else:
        kw["rope_theta"] = cfg["rope_theta"]
    return LlamaConfig(hidden_act="silu", attention_bias=False, mlp_bias=False, attention_dropout=0.0,
                       bos_token_id=special["<|bos|>"], eos_token_id=special[eos_token],
                       pad_token_id=special["<|pad|>"], architectures=["LlamaForCausalLM"], **kw)


def export_all(model, cfg, model_dir, out, log, log_path, preset="default"):
    import tokenizers
    import transformers
    from transformers import GenerationConfig, LlamaForCausalLM

    E = EXPORTS[preset]

    tok_cfg = json.load(open(os.path.join(model_dir, "tokenizer_config.json")))
    tok = tokenizers.Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    special = {t: tok.token_to_id(t) for t in ("<|pad|>", "<|bos|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>")}
    eos_token = tok_cfg["eos_token"]
    eos = [special[eos_token]]
    if "chat_template" in tok_cfg:  # a chat model also stops at the end of a whole conversation
        eos.append(special["<|endoftext|>"])

    # 1. Our module's weights into transformers' class; the logits must agree.
    model = model.float().cpu().eval()
    hf = LlamaForCausalLM(build_hf_config(cfg, special, eos_token)).eval()
    # A tied lm_head may or may not be its own state_dict entry, by version.
    res = hf.load_state_dict(model.state_dict(), strict=False)
    odd = (set(res.missing_keys) | set(res.unexpected_keys)) - {"lm_head.weight"}
    if odd:
        raise SystemExit(f"export_hf: state_dict names differ from LlamaForCausalLM: {sorted(odd)}")
    if hf.lm_head.weight.data_ptr() != hf.model.embed_tokens.weight.data_ptr():
        raise SystemExit("export_hf: LlamaForCausalLM did not tie lm_head to embed_tokens")
    probe = torch.tensor([tok.encode(GOLDEN_PROMPT * 20).ids[:200]])
    with torch.no_grad():
        diff = (hf(input_ids=probe).logits - model(probe)).abs().max().item()
    print(f"parity: max |logit difference| ours vs transformers = {diff:.3e}")
    if diff > 1e-3:
        raise SystemExit(f"export_hf: our model and LlamaForCausalLM disagree by {diff}: not exporting")

    # 2. save_pretrained in bf16 plus our tokenizer files: the shipped folder.
    ship = "/tmp/" + E["name"]
    shutil.rmtree(ship, ignore_errors=True)
    hf.to(torch.bfloat16).save_pretrained(ship)
    if E["max_shard_size"]:
        shard_safetensors(ship, E["max_shard_size"])
    weight_files = sorted(os.path.basename(f) for f in glob.glob(os.path.join(ship, "*.safetensors")))
    if os.path.exists(os.path.join(ship, "model.safetensors.index.json")):
        weight_files.append("model.safetensors.index.json")
    GenerationConfig(bos_token_id=special["<|bos|>"], eos_token_id=eos, pad_token_id=special["<|pad|>"],
                     **GEN_DEFAULTS).save_pretrained(ship)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(model_dir, f), ship)
    print("shipped files:", sorted(os.listdir(ship)))

    # 3. Reload exactly those files in float32 (eager attention) as the reference.
    ref = LlamaForCausalLM.from_pretrained(ship, dtype=torch.float32, attn_implementation="eager").float().eval()
    from safetensors.torch import load_file
    tensors = {}
    for f in weight_files:
        if f.endswith(".safetensors"):
            tensors.update({k: [str(v.dtype), list(v.shape), f] for k, v in load_file(os.path.join(ship, f)).items()})
    try:
        from transformers import AutoTokenizer
        hf_tok = AutoTokenizer.from_pretrained(ship)
    except Exception as e:  # recorded, not fatal: the ids come from tokenizers itself
        print("AutoTokenizer failed:", repr(e))
        hf_tok = None

    cases, inputs = [], []
    for i, prompt in enumerate(E["golden_prompts"]):
        inputs.append(("completion" if i == 0 else f"completion{i + 1}", prompt, True, {"prompt": prompt}))
    if E["golden_chat"]:
        chat_text = render_chat(tok_cfg["chat_template"], E["golden_chat"], tok_cfg["bos_token"])
        inputs.append(("chat", chat_text, False, {"messages": E["golden_chat"], "add_generation_prompt": True,
                                                  "prompt_text": chat_text}))
    for name, text, add_special, extra in inputs:
        ids = tok.encode(text, add_special_tokens=add_special).ids
        out_ids, margins, first = greedy(ref, ids, N_GOLDEN, "cpu")
        case = {"name": name, **extra, "add_special_tokens": add_special, "prompt_ids": ids,
                "greedy_ids": out_ids, "greedy_text": tok.decode(out_ids, skip_special_tokens=False),
                "greedy_margins": [round(m, 5) for m in margins], "first_step_top10": first}
        if hf_tok is not None:  # cross-checks, recorded; an exception is recorded as its text
            try:
                case["transformers_tokenizer_agrees"] = hf_tok(text, add_special_tokens=add_special)["input_ids"] == ids
                if name == "chat":
                    case["transformers_chat_template_agrees"] = hf_tok.apply_chat_template(
                        E["golden_chat"], tokenize=False, add_generation_prompt=True) == chat_text
            except Exception as e:
                case["transformers_tokenizer_error"] = repr(e)
        if torch.cuda.is_available():
            case["cuda_float32_agrees"] = greedy(ref.cuda(), ids, N_GOLDEN, "cuda")[0] == out_ids
            ref.cpu()
        case["training_module_agrees"] = greedy(AsHF(model), ids, N_GOLDEN, "cpu")[0] == out_ids
        cases.append(case)
        print(json.dumps({k: v for k, v in case.items() if k not in ("first_step_top10", "greedy_margins")}))

    golden = {
        "format": "arbor greedy golden v1",
        "model": E["repo_dir"],
        "reference": f"transformers {transformers.__version__} LlamaForCausalLM.from_pretrained(dtype=float32, "
                     f"attn_implementation='eager') on CPU, torch {torch.__version__}",
        "dtype": "float32",
        "n_new_tokens": N_GOLDEN,
        "stop_on_eos": False,
        "kv_cache": False,
        **({"model_safetensors_sha256": sha256(os.path.join(ship, "model.safetensors"))}
           if weight_files == ["model.safetensors"] else
           {"weight_files_sha256": {f: sha256(os.path.join(ship, f)) for f in weight_files}}),
        "tokenizer_json_sha256": sha256(os.path.join(ship, "tokenizer.json")),
        "cases": cases,
    }
    json.dump(golden, open(os.path.join(out, "golden_greedy.json"), "w"), indent=1)

    # 4. Sample generations for the README (GPU, float32 math, fixed seeds).
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    ref.to(dev)
    samples = []
    for i, s in enumerate(E["samples"]):
        if "messages" in s:
            text, add_special = render_chat(tok_cfg["chat_template"], s["messages"], tok_cfg["bos_token"]), False
        else:
            text, add_special = s["prompt"], True
        ids = tok.encode(text, add_special_tokens=add_special).ids
        g = greedy(ref, ids, 60, dev)[0]
        r = sample(ref, ids, 100, dev, eos, seed=i, **{k: GEN_DEFAULTS[k] for k in ("temperature", "top_k", "top_p")})
        samples.append({**s, "greedy_60": tok.decode(g, skip_special_tokens=False),
                        "sampled": tok.decode(r, skip_special_tokens=False), "sample_seed": i,
                        "sampling": {k: GEN_DEFAULTS[k] for k in ("temperature", "top_k", "top_p")}})
        print(json.dumps(samples[-1])[:600])
    json.dump(samples, open(os.path.join(out, "samples.json"), "w"), indent=1)

    # 5. The held-out text as `arbor perplexity` reads it: the file tokenized
    # with special tokens (<|bos|> first), float32 math on the bf16 weights.
    heldout = {}
    if E["heldout"]:
        text = open(os.path.join(REPO, E["heldout"]), encoding="utf-8").read()
        ids = tok.encode(text, add_special_tokens=True).ids
        heldout = {"file": E["heldout"], "file_sha256": sha256(os.path.join(REPO, E["heldout"])), "ids": len(ids),
                   "reference": golden["reference"].replace("on CPU", f"on {dev}"), "by_ctx": []}
        for ctx in E["heldout_ctx"]:
            heldout["by_ctx"].append(window_perplexity(ref, ids, ctx, dev, len(text.encode("utf-8"))))
            print("held-out", json.dumps(heldout["by_ctx"][-1]), flush=True)

    for f in ["config.json", "generation_config.json"] + weight_files:
        shutil.copy(os.path.join(ship, f), out)
    log["export"] = {"transformers": transformers.__version__, "parity_max_abs_logit_diff": diff,
                     "safetensors_tensors": tensors,
                     "weight_bytes": {f: os.path.getsize(os.path.join(ship, f)) for f in weight_files},
                     "shipped_files": sorted(os.listdir(ship))}
    if heldout:
        log["heldout_perplexity_transformers"] = heldout
    json.dump(log, open(log_path, "w"), indent=1)
    if os.path.exists(os.path.join(out, "trained_bf16.pt")):
        os.remove(os.path.join(out, "trained_bf16.pt"))
    print("export done:", sorted(os.listdir(out)))
