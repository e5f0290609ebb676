"""torch.distributed under backend "chorus" next to "gloo" (and "mpi" when this PyTorch has it),
side by side in the same processes: all_reduce time and busbw by size, and DDP images/s of the
tutorial CNN. Also chorus's own C API 8-byte all-reduce latency (chorus-perf) in the same run,
to show what the Python path costs per call.

    /usr/bin/python3 bench/torch_compare.py --build build [--ranks 2] [--rounds 3]

Rounds alternate the backends (chorus, gloo, chorus, ...) and every figure is the median over
rounds; rank 0 prints a markdown table. Needs PYTHONPATH to reach chorus_torch (the script sets
it from --build).
"""
import argparse
import datetime
import os
import re
import socket
import statistics
import subprocess
import sys
import time

SIZES = [8, 64 << 10, 1 << 20, 16 << 20]


def human(n):
    for unit, v in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= v:
            return f"{n // v} {unit}"
    return f"{n} B"


def time_all_reduce(group, nbytes, budget_s=0.4):
    import torch
    import torch.distributed as dist
    t = torch.ones(max(1, nbytes // 4))
    for _ in range(3):
        dist.all_reduce(t, group=group)
    iters = 5
    while True:  # every rank agrees on the count: rank 0 decides and broadcasts
        dist.barrier(group=group)
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t, group=group)
        took = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.broadcast(took, 0, group=group)
        if took.item() >= budget_s or iters >= 20000:
            return took.item() / iters
        iters *= 4


def ddp_images_per_s(group, batch, steps):
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
    from torch_ddp import Net
    import torch.distributed as dist
    torch.manual_seed(0)
    model = DDP(Net(), process_group=group)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    def step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    for _ in range(5):
        step()
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    dist.barrier(group=group)
    return steps * batch * dist.get_world_size(group) / (time.perf_counter() - t0)


def rank_main(a):
    import torch.distributed as dist
    import chorus_torch  # noqa: F401
    rank = int(os.environ["RANK"])
    timeout = datetime.timedelta(seconds=120)
    dist.init_process_group("gloo", timeout=timeout)
    groups = {"chorus": dist.new_group(backend="chorus", timeout=timeout),
              "gloo": dist.group.WORLD}
    if dist.is_mpi_available():
        groups["mpi"] = dist.new_group(backend="mpi")
    n = dist.get_world_size()
    times = {(b, s): [] for b in groups for s in SIZES}
    ddp = {(b, bs): [] for b in groups for bs in a.ddp_batch}
    for rnd in range(a.rounds):
        order = list(groups) if rnd % 2 == 0 else list(reversed(groups))
        for s in SIZES:
            for b in order:
                times[(b, s)].append(time_all_reduce(groups[b], s))
        for bs in a.ddp_batch:
            for b in order:
                ddp[(b, bs)].append(ddp_images_per_s(groups[b], bs, a.ddp_steps))
    if rank == 0:
        print(f"## torch.distributed all_reduce (float32 sum), {n} ranks, median of {a.rounds} "
              "rounds\n")
        names = list(groups)
        print("| size | " + " | ".join(f"{b} time (us) | {b} busbw (GB/s)" for b in names) +
              " | chorus / gloo busbw |")
        print("|---:|" + "---:|" * (2 * len(names) + 1))
        for s in SIZES:
            med = {b: statistics.median(times[(b, s)]) for b in names}
            bus = {b: 2 * (n - 1) / n * s / med[b] / 1e9 for b in names}
            cells = " | ".join(f"{med[b] * 1e6:.1f} | {bus[b]:.3f}" for b in names)
            print(f"| {human(s)} | {cells} | {bus['chorus'] / bus['gloo']:.2f}x |")
        print(f"\n## DDP, tutorial CNN, {n} ranks, {a.ddp_steps} steps, median of {a.rounds} "
              "rounds\n")
        print("| batch per rank | " + " | ".join(f"{b} images/s" for b in names) +
              " | chorus / gloo |")
        print("|---:|" + "---:|" * (len(names) + 1))
        for bs in a.ddp_batch:
            med = {b: statistics.median(ddp[(b, bs)]) for b in names}
            print(f"| {bs} | " + " | ".join(f"{med[b]:.0f}" for b in names) +
                  f" | {med['chorus'] / med['gloo']:.2f}x |")
        sys.stdout.flush()
    dist.barrier()
    os._exit(0)


def c_api_latency(build, ranks):
    """chorus-perf's 8-byte in-place all-reduce time (us; torch's all_reduce is in place)."""
    out = subprocess.run([os.path.join(build, "tools", "chorus-run"), "--no-prefix", "-n",
                          str(ranks), os.path.join(build, "bench", "chorus-perf"), "-b", "8",
                          "-e", "8", "-n", "2000", "-w", "100", "-c", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    for line in out.stdout.splitlines():
        cols = line.split()
        if cols and cols[0] == "8":
            nums = [c for c in cols if re.fullmatch(r"[0-9.]+", c)]
            return float(nums[5]) if len(nums) > 5 else None  # size, count, time, algbw, busbw, time
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ddp-batch", type=int, nargs="+", default=[4, 32],
                    help="per-rank batch sizes (4 is the tutorial's)")
    ap.add_argument("--ddp-steps", type=int, default=200)
    ap.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank_main:
        return rank_main(a)
    build = os.path.abspath(a.build)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               WORLD_SIZE=str(a.ranks), OMP_NUM_THREADS="1",
               PYTHONPATH=os.path.join(build, "python"))
    print(f"# bench/torch_compare.py, {datetime.date.today()}, {a.ranks} ranks, "
          f"{os.cpu_count()} CPUs\n", flush=True)
    args = [sys.executable, os.path.abspath(__file__), "--rank-main", "--rounds", str(a.rounds),
            "--ddp-steps", str(a.ddp_steps), "--ddp-batch"] + [str(b) for b in a.ddp_batch]
    procs = [subprocess.Popen(args, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)))
             for r in range(a.ranks)]
    rc = max(p.wait() for p in procs)
    lat = c_api_latency(build, a.ranks)
    if lat is not None:
        print(f"\nchorus C API (chorus-perf) 8-byte all_reduce, same machine: {lat:.1f} us; the "
              "8 B row above minus this is the Python/c10d path's cost per call.")
    return rc


if __name__ == "__main__":
    sys.exit(main())
