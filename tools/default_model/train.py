# Step 4: trains arbor's default model (arbor-tiny-sotu) on the encoded SOTU
# streams, picks the checkpoint by validation loss, measures held-out
# perplexity, then hands over to export_hf.py (HF files, golden, samples).
# With --preset eval it trains the evaluation model (tests/fixtures/eval-model,
# tools/eval_model/README.md) on the eval corpora's document stream instead.
#
# On the GPU machine (see README.md in this folder for the whole recipe):
#   PYTHONUNBUFFERED=1 python3 tools/default_model/train.py --out $OUT
# Smoke test on a CPU (tiny shapes, a few steps, no transformers needed):
#   /usr/bin/python3 tools/default_model/train.py --smoke --out /tmp/arbor-smoke
import argparse
import json
import math
import os
import random
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_model import LlamaLM, param_count  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# 8192 x 256 tied embedding (2.10M) + 6 layers x 0.59M = 5.64M parameters,
# 11.3 MB in bf16: under the 12 MB that the repository and every device call
# carry. head_dim 64 and 2 kv heads keep GQA on the path the engine must serve.
MODEL = {
    "vocab_size": 8192,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
}
# --smoke: these shapes over the preset's model (its vocabulary stays).
SMOKE_SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=2, num_key_value_heads=1, head_dim=32)

# The evaluation model: every linear's sizes are multiples of 256 (q/o 512x512,
# k/v 256x512, gate/up 768x512, down 512x768, embedding 4096x512) so weight
# groups of 64 and trellis blocks of 256 tile them; head_dim 64, 8 query heads
# on 4 kv heads. 2.10M (tied embedding) + 3 x 1.97M = 8.00M parameters,
# 16.0 MB in bf16. Every device call carries the repository's tracked files
# and the binaries it runs within 64 MiB (20 MB + 20 MB of CUDA binaries when
# this was made): a larger committed model would leave later calls no room.
EVAL_MODEL = dict(MODEL, vocab_size=4096, hidden_size=512, intermediate_size=768, num_hidden_layers=3,
                  num_attention_heads=8, num_key_value_heads=4, head_dim=64)

# Per preset: the model, where the token streams and the tokenizer files are,
# which streams exist (docs: <|bos|> text <|endoftext|> per document; chat:
# rendered conversations), the size limit of the bf16 checkpoint, and the
# preset's own training defaults (flags still override them).
PRESETS = {
    "default": {"model": MODEL, "data": os.path.join(HERE, "data"),
                "model_dir": os.path.join(REPO, "models", "arbor-tiny-sotu"),
                "streams": ("docs", "chat"), "max_bytes": 12_000_000, "defaults": {}},
    # 4.38M training tokens, 134 steps of 32 x 1024 an epoch: 1400 steps are
    # 10.5 epochs, where the default model (5.6M parameters, on 3.6M tokens)
    # was still improving; dropout 0.2 won its sweep. The checkpoint with the
    # lowest validation loss is kept, whenever it came.
    "eval": {"model": EVAL_MODEL, "data": os.path.join(REPO, "tools", "eval_model", "data"),
             "model_dir": os.path.join(REPO, "tests", "fixtures", "eval-model"),
             "streams": ("docs",), "max_bytes": 16_500_000,
             "defaults": {"seed": 1851, "lr": 1e-3, "dropout": 0.2, "max_steps": 1400, "time_budget": 300.0}},
}


def parse_args():
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--preset", choices=sorted(PRESETS), default="default")
    P = PRESETS[pre.parse_known_args()[0].preset]
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--preset", choices=sorted(PRESETS), default="default",
                   help="default: the shipped arbor-tiny-sotu; eval: the evaluation model")
    p.add_argument("--data", default=P["data"])
    p.add_argument("--model-dir", default=P["model_dir"],
                   help="folder with the model's tokenizer.json / tokenizer_config.json")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--max-steps", type=int, default=3000)
    p.add_argument("--time-budget", type=float, default=240.0, help="seconds of training; the LR schedule ends by then")
    p.add_argument("--lr", type=float, default=1.5e-3)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--smoke", action="store_true", help="tiny model, few steps, CPU is fine")
    p.add_argument("--no-export", action="store_true", help="stop after training (no transformers needed)")
    p.add_argument("--export-from", metavar="RUN_DIR",
                   help="skip training: export RUN_DIR/trained_bf16.pt with RUN_DIR/train_log.json")
    p.set_defaults(**P["defaults"])
    return p.parse_args()


def load_stream(data_dir, name, vocab):
    path = os.path.join(data_dir, name)
    if not os.path.exists(path):
        sys.exit(f"train.py: {path} missing: run prepare_data.js, train_tokenizer.js and encode_data.js first")
    ids = np.fromfile(path, dtype="<u2").astype(np.int64)
    if ids.size == 0 or ids.max() >= vocab:
        sys.exit(f"train.py: {path}: {ids.size} tokens, max id {ids.max() if ids.size else None} >= vocab {vocab}")
    return torch.from_numpy(ids)


def lr_at(step, elapsed, a):
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    # Progress is whichever runs out first, steps or wall time, so the cosine
    # always reaches its floor inside the time budget.
    progress = min(1.0, max((step - a.warmup) / max(1, a.max_steps - a.warmup), elapsed / a.time_budget))
    return a.lr * (a.min_lr_ratio + (1 - a.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def evaluate(model, stream, seq, device, autocast):
    """Summed NLL (nats) and count over every token after the stream's first:
    non-overlapping windows of `seq` predictions, each with in-window context."""
    model.eval()
    n = stream.numel() - 1
    nll, count = 0.0, 0
    starts = list(range(0, n, seq))
    for i in range(0, len(starts), 16):
        group = starts[i:i + 16]
        lens = [min(seq, n - s) for s in group]
        for L in sorted(set(lens)):  # the last window may be shorter
            sel = [s for s, l in zip(group, lens) if l == L]
            idx = torch.tensor(sel)[:, None] + torch.arange(L + 1)[None, :]
            w = stream[idx].to(device)
            with autocast():
                logits = model(w[:, :-1])
            nll += F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1),
                                   reduction="sum").item()
            count += w[:, 1:].numel()
    model.train()
    return nll, count


def metrics(nll, count, text_bytes=None):
    m = {"tokens": count, "loss": nll / count, "perplexity": math.exp(nll / count)}
    if text_bytes:
        m["bits_per_byte"] = nll / math.log(2) / text_bytes
    return m


def export_from(a):
    log = json.load(open(os.path.join(a.export_from, "train_log.json")))
    model = LlamaLM(log["model_config"])
    state = torch.load(os.path.join(a.export_from, "trained_bf16.pt"))
    state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.makedirs(a.out, exist_ok=True)
    log_path = os.path.join(a.out, "train_log.json")
    from export_hf import export_all
    export_all(model.eval(), log["model_config"], a.model_dir, a.out, log, log_path, log.get("preset", "default"))


def main():
    a = parse_args()
    if a.export_from:
        return export_from(a)
    P = PRESETS[a.preset]
    cfg = dict(P["model"], **(SMOKE_SHAPE if a.smoke else {}))
    if a.smoke:
        a.batch, a.seq, a.max_steps, a.warmup, a.eval_every = 4, 64, 30, 5, 10
        cfg["max_position_embeddings"] = a.seq
    os.makedirs(a.out, exist_ok=True)
    random.seed(a.seed)
    np.random.seed(a.seed)
    torch.manual_seed(a.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = True  # training only; evaluation below turns it off
    meta = json.load(open(os.path.join(a.data, "meta.json")))
    V = cfg["vocab_size"]
    train = torch.cat([load_stream(a.data, f"train_{k}.bin", V) for k in P["streams"]])
    held = {f"{s}_{k}": load_stream(a.data, f"{s}_{k}.bin", V) for s in ("val", "test") for k in P["streams"]}
    if a.smoke:
        train = train[:200_000]
        held = {k: v[:2000] for k, v in held.items()}
    train_gpu = train.to(device)

    model = LlamaLM(cfg, dropout=a.dropout).to(device)
    n_params = param_count(model)
    print(f"device {device} ({torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}), torch {torch.__version__}")
    print(f"params {n_params} = {2 * n_params} bytes in bf16; train stream {train.numel()} tokens")
    if not a.smoke and 2 * n_params > P["max_bytes"]:
        sys.exit(f"train.py: {2 * n_params} bytes in bf16 exceeds the {a.preset} preset's {P['max_bytes']}")

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt_kw = {"fused": True} if device == "cuda" else {}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.95), eps=1e-8, **opt_kw)

    def autocast():
        return torch.autocast(device_type=device, dtype=torch.bfloat16)

    gen = torch.Generator(device="cpu").manual_seed(a.seed)
    offsets = torch.arange(a.seq + 1, device=device)
    curve, best = [], {"val_loss": float("inf"), "step": -1, "state": None}
    t0 = time.time()
    step, tokens_seen, loss_acc, loss_n = 0, 0, 0.0, 0
    while True:
        elapsed = time.time() - t0
        done = step >= a.max_steps or elapsed >= a.time_budget
        if step % a.eval_every == 0 or done:
            val = {k: evaluate(model, held[f"val_{k}"], a.seq, device, autocast) for k in P["streams"]}
            vd, vc = val["docs"]
            val_loss = sum(n for n, _ in val.values()) / sum(c for _, c in val.values())
            point = {"step": step, "elapsed_s": round(elapsed, 1), "tokens_seen": tokens_seen,
                     "train_loss": round(loss_acc / loss_n, 4) if loss_n else None,
                     "val_loss": round(val_loss, 4), "val_docs_loss": round(vd / vc, 4), "lr": lr_at(step, elapsed, a)}
            curve.append(point)
            print(json.dumps(point), flush=True)
            loss_acc, loss_n = 0.0, 0
            if val_loss < best["val_loss"]:
                best = {"val_loss": val_loss, "step": step,
                        "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}
        if done:
            break
        lr = lr_at(step, elapsed, a)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, train.numel() - a.seq - 1, (a.batch,), generator=gen).to(device)
        w = train_gpu[starts[:, None] + offsets[None, :]]
        with autocast():
            logits = model(w[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, V), w[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_acc += loss.item() if step % 10 == 0 or a.smoke else 0.0
        loss_n += 1 if step % 10 == 0 or a.smoke else 0
        tokens_seen += w[:, 1:].numel()
        step += 1
    train_s = time.time() - t0
    print(f"trained {step} steps, {tokens_seen} tokens ({tokens_seen / train.numel():.1f} epochs) in {train_s:.0f} s "
          f"({tokens_seen / train_s:.0f} tokens/s, evaluations included); "
          f"best val loss {best['val_loss']:.4f} at step {best['step']}")

    # Ship the best checkpoint rounded to bf16, and measure exactly that, in fp32 math.
    model.load_state_dict(best["state"])
    model.dropout = 0.0
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    nocast = lambda: torch.autocast(device_type=device, enabled=False)  # noqa: E731
    results = {}
    for k, s in held.items():
        nll, cnt = evaluate(model, s, a.seq, device, nocast)
        results[k] = metrics(nll, cnt, None if a.smoke else meta["files"][f"{k}.bin"]["text_bytes"])
        print(k, json.dumps(results[k]))

    log = {
        "preset": a.preset, "model_config": cfg, "parameters": n_params, "bf16_bytes": 2 * n_params,
        "hyperparameters": {k: v for k, v in vars(a).items() if k not in ("out", "data", "model_dir")},
        "train_stream_tokens": train.numel(), "steps": step, "tokens_seen": tokens_seen,
        "epochs": tokens_seen / train.numel(), "train_seconds": round(train_s, 1),
        "tokens_per_second": round(tokens_seen / train_s), "best_step": best["step"],
        "best_val_loss": best["val_loss"], "held_out_bf16_weights_fp32_math": results, "curve": curve,
        "data_meta": {k: meta[k] for k in ("tokenizer_sha256", "files") if k in meta},
        "torch": torch.__version__, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
    }
    log_path = os.path.join(a.out, "train_log.json")
    json.dump(log, open(log_path, "w"), indent=1)
    # Kept until the HF export succeeds, so a failed export can be redone from it.
    torch.save({k: v.to(torch.bfloat16) for k, v in model.state_dict().items() if k != "lm_head.weight"},
               os.path.join(a.out, "trained_bf16.pt"))
    if a.no_export:
        return
    from export_hf import export_all
    export_all(model, cfg, a.model_dir, a.out, log, log_path, a.preset)


if __name__ == "__main__":
    main()
