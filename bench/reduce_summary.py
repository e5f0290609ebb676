#!/usr/bin/env python3
"""Summarises reduce-bench JSON (--benchmark_out): bandwidth from the median wall time and from
the median CPU time of each benchmark, and each reduction's ratio to plain_sum_f32 of the same size.

usage: bench/reduce_summary.py out.json [more.json ...]   (one table per file)
"""
import json
import re
import sys

BYTES = {"S": 1, "3S": 3, "4S": 4}


def size_bytes(name):
    m = re.search(r"/(\d+)MiB", name)
    return int(m.group(1)) << 20


def summarise(path):
    with open(path) as f:
        data = json.load(f)
    rows = {}
    for b in data["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        name = b["run_name"].replace("/real_time", "")
        moved = BYTES[b.get("label", "3S")] * size_bytes(name)
        scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[b["time_unit"]]
        rows[name] = (b["real_time"] * scale, b["cpu_time"] * scale, moved, b.get("label", ""))
    print(f"# {path}  ({data['context'].get('date', '')})")
    print(f"{'benchmark':30} {'bytes':>5} {'wall_us':>10} {'GB/s':>7} {'cpu_us':>10} {'GB/s':>7}"
          f" {'vs plain (wall)':>16} {'(cpu)':>6}")
    for name in sorted(rows, key=lambda n: (size_bytes(n), n)):
        wall, cpu, moved, label = rows[name]
        plain = rows.get("plain_sum_f32/" + name.split("/")[1])
        ratio = ""
        if plain and name.startswith("reduce") and label == "3S":
            ratio = f"{plain[0] / wall * 100:15.0f}% {plain[1] / cpu * 100:5.0f}%"
        print(f"{name:30} {label:>5} {wall * 1e6:10.1f} {moved / wall / 1e9:7.2f}"
              f" {cpu * 1e6:10.1f} {moved / cpu / 1e9:7.2f} {ratio}")


for p in sys.argv[1:]:
    summarise(p)
