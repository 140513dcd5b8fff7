#!/usr/bin/env python3
"""Summarises an Nsight Compute CSV of gpu__time_duration.sum (one row per kernel launch) by kernel:
launches, total and mean microseconds, share of the total. Used on the GPU machine or on the CSV it
brought back:
    ncu --csv --metrics gpu__time_duration.sum ... > k.csv; python3 bench/cuda/kernel_times.py k.csv
    python3 bench/cuda/kernel_times.py k.csv --forward 2   # only the 2nd forward (embed_kernel to the next)
--forward N keeps the launches from the N-th embedding kernel up to the next one: one forward pass of
the model, without the ceilings' GEMMs or the warm-up forward before it.
"""
import argparse
import csv
from collections import defaultdict

ap = argparse.ArgumentParser()
ap.add_argument("csv")
ap.add_argument("--forward", type=int, default=0, help="summarise only the N-th forward pass (1-based)")
args = ap.parse_args()

rows = [r for r in csv.reader(open(args.csv)) if len(r) > 5]
head = rows[0]
name_i, unit_i, val_i = head.index("Kernel Name"), head.index("Metric Unit"), head.index("Metric Value")
body = rows[1:]
if args.forward > 0:
    starts = [i for i, r in enumerate(body) if "embed_kernel" in r[name_i]]
    if len(starts) < args.forward:
        raise SystemExit(f"{args.csv}: {len(starts)} forward passes (embed_kernel launches), --forward {args.forward} asked")
    first = starts[args.forward - 1]
    last = starts[args.forward] if len(starts) > args.forward else len(body)
    body = body[first:last]
tot = defaultdict(float)
cnt = defaultdict(int)
for r in body:
    v = float(r[val_i].replace(",", ""))
    unit = r[unit_i]
    us = v / 1000 if unit in ("nsecond", "ns") else v * 1000 if unit in ("msecond", "ms") else v
    name = r[name_i].replace("(anonymous namespace)::", "").replace("void ", "").split("(")[0][:70]
    tot[name] += us
    cnt[name] += 1
all_us = sum(tot.values())
print(f"{len(body)} launches, {all_us:.1f} us in all")
for name, us in sorted(tot.items(), key=lambda kv: -kv[1])[:18]:
    print(f"{us:9.1f} us {100 * us / all_us:5.1f}%  {cnt[name]:5d} x {us / cnt[name]:7.2f} us  {name}")
