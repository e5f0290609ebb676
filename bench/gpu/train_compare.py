#!/usr/bin/env python3
"""GPU training, chorus against PyTorch eager on the same GPU in the same run (issue 12 item 7).

  python3 bench/gpu/train_compare.py BIN_DIR [--steps 200] [--rounds 3] [--batches 64,256]
      [--fashion-dir DIR] [--accuracy-epochs 3] [--device cuda:0]

BIN_DIR holds train_cnn and chorus-run (a tests/gpu/pack.sh bundle's bin/; --train-cnn and
--chorus-run name them elsewhere). The tutorial CNN (conv 3->6 5x5, pool, conv 6->16 5x5, pool,
400-120-84-10; 1x28x28 input and fc1 256->120 on Fashion-MNIST), SGD lr 0.01 momentum 0.9, no
TF32 on either side.

1. Throughput: images/s of the training loop and ms per step, median of the rounds (interleaved),
   at each batch, on synthetic CIFAR-shaped data (3x32x32) and on Fashion-MNIST (shuffled, fed from
   host memory batch by batch, as train_cnn feeds it): chorus on 1 rank and on 2 ranks sharing the
   GPU (CHORUS_ALLOW_SHARED_GPU=1, the same global batch), PyTorch on 1 (its NCCL refuses two ranks
   on one GPU); on a GPU also chorus with its step captured as CUDA graphs (train_cnn
   --cuda-graph: "chorus 1 rank graph", and "chorus 2 ranks graph", where DDP's all-reduces are
   captured inside the step's graph; "chorus 2 ranks graph split": --cuda-graph-split, two graphs
   a step with the all-reduces between them, to show what capturing them gains), and where MPS is installed "chorus 2 ranks mps" (chorus-run --mps:
   the two ranks side by side instead of taking turns by time slice).
2. Accuracy: --accuracy-epochs epochs of Fashion-MNIST at batch 64 on each side for each of
   --accuracy-seeds seeds, then the mean test accuracy of each and their difference (issue 12's
   bar: within 1 point; one seed alone wanders by more: 0.844-0.873 for chorus, 0.851-0.867 for
   PyTorch on the cpu, bench/RESULTS.md).

Prints RESULT lines and two tables. Exits 77 where torch sees no GPU (with --device cuda:N).
--device cpu runs the same on the cpu: how the test suite checks this script on machines
without a GPU (tests/bench/meson.build), with few steps.
"""
import argparse
import gzip
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import time


def net_class():
    """The tutorial's net, as examples/torch_ddp.py defines it: Net(in_ch, side)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "examples"))
    from torch_ddp import Net
    return Net


def read_idx(path):
    import torch
    with gzip.open(path, "rb") as f:
        data = f.read()
    zero, kind, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or kind != 0x08:
        raise ValueError(f"{path}: not an IDX file of bytes")
    shape = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return torch.frombuffer(bytearray(data), dtype=torch.uint8, offset=4 + 4 * ndim).reshape(shape)


def load_fashion(d):
    """Images as train_cnn normalises them, (x/255 - 0.5)/0.5, Nx1x28x28; int64 labels."""
    def images(name):
        return ((read_idx(os.path.join(d, name)).float() / 255.0 - 0.5) / 0.5).unsqueeze(1)

    def labels(name):
        return read_idx(os.path.join(d, name)).long()

    return (images("train-images-idx3-ubyte.gz"), labels("train-labels-idx1-ubyte.gz"),
            images("t10k-images-idx3-ubyte.gz"), labels("t10k-labels-idx1-ubyte.gz"))


def torch_setup(device):
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False  # as chorus: no TF32
    torch.backends.cudnn.allow_tf32 = False
    return torch.device(device)


def torch_images_per_s(device, batch, steps, fashion=None):
    import torch
    import torch.nn.functional as F
    dev = torch_setup(device)
    torch.manual_seed(0)
    net = net_class()(*((1, 28) if fashion else (3, 32))).to(dev)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    if fashion:
        xs, ys = fashion[0], fashion[1]
        order = torch.randperm(len(xs), generator=g)

        def batch_at(i):
            idx = order[(i * batch) % (len(xs) - batch):][:batch]
            return xs[idx], ys[idx]
    else:
        images = torch.randn(steps + 10, batch, 3, 32, 32, generator=g)
        labels = torch.randint(0, 10, (steps + 10, batch), generator=g)

        def batch_at(i):
            return images[i], labels[i]

    def step(i):
        x, y = batch_at(i)
        x, y = x.to(dev), y.to(dev)
        opt.zero_grad()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        return loss

    for i in range(10):
        step(i)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(steps):
        step(10 + i).item()  # as chorus's loop, which reads each step's loss
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return steps * batch / (time.perf_counter() - t0)


def torch_accuracy(device, fashion, epochs, batch, limit, seed):
    """Test accuracy after `epochs` epochs (at most `limit` steps each when > 0)."""
    import torch
    import torch.nn.functional as F
    dev = torch_setup(device)
    torch.manual_seed(seed)
    net = net_class()(1, 28).to(dev)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    xs, ys, tx, ty = fashion
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(len(xs), generator=g)
        for s, at in enumerate(range(0, len(xs) - batch + 1, batch)):
            if 0 < limit <= s:
                break
            idx = order[at:at + batch]
            opt.zero_grad()
            F.cross_entropy(net(xs[idx].to(dev)), ys[idx].to(dev)).backward()
            opt.step()
    with torch.no_grad():
        right = sum(int((net(tx[i:i + 1000].to(dev)).argmax(1).cpu() == ty[i:i + 1000]).sum())
                    for i in range(0, len(tx), 1000))
    return right / len(tx)


def run_chorus(a, ranks, args, launcher=()):
    cmd = [a.chorus_run, *launcher, "-n", str(ranks), a.train_cnn, "--device", a.device] + args
    env = dict(os.environ, CHORUS_ALLOW_SHARED_GPU="1")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return out.stdout


def chorus_images_per_s(a, ranks, batch, steps, fashion_dir=None, extra=(), launcher=()):
    per_rank = batch // ranks
    if fashion_dir:
        data = ["--data", f"fashion-mnist:{fashion_dir}", "--max-steps", str(steps + 10)]
    else:
        data = ["--data", "synthetic", "--synthetic-size", str((steps + 10) * batch),
                "--synthetic-shape", "3x32x32"]
    out = run_chorus(a, ranks, data + ["--epochs", "1", "--batch-size", str(per_rank),
                                       "--log-every", str(max(1, steps // 4)), "--no-progress"] +
                     list(extra), launcher)
    rates = [float(m) for m in re.findall(r"step [0-9/]+: .*\| ([0-9.]+) images/s", out)]
    if not rates:
        raise RuntimeError(f"no images/s in the output of train_cnn:\n{out[-2000:]}")
    return statistics.median(rates[1:] or rates)  # the first interval holds the warm-up


def chorus_accuracy(a, fashion_dir, epochs, batch, limit, seed):
    out = run_chorus(a, 1, ["--data", f"fashion-mnist:{fashion_dir}", "--epochs", str(epochs),
                            "--batch-size", str(batch), "--seed", str(seed), "--no-progress"] +
                     (["--max-steps", str(limit)] if limit > 0 else []))
    accs = re.findall(r"test acc ([0-9.]+)", out)
    if not accs:
        raise RuntimeError(f"no test accuracy in the output of train_cnn:\n{out[-2000:]}")
    return float(accs[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin_dir")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", default="64,256")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--fashion-dir", default=os.environ.get(
        "FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist"),
        help="the four .gz files of Fashion-MNIST; absent: synthetic data only")
    ap.add_argument("--accuracy-epochs", type=int, default=3, help="0: no accuracy comparison")
    ap.add_argument("--accuracy-seeds", type=int, default=3)
    ap.add_argument("--accuracy-limit", type=int, default=0,
                    help="at most this many steps an epoch in the accuracy runs (tests)")
    ap.add_argument("--train-cnn")
    ap.add_argument("--chorus-run")
    a = ap.parse_args()
    a.train_cnn = a.train_cnn or os.path.join(a.bin_dir, "train_cnn")
    a.chorus_run = a.chorus_run or os.path.join(a.bin_dir, "chorus-run")
    try:
        import torch
    except ImportError:
        print("skip: no torch here")
        return 77
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("skip: torch sees no CUDA device")
        return 77
    where = torch.cuda.get_device_name(0) if a.device.startswith("cuda") else "cpu"
    fashion = None
    if os.path.exists(os.path.join(a.fashion_dir, "train-images-idx3-ubyte.gz")):
        fashion = load_fashion(a.fashion_dir)
    else:
        print(f"# no Fashion-MNIST in {a.fashion_dir}: synthetic data only")
    print(f"# {where}, torch {torch.__version__}, {a.steps} steps x {a.rounds} rounds")
    rows = []
    datasets = [("synthetic", None)] + ([("fashion-mnist", a.fashion_dir)] if fashion else [])
    for data, fdir in datasets:
        for batch in (int(b) for b in a.batches.split(",")):
            results = {"torch 1 rank": [], "chorus 1 rank": [], "chorus 2 ranks": []}
            graph = a.device.startswith("cuda")  # train_cnn --cuda-graph: on a GPU only
            if graph:
                results["chorus 1 rank graph"] = []
                results["chorus 2 ranks graph"] = []
                results["chorus 2 ranks graph split"] = []  # the all-reduces between 2 graphs
            # Two ranks on one GPU side by side (chorus-run --mps) where MPS is installed.
            mps = graph and shutil.which("nvidia-cuda-mps-control") is not None
            if mps:
                results["chorus 2 ranks mps"] = []
            for _ in range(a.rounds):  # interleaved, round by round
                results["torch 1 rank"].append(
                    torch_images_per_s(a.device, batch, a.steps, fashion if fdir else None))
                results["chorus 1 rank"].append(chorus_images_per_s(a, 1, batch, a.steps, fdir))
                results["chorus 2 ranks"].append(chorus_images_per_s(a, 2, batch, a.steps, fdir))
                if mps:
                    results["chorus 2 ranks mps"].append(
                        chorus_images_per_s(a, 2, batch, a.steps, fdir, launcher=["--mps"]))
                if graph:
                    for ranks in (1, 2):
                        results[f"chorus {ranks} rank{'s' if ranks > 1 else ''} graph"].append(
                            chorus_images_per_s(a, ranks, batch, a.steps, fdir, ["--cuda-graph"]))
                    results["chorus 2 ranks graph split"].append(
                        chorus_images_per_s(a, 2, batch, a.steps, fdir, ["--cuda-graph-split"]))
            for name, v in results.items():
                med = statistics.median(v)
                rows.append((data, batch, name, med))
                print(f"RESULT gpu_train data={data} batch={batch} who={name.replace(' ', '_')} "
                      f"images_per_s={med:.0f} ms_per_step={batch / med * 1e3:.3f}")
    print(f"# {'data':<13} {'batch':>5}  {'who':<26} {'images/s':>10} {'ms/step':>8} {'vs torch':>8}")
    for data, batch, name, med in rows:
        ref = next(m for d, b, n, m in rows if d == data and b == batch and n == "torch 1 rank")
        print(f"  {data:<13} {batch:>5}  {name:<26} {med:>10.0f} {batch / med * 1e3:>8.3f} "
              f"{med / ref:>8.2f}")
    if fashion and a.accuracy_epochs > 0:
        ts, cs = [], []
        for seed in range(a.accuracy_seeds):
            ts.append(torch_accuracy(a.device, fashion, a.accuracy_epochs, 64, a.accuracy_limit,
                                     seed))
            cs.append(chorus_accuracy(a, a.fashion_dir, a.accuracy_epochs, 64, a.accuracy_limit,
                                      seed))
            print(f"RESULT gpu_train_accuracy epochs={a.accuracy_epochs} seed={seed} "
                  f"torch={ts[-1]:.4f} chorus={cs[-1]:.4f}")
        t, c = statistics.mean(ts), statistics.mean(cs)
        print(f"# Fashion-MNIST test accuracy after {a.accuracy_epochs} epochs, batch 64, mean of "
              f"{len(ts)} seeds: torch {t:.4f}, chorus {c:.4f} ({100 * (c - t):+.2f} points; "
              f"bar: within 1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
