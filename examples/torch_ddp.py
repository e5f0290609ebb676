"""A plain PyTorch DDP script -- the CNN of PyTorch's CIFAR-10 tutorial on random images --
that uses chorus by naming its backend. Run it with any launcher that sets the env:// variables:

    build/tools/chorus-run -n 2 /usr/bin/python3 examples/torch_ddp.py
    torchrun --nproc_per_node 2 examples/torch_ddp.py          (PyTorch 2.x; see README)
    ... examples/torch_ddp.py --backend gloo                    (the same script under Gloo)

It prints the loss now and then, and at the end the images per second over all ranks and a
checksum of the parameters (equal on every rank, and equal under chorus and gloo).
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

try:
    import chorus_torch  # noqa: F401  (registers the backend "chorus")
except ImportError:
    chorus_torch = None  # `python3 -m chorus_torch examples/torch_ddp.py` registers it instead


class Net(nn.Module):
    """The tutorial's net; in_ch=1, side=28 is its Fashion-MNIST variant (fc1 256 -> 120)."""

    def __init__(self, in_ch=3, side=32):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        f = ((side - 4) // 2 - 4) // 2
        self.fc1 = nn.Linear(16 * f * f, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="chorus")
    ap.add_argument("--steps", type=int, default=200, help="optimizer steps")
    ap.add_argument("--batch-size", type=int, default=32, help="per rank")
    ap.add_argument("--log-every", type=int, default=50)
    a = ap.parse_args()

    dist.init_process_group(a.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(Net())
    g = torch.Generator().manual_seed(1)
    images = torch.randn(a.steps * a.batch_size * world, 3, 32, 32, generator=g)
    labels = torch.randint(0, 10, (len(images),), generator=g)
    data = TensorDataset(images, labels)
    loader = DataLoader(data, batch_size=a.batch_size,
                        sampler=DistributedSampler(data, shuffle=True, seed=0))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    start = time.perf_counter()
    for step, (x, y) in enumerate(loader):
        if step == 5:  # warm-up steps excluded from the rate
            dist.barrier()
            start, first = time.perf_counter(), step
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if rank == 0 and a.log_every and step % a.log_every == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.barrier()
    took = time.perf_counter() - start
    timed = (a.steps - first) * a.batch_size * world
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    print(f"rank {rank}: backend {dist.get_backend()}, {world} ranks, {a.steps} steps, "
          f"{timed / took:.0f} images/s, parameter checksum {checksum:.10f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
