#!/usr/bin/env python3
"""GPU training, chorus against PyTorch eager on the same GPU in the same run (issue 12 item 7).

  python3 bench/gpu/train_compare.py BIN_DIR [--steps 200] [--rounds 3]

BIN_DIR holds train_cnn and chorus-run (a tests/gpu/pack.sh bundle's bin/, or build/). The
tutorial CNN (conv 3->6 5x5, pool, conv 6->16 5x5, pool, 400-120-84-10), SGD lr 0.01 momentum 0.9,
synthetic CIFAR-shaped data (3x32x32) fed from host memory batch by batch, batch 64 and 256:
images/s of the training loop, median of the rounds, chorus on 1 rank and on 2 ranks sharing the
GPU (CHORUS_ALLOW_SHARED_GPU=1, the same global batch), PyTorch on 1 (its NCCL refuses two ranks
on one GPU). Prints one RESULT line per measurement and a table. Exits 77 where torch sees no GPU.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time


def torch_images_per_s(batch, steps):
    import torch
    import torch.nn.functional as F

    # The PyTorch CIFAR-10 tutorial's net, as examples/torch_ddp.py defines it.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "examples"))
    from torch_ddp import Net

    torch.backends.cuda.matmul.allow_tf32 = False  # as chorus: no TF32
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda:0")
    net = Net().to(dev)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    images = torch.randn(steps + 10, batch, 3, 32, 32, generator=g)
    labels = torch.randint(0, 10, (steps + 10, batch), generator=g)

    def step(i):
        x = images[i].to(dev, non_blocking=False)
        y = labels[i].to(dev)
        opt.zero_grad()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        return loss

    for i in range(10):
        step(i)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(steps):
        loss = step(10 + i)
        loss.item()  # as chorus's loop, which reads each step's loss
    torch.cuda.synchronize()
    return steps * batch / (time.perf_counter() - t0)


def chorus_images_per_s(bin_dir, ranks, batch, steps):
    per_rank = batch // ranks
    samples = (steps + 10) * batch
    cmd = [os.path.join(bin_dir, "chorus-run"), "-n", str(ranks),
           os.path.join(bin_dir, "train_cnn"), "--device", "cuda:0", "--data", "synthetic",
           "--synthetic-size", str(samples), "--synthetic-shape", "3x32x32", "--epochs", "1",
           "--batch-size", str(per_rank), "--log-every", str(steps // 4), "--no-progress"]
    env = dict(os.environ, CHORUS_ALLOW_SHARED_GPU="1")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    rates = [float(m) for m in re.findall(r"([0-9.]+) images/s", out.stdout)]
    if not rates:
        raise RuntimeError(f"no images/s in the output of {' '.join(cmd)}:\n{out.stdout[-2000:]}")
    return statistics.median(rates[1:] or rates)  # the first interval holds the warm-up


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin_dir")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    try:
        import torch
        if not torch.cuda.is_available():
            print("skip: torch sees no CUDA device")
            return 77
    except ImportError:
        print("skip: no torch here")
        return 77
    print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
          f"{a.steps} steps x {a.rounds} rounds")
    rows = []
    for batch in (64, 256):
        results = {"torch 1 rank": [], "chorus 1 rank": [], "chorus 2 ranks": []}
        for _ in range(a.rounds):  # interleaved, round by round
            results["torch 1 rank"].append(torch_images_per_s(batch, a.steps))
            results["chorus 1 rank"].append(chorus_images_per_s(a.bin_dir, 1, batch, a.steps))
            results["chorus 2 ranks"].append(chorus_images_per_s(a.bin_dir, 2, batch, a.steps))
        for name, v in results.items():
            med = statistics.median(v)
            rows.append((batch, name, med))
            label = name.replace(" ", "_")
            print(f"RESULT gpu_train batch={batch} who={label} images_per_s={med:.0f}")
    print(f"# {'batch':>5}  {'who':<16} {'images/s':>10}  {'vs torch':>8}")
    for batch, name, med in rows:
        ref = next(m for b, n, m in rows if b == batch and n == "torch 1 rank")
        print(f"  {batch:>5}  {name:<16} {med:>10.0f}  {med / ref:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
