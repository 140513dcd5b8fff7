#!/usr/bin/env python3
"""Summarises an Nsight Compute CSV of gpu__time_duration.sum (one row per kernel launch) by kernel:
launches, total and mean microseconds, share of the total. Used on the GPU machine:
    ncu --csv --metrics gpu__time_duration.sum ... > k.csv; python3 bench/cuda/kernel_times.py k.csv
"""
import csv
import sys
from collections import defaultdict

rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 5]
head = rows[0]
name_i, unit_i, val_i = head.index("Kernel Name"), head.index("Metric Unit"), head.index("Metric Value")
tot = defaultdict(float)
cnt = defaultdict(int)
for r in rows[1:]:
    v = float(r[val_i].replace(",", ""))
    unit = r[unit_i]
    us = v / 1000 if unit in ("nsecond", "ns") else v * 1000 if unit in ("msecond", "ms") else v
    name = r[name_i].replace("(anonymous namespace)::", "").replace("void ", "").split("(")[0][:70]
    tot[name] += us
    cnt[name] += 1
all_us = sum(tot.values())
print(f"{len(rows) - 1} launches, {all_us:.1f} us in all")
for name, us in sorted(tot.items(), key=lambda kv: -kv[1])[:18]:
    print(f"{us:9.1f} us {100 * us / all_us:5.1f}%  {cnt[name]:5d} x {us / cnt[name]:7.2f} us  {name}")
