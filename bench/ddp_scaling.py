#!/usr/bin/env python3
"""DDP bars, measured side by side in rounds (the machine is shared; ratios are taken per round).

Each round runs one Fashion-MNIST epoch of each configuration, back to back:
  single32  train_cnn, 1 process, batch 32            (the 1-rank run at the per-rank batch)
  single64  train_cnn, 1 process, batch 64            (the 1-rank run at the same effective batch)
  chorus2   chorus-run -n 2 train_cnn, batch 32/rank  (DDP over chorus, effective 64)
  pair32    two independent 1-process runs at once, each half an epoch at batch 32: what two
            processes get from this machine with no communication at all (the ceiling for DDP)
  torch2    PyTorch DDP over gloo, 2 ranks, batch 32/rank (../shared/peers/train/baseline.py ddp)
and prints images/s, the ratios, chorus's gradient-sync wait share, and the load average.

    python3 bench/ddp_scaling.py --rounds 3 [--build build] [--no-torch]
"""
import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time

PEER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "peers", "train", "baseline.py")


def busy_seconds():
    f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return (sum(f[:8]) - f[3] - f[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait


LAST_OTHER = [0.0]


def run(cmd):
    """Runs cmd; LAST_OTHER[0] = cores used by *other* programs meanwhile (busy - ours, +-0.1)."""
    t0, b0 = time.time(), busy_seconds()
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.time() - t0
    own = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    LAST_OTHER[0] = max(0.0, (busy_seconds() - b0 - own) / wall)
    if out.returncode != 0:
        sys.exit(f"failed ({out.returncode}): {cmd}\n{out.stdout}\n{out.stderr}")
    return out.stdout + out.stderr, wall


def chorus_epoch(text):
    m = re.search(r"epoch 1: train loss ([\d.]+), train acc [\d.]+, (\d+) images/s, test acc ([\d.]+) \| ([\d.]+) s"
                  r", cpu ([\d.]+) s(?:, grad sync wait ([\d.]+) s)?", text)
    if not m:
        sys.exit("no epoch line in:\n" + text)
    return {"img_s": float(m.group(2)), "loss": float(m.group(1)), "acc": float(m.group(3)),
            "secs": float(m.group(4)), "cpu": float(m.group(5)), "sync_wait": float(m.group(6)) if m.group(6) else None}


def loadavg():
    return open("/proc/loadavg").read().split()[0]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--build", default="build")
    p.add_argument("--no-torch", action="store_true")
    a = p.parse_args()
    tr = f"{a.build}/examples/train_cnn --epochs 1 --no-progress --lr 0.01"
    cr = f"{a.build}/tools/chorus-run -n 2"
    rows = []
    for r in range(a.rounds):
        row = {"round": r + 1, "load_before": loadavg()}
        row["single32"] = chorus_epoch(run(f"{tr} --batch-size 32")[0]) | {"other": LAST_OTHER[0]}
        row["single64"] = chorus_epoch(run(f"{tr} --batch-size 64")[0]) | {"other": LAST_OTHER[0]}
        row["chorus2"] = chorus_epoch(run(f"{cr} {tr} --batch-size 32")[0]) | {"other": LAST_OTHER[0]}
        out, _ = run(f"{tr} --batch-size 32 --max-steps 938 --seed 1 > /tmp/pair32.a 2>&1 & "
                     f"{tr} --batch-size 32 --max-steps 938 --seed 2 > /tmp/pair32.b 2>&1; wait; cat /tmp/pair32.a /tmp/pair32.b")
        halves = [chorus_epoch(t) for t in out.split("peak memory")[:2]]
        row["pair32"] = {"img_s": 2 * 30016 / max(h["secs"] for h in halves), "secs": max(h["secs"] for h in halves),
                         "other": LAST_OTHER[0]}
        if not a.no_torch:
            out, _ = run(f"/usr/bin/python3 {PEER} ddp --hook default --epochs 1")
            js = json.loads([l for l in out.splitlines() if l.startswith("JSON ")][-1][5:])
            ep = js["epochs"][0]
            row["torch2"] = {"img_s": ep["img_per_s"], "loss": ep["train_loss"], "acc": ep["test_acc"],
                             "secs": ep["wall_s"], "other": ep["other_cores"]}
        row["load_after"] = loadavg()
        rows.append(row)
        c = row["chorus2"]
        line = (f"round {r + 1}: single32 {row['single32']['img_s']:.0f}  single64 {row['single64']['img_s']:.0f}  "
                f"chorus 2x32 {c['img_s']:.0f}  ({c['img_s'] / row['single32']['img_s']:.2f}x single32, "
                f"{c['img_s'] / row['single64']['img_s']:.2f}x single64; pair32 {row['pair32']['img_s']:.0f}, chorus/pair {c['img_s'] / row['pair32']['img_s']:.2f}; sync wait {c['sync_wait']:.2f} s = "
                f"{100 * c['sync_wait'] / c['secs']:.0f}% of {c['secs']:.2f} s)")
        if "torch2" in row:
            line += f"  torch-gloo 2x32 {row['torch2']['img_s']:.0f} (chorus/torch {c['img_s'] / row['torch2']['img_s']:.2f})"
        others = " ".join(f"{k} {v['other']:.2f}" for k, v in row.items() if isinstance(v, dict) and "other" in v)
        print(line + f"  load {row['load_before']} -> {row['load_after']}; other programs' cores: {others}", flush=True)
    print("JSON " + json.dumps(rows))


if __name__ == "__main__":
    main()
