"""One rank of a torch test (launch.py starts them): `ranks.py CASE`, env:// variables set.

Cases:
  ops      every operation x dtype under chorus, checked against a reference computed from
           every rank's inputs and against Gloo on the same inputs where Gloo has the operation;
           refusals (BAND, int16 sums, CUDA tensors, recv from any source) checked by message;
           a new_group of a subset of ranks; a group created twice on one store.
  ddp      the tutorial CNN under DDP for 100 steps on a chorus group and on a Gloo group from
           the same start: parameters within 1e-6; then the fp16 compression comm hook.
  inits    init_process_group("chorus") with tcp:// and then file://, destroyed in between.
  desync   rank 0 calls barrier, the others all_reduce: every rank raises, naming both calls.
  kill     the last rank dies by SIGKILL while the others wait in an all_reduce for it: they
           raise within 5 s, naming it.
  survive  rank 0 (whose process hosts the stores) dies by SIGKILL; the others raise naming it,
           chorus_torch.shrink() gives them a group of the survivors, an all_reduce on it is
           right; chorus_torch.revoke() on one makes the other's pending all_reduce raise; a
           shrink that excludes nobody replaces the revoked group, and DDP trains on it with
           every rank's parameters equal after 5 steps.
"""
import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import chorus_torch  # registers "chorus"; its _C has the test hooks

RANK = int(os.environ["RANK"])
N = int(os.environ["WORLD_SIZE"])
FAILURES = []


def log(*a):
    print(f"[rank {RANK}]", *a, flush=True)


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        log("FAIL:", what)


def expect_error(fn, *parts):
    """fn() must raise RuntimeError whose message holds every part; returns the message."""
    try:
        fn()
    except RuntimeError as e:
        msg = str(e)
        missing = [p for p in parts if p not in msg]
        check(not missing, f"error lacks {missing}: {msg[:300]}")
        return msg
    check(False, f"no error raised (expected one with {parts})")
    return ""


# ---------------------------------------------------------------------------------------------
# ops

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int32, torch.int64, torch.bool]
OPS = {"SUM": dist.ReduceOp.SUM, "PRODUCT": dist.ReduceOp.PRODUCT, "MIN": dist.ReduceOp.MIN,
       "MAX": dist.ReduceOp.MAX, "AVG": dist.ReduceOp.AVG}


def data(rank, numel, dtype, salt=0):
    """Rank's input: small integers (sums and products exact in every dtype), 1..3 for uint8
    products, 0/1 for bool."""
    g = torch.Generator().manual_seed(1000 * rank + 17 * salt + numel)
    if dtype == torch.bool:
        return torch.randint(0, 2, (numel,), generator=g).bool()
    lo = 0 if dtype == torch.uint8 else -3
    v = torch.randint(lo, 4, (numel,), generator=g)
    v[v == 0] = 1  # no zeros: products keep information
    return v.to(dtype)


def reference(inputs, op):
    s = torch.stack([x.to(torch.float64) if x.is_floating_point() else x.to(torch.int64)
                     for x in inputs])
    dtype = inputs[0].dtype
    if dtype == torch.bool:
        return (s.amax(0) if op in ("SUM", "MAX") else s.amin(0)).bool()
    if op == "SUM":
        r = s.sum(0)
    elif op == "PRODUCT":
        r = s.prod(0)
    elif op == "MIN":
        r = s.amin(0)
    elif op == "MAX":
        r = s.amax(0)
    else:  # AVG: float sum / n; integers: the sum divided, truncating (chorus's documented rule)
        r = s.sum(0) / len(inputs) if s.is_floating_point() else torch.div(
            s.sum(0), len(inputs), rounding_mode="trunc")
    return r.to(dtype)


def same(a, b, dtype):
    if dtype in (torch.float16, torch.bfloat16):
        return torch.allclose(a.double(), b.double(), rtol=1e-2, atol=1e-2)
    return torch.equal(a, b)


def with_gloo(gloo, fn):
    """fn(gloo group) -> result, or None when Gloo lacks the operation or dtype."""
    try:
        return fn(gloo)
    except RuntimeError as e:
        lacks = ("does not support", "no support", "Invalid", "nsupported", "Cannot use")
        return None if any(p in str(e) for p in lacks) else e


def check_all_reduce(ch, gloo, counts):
    gloo_runs = 0
    for dtype in DTYPES:
        for op in OPS:
            if dtype == torch.bool and op == "AVG":
                continue
            for count in counts:
                inputs = [data(r, count, dtype, list(OPS).index(op)) for r in range(N)]
                want = reference(inputs, op)
                got = inputs[RANK].clone()
                dist.all_reduce(got, op=OPS[op], group=ch)
                check(same(got, want, dtype), f"all_reduce {op} {dtype} x{count}: {got[:6]} vs "
                      f"{want[:6]}")
                g = with_gloo(gloo, lambda grp: dist.all_reduce(x := inputs[RANK].clone(),
                                                               op=OPS[op], group=grp) or x)
                if isinstance(g, torch.Tensor):
                    gloo_runs += 1
                    check(same(got, g, dtype), f"all_reduce {op} {dtype}: chorus != gloo")
    log(f"all_reduce: {len(DTYPES)} dtypes x 5 ops x counts {counts} ok; {gloo_runs} also "
        "compared with gloo")


GLOO = {"compared": 0, "lacks": set()}


def both(ch, gloo, name, fn, want, dtype):
    """Runs fn(group) -> tensor or list of tensors (None off the root) under chorus and under
    Gloo on the same inputs: chorus's result must equal `want` and Gloo's where Gloo has it."""
    def eq(a, b):
        if isinstance(a, (list, tuple)):
            return len(a) == len(b) and all(eq(x, y) for x, y in zip(a, b))
        return a is None and b is None or (a is not None and b is not None and same(a, b, dtype))
    got = fn(ch)
    check(eq(got, want), f"{name} {dtype}: chorus {got} vs reference {want}")
    g = with_gloo(gloo, fn)
    if isinstance(g, Exception):
        check(False, f"{name} {dtype}: gloo raised {g}")
    elif g is None and got is not None:
        GLOO["lacks"].add(f"{name} {str(dtype).replace('torch.', '')}")
    else:
        GLOO["compared"] += 1
        check(eq(got, g), f"{name} {dtype}: chorus {got} vs gloo {g}")


def check_rooted(ch, gloo):
    count = 37
    for dtype in DTYPES:
        inputs = [data(r, count, dtype, 3) for r in range(N)]
        mine, root, red_root, src = inputs[RANK], N - 1, 1 % N, 1 % N

        def bcast(grp):
            t = mine.clone() if RANK == root else torch.zeros(count, dtype=dtype)
            dist.broadcast(t, root, group=grp)
            return t
        both(ch, gloo, "broadcast", bcast, inputs[root], dtype)

        def red(grp):
            t = mine.clone()
            dist.reduce(t, red_root, op=dist.ReduceOp.MAX, group=grp)
            return t if RANK == red_root else None
        both(ch, gloo, "reduce MAX", red, reference(inputs, "MAX") if RANK == red_root else None,
             dtype)
        t = mine.clone()
        dist.reduce(t, red_root, group=ch)
        check(RANK == red_root or torch.equal(t, mine), f"reduce leaves a non-root input {dtype}")

        def gather(grp):
            lst = [torch.zeros(count, dtype=dtype) for _ in range(N)] if RANK == 0 else None
            dist.gather(mine, lst, dst=0, group=grp)
            return lst
        both(ch, gloo, "gather", gather, inputs if RANK == 0 else None, dtype)

        pieces = [data(src, count, dtype, 10 + r) for r in range(N)]

        def scatter(grp):
            out = torch.zeros(count, dtype=dtype)
            dist.scatter(out, pieces if RANK == src else None, src=src, group=grp)
            return out
        both(ch, gloo, "scatter", scatter, pieces[RANK], dtype)

        def all_gather(grp):
            lst = [torch.zeros(count, dtype=dtype) for _ in range(N)]
            dist.all_gather(lst, mine, group=grp)
            return lst
        both(ch, gloo, "all_gather", all_gather, inputs, dtype)

        def into_tensor(grp):
            flat = torch.zeros(N * count, dtype=dtype)
            fn = getattr(dist, "all_gather_into_tensor", None) or dist._all_gather_base
            fn(flat, mine, group=grp)
            return flat
        both(ch, gloo, "all_gather_into_tensor", into_tensor, torch.cat(inputs), dtype)
    log(f"broadcast, reduce, gather, scatter, all_gather (+into_tensor): {len(DTYPES)} dtypes ok")


def check_scatter_reduce(ch):
    count = 11
    for dtype in DTYPES:
        if dtype == torch.bool:
            continue
        blocks = [[data(r, count, dtype, 20 + b) for b in range(N)] for r in range(N)]
        out = torch.zeros(count, dtype=dtype)
        dist.reduce_scatter(out, blocks[RANK], op=dist.ReduceOp.SUM, group=ch)
        want = reference([blocks[r][RANK] for r in range(N)], "SUM")
        check(same(out, want, dtype), f"reduce_scatter {dtype}")
        if hasattr(dist, "reduce_scatter_tensor") or hasattr(dist, "_reduce_scatter_base"):
            fn = getattr(dist, "reduce_scatter_tensor", None) or dist._reduce_scatter_base
            out2 = torch.zeros(count, dtype=dtype)
            fn(out2, torch.cat(blocks[RANK]), group=ch)
            check(same(out2, want, dtype), f"reduce_scatter_tensor {dtype}")
    log("reduce_scatter (list and tensor): ok")


def check_all_to_all(ch, gloo):
    for dtype in (torch.float32, torch.int64, torch.float16, torch.uint8):
        # even split of 2 rows per rank, rows of 3
        inp = data(RANK, N * 2 * 3, dtype, 30).view(N * 2, 3)

        def even(grp):
            out = torch.zeros_like(inp)
            dist.all_to_all_single(out, inp, group=grp)
            return out
        want = torch.cat([data(r, N * 2 * 3, dtype, 30).view(N * 2, 3)[2 * RANK:2 * RANK + 2]
                          for r in range(N)])
        both(ch, gloo, "all_to_all_single", even, want, dtype)
        # uneven: rank r sends (r + j) % 3 rows to rank j (zero rows included)
        def rows(src, dst):
            return (src + dst) % 3
        ins = [rows(RANK, j) for j in range(N)]
        outs = [rows(j, RANK) for j in range(N)]
        inp = data(RANK, sum(ins) * 3, dtype, 31).view(-1, 3)
        out = torch.zeros(sum(outs), 3, dtype=dtype)
        dist.all_to_all_single(out, inp, outs, ins, group=ch)
        want = []
        for src in range(N):
            full = data(src, sum(rows(src, j) for j in range(N)) * 3, dtype, 31).view(-1, 3)
            start = sum(rows(src, j) for j in range(RANK))
            want.append(full[start:start + rows(src, RANK)])
        check(torch.equal(out, torch.cat(want)), f"all_to_all_single uneven {dtype}")
        # list form, different sizes per pair
        ins = [data(RANK, 1 + RANK + j, dtype, 40 + j) for j in range(N)]
        outs = [torch.zeros(1 + j + RANK, dtype=dtype) for j in range(N)]
        dist.all_to_all(outs, ins, group=ch)
        check(all(torch.equal(outs[j], data(j, 1 + j + RANK, dtype, 40 + RANK)) for j in range(N)),
              f"all_to_all list {dtype}")
    log("all_to_all_single (even, uneven with empty pairs) and all_to_all: ok")


def check_p2p_and_misc(ch, gloo):
    nxt, prv = (RANK + 1) % N, (RANK - 1) % N
    for tag in (0, 7):
        a = data(RANK, 9, torch.float32, tag)
        b = torch.zeros(9)
        if RANK % 2 == 0:
            dist.send(a, nxt, group=ch, tag=tag)
            dist.recv(b, prv, group=ch, tag=tag)
        else:
            dist.recv(b, prv, group=ch, tag=tag)
            dist.send(a, nxt, group=ch, tag=tag)
        check(torch.equal(b, data(prv, 9, torch.float32, tag)), f"send/recv ring tag {tag}")
    reqs = [dist.isend(data(RANK, 5, torch.int64, 50), nxt, group=ch),
            dist.irecv(r5 := torch.zeros(5, dtype=torch.int64), prv, group=ch)]
    for q in reqs:
        q.wait()
    check(torch.equal(r5, data(prv, 5, torch.int64, 50)), "isend/irecv")
    # coalesced all-reduce
    ts = [data(RANK, n, torch.float32, 60 + n) for n in (3, 1, 8)]
    dist.all_reduce_coalesced(ts, group=ch)
    check(all(torch.equal(ts[i], reference([data(r, n, torch.float32, 60 + n) for r in range(N)],
                                           "SUM")) for i, n in enumerate((3, 1, 8))),
          "all_reduce_coalesced")
    # non-contiguous in and out
    m = data(RANK, 12, torch.float64, 70).view(3, 4).t()
    dist.all_reduce(m, group=ch)
    want = reference([data(r, 12, torch.float64, 70) for r in range(N)], "SUM").view(3, 4).t()
    check(torch.equal(m, want), "all_reduce of a transposed (non-contiguous) tensor")
    # complex sums, int16 moved as bytes
    c = torch.complex(data(RANK, 4, torch.float32, 80), data(RANK, 4, torch.float32, 81))
    dist.all_reduce(c, group=ch)
    check(torch.equal(c, sum(torch.complex(data(r, 4, torch.float32, 80),
                                           data(r, 4, torch.float32, 81)) for r in range(N))),
          "complex all_reduce")
    s = torch.arange(6, dtype=torch.int16) * (RANK + 1) if RANK == 0 else torch.zeros(6, dtype=torch.int16)
    dist.broadcast(s, 0, group=ch)
    check(torch.equal(s, torch.arange(6, dtype=torch.int16)), "int16 broadcast")
    # async work, future, is_completed; then with the completer finishing the Work while wait()
    # waits for it, slowly between the Work's own flag and the Future (a failure in CI once)
    for slow_ms in (0, 200):
        chorus_torch._C._test_slow_finish(slow_ms)
        t = torch.ones(1000)
        w = dist.all_reduce(t, group=ch, async_op=True)
        fut = w.get_future()
        check(w.wait(), "wait() returns True")
        check(w.is_completed() and fut.done(),
              f"is_completed after wait (slow finish {slow_ms} ms): {w.is_completed()}, "
              f"future done {fut.done()}")
        check(torch.equal(fut.value()[0], torch.full((1000,), float(N))), "future holds the output")
    chorus_torch._C._test_slow_finish(0)
    dist.barrier(group=ch)
    # refusals, by message
    expect_error(lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.BAND,
                                         group=ch), "BAND is not supported by chorus")
    expect_error(lambda: dist.all_reduce(torch.ones(2, dtype=torch.int16), group=ch),
                 "dtype Short cannot be reduced by chorus")
    expect_error(lambda: dist.all_reduce(torch.ones(2, dtype=torch.bool), op=dist.ReduceOp.AVG,
                                         group=ch), "AVG of a bool tensor")
    expect_error(lambda: dist.recv(torch.zeros(2), group=ch), "any source is not supported")
    # Not testable here: a CUDA tensor (a CPU-only torch cannot make one), and other devices
    # (torch's dispatcher refuses a meta tensor before any backend sees it).
    expect_error(lambda: dist.all_gather([torch.zeros(2)], torch.zeros(2), group=ch),
                 f"expected one per rank ({N})")
    dist.barrier(group=ch)
    log("send/recv (tags), isend/irecv, coalesced, non-contiguous, complex, int16, async "
        "work and futures, refusals: ok")


def check_groups(store_path):
    # a subset group
    sub = dist.new_group([0, N - 1], backend="chorus")
    if RANK in (0, N - 1):
        t = torch.full((4,), float(RANK))
        dist.all_reduce(t, group=sub)
        check(torch.equal(t, torch.full((4,), float(N - 1))), "new_group subset all_reduce")
        check(dist.get_world_size(sub) == 2, "subset size")
    # a group made twice over one store: the second must not read the first's id
    store = dist.FileStore(store_path, N)
    for k in range(2):
        pg = chorus_torch._C.create_process_group(store, RANK, N, datetime.timedelta(seconds=30))
        t = torch.full((3,), float(k + RANK))
        pg.allreduce([t]).wait()
        check(torch.equal(t, torch.full((3,), float(N * k + N * (N - 1) // 2))),
              f"group {k} on a reused store")
        del pg
    log("new_group of a subset; a group re-created on the same store: ok")


def case_ops():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    gloo = dist.group.WORLD
    ch = dist.new_group(backend="chorus", timeout=datetime.timedelta(seconds=60))
    check(dist.get_backend(ch) == "chorus", "get_backend says chorus")
    t0 = time.monotonic()
    check_all_reduce(ch, gloo, [1, 7, 1000])
    check_rooted(ch, gloo)
    check_scatter_reduce(ch)
    check_all_to_all(ch, gloo)
    check_p2p_and_misc(ch, gloo)
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"chorus_torch_store_{os.environ['MASTER_PORT']}")
    check_groups(path)
    log(f"{GLOO['compared']} results of broadcast, reduce, gathers, scatter and all-to-all "
        f"also equal Gloo's; Gloo lacks: {', '.join(sorted(GLOO['lacks'])) or 'nothing'}")
    dist.barrier()
    log(f"ops took {time.monotonic() - t0:.1f} s")


# ---------------------------------------------------------------------------------------------
# DDP


class Net(torch.nn.Module):
    """The CNN of PyTorch's CIFAR-10 tutorial."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 6, 5)
        self.pool = torch.nn.MaxPool2d(2, 2)
        self.conv2 = torch.nn.Conv2d(6, 16, 5)
        self.fc1 = torch.nn.Linear(16 * 5 * 5, 120)
        self.fc2 = torch.nn.Linear(120, 84)
        self.fc3 = torch.nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def train(group, steps, hook=None):
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    model = DDP(Net(), process_group=group)
    if hook is not None:
        model.register_comm_hook(group, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(100 + RANK)
    for _ in range(steps):
        x = torch.randn(8, 3, 32, 32, generator=g)
        y = torch.randint(0, 10, (8,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def case_ddp():
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    ch = dist.new_group(backend="chorus", timeout=datetime.timedelta(seconds=60))
    t0 = time.monotonic()
    a = train(ch, 100)
    t1 = time.monotonic()
    b = train(dist.group.WORLD, 100)
    t2 = time.monotonic()
    diff = max((x - y).abs().max().item() for x, y in zip(a, b))
    start = [p.detach() for p in (torch.manual_seed(0), Net())[1].parameters()]
    moved = max((x - y).abs().max().item() for x, y in zip(a, start))
    log(f"DDP 100 steps: chorus {t1 - t0:.2f} s, gloo {t2 - t1:.2f} s; max |chorus - gloo| = "
        f"{diff:.3g}; parameters moved by {moved:.3g}")
    check(diff <= 1e-6, f"DDP parameters differ by {diff}")
    check(moved > 1e-3, "training changed the parameters")
    a = train(ch, 10, default_hooks.fp16_compress_hook)
    b = train(dist.group.WORLD, 10, default_hooks.fp16_compress_hook)
    diff = max((x - y).abs().max().item() for x, y in zip(a, b))
    log(f"DDP with fp16_compress_hook, 10 steps: max |chorus - gloo| = {diff:.3g}")
    check(diff <= 1e-6, f"DDP with the fp16 hook differs by {diff}")


# ---------------------------------------------------------------------------------------------
# failures


def timed_error(fn, seconds, *parts):
    t0 = time.monotonic()
    msg = expect_error(fn, *parts)
    took = time.monotonic() - t0
    log(f"raised after {took:.2f} s: {msg[:400]}")
    check(took <= seconds, f"took {took:.2f} s, bound {seconds} s")


def case_inits():
    port = int(os.environ["MASTER_PORT"])
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"chorus_torch_init_{port}")
    for k, method in enumerate([f"tcp://127.0.0.1:{port}", f"file://{path}"]):
        dist.init_process_group("chorus", init_method=method, rank=RANK, world_size=N,
                                timeout=datetime.timedelta(seconds=30))
        t = torch.full((5,), float(RANK + k))
        dist.all_reduce(t)
        check(torch.equal(t, torch.full((5,), float(N * k + N * (N - 1) // 2))), method)
        check(dist.get_backend() == "chorus", f"{method}: backend")
        dist.destroy_process_group()
        log(f"init_method {method.split(':')[0]}:// ok")


def case_desync():
    dist.init_process_group("chorus", timeout=datetime.timedelta(seconds=60))
    dist.all_reduce(torch.ones(4))
    if RANK == 0:
        timed_error(lambda: dist.barrier(), 10, "barrier", "all_reduce")
    else:
        timed_error(lambda: dist.all_reduce(torch.ones(4)), 10, "barrier", "all_reduce")


def case_kill():
    dist.init_process_group("chorus", timeout=datetime.timedelta(seconds=60))
    dist.all_reduce(torch.ones(4))
    if RANK == N - 1:
        time.sleep(0.5)  # the others are inside the all_reduce by now
        os.kill(os.getpid(), signal.SIGKILL)
    timed_error(lambda: dist.all_reduce(torch.ones(1 << 16)), 5, f"rank {N - 1}")


def case_survive():
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("chorus", timeout=datetime.timedelta(seconds=60))
    dist.all_reduce(torch.ones(4))
    if RANK == 0:
        time.sleep(0.5)  # the others are inside the all_reduce by now
        os.kill(os.getpid(), signal.SIGKILL)
    timed_error(lambda: dist.all_reduce(torch.ones(1 << 16)), 5, "rank 0")
    t0 = time.monotonic()
    g = chorus_torch.shrink()
    log(f"shrink: rank {RANK} -> {g.rank()} of {g.size()} in {time.monotonic() - t0:.3f} s")
    check(g.size() == N - 1 and g.rank() == RANK - 1, f"shrunk to {g.rank()} of {g.size()}")
    t = torch.full((1000,), float(RANK))
    dist.all_reduce(t, group=g)
    check(torch.equal(t, torch.full((1000,), float(sum(range(1, N))))), "all_reduce on the shrunk group")
    if g.rank() == 0:
        time.sleep(0.3)  # the others wait in the all_reduce below
        chorus_torch.revoke(g)
    timed_error(lambda: dist.all_reduce(torch.ones(1 << 16), group=g), 5, "revoked")
    g2 = chorus_torch.shrink(g, exclude=[])
    check(g2.size() == N - 1, f"the group after the revoke has {g2.size()} ranks")
    torch.manual_seed(0)
    model = DDP(Net(), process_group=g2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator().manual_seed(100 + RANK)
    for _ in range(5):
        opt.zero_grad()
        x, y = torch.randn(8, 3, 32, 32, generator=gen), torch.randint(0, 10, (8,), generator=gen)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    lo, hi = flat.clone(), flat.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=g2)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=g2)
    check(torch.equal(lo, hi), "DDP on the survivors' group: parameters differ between ranks")
    log("DDP on the survivors' group: 5 steps, parameters equal on every rank")


if __name__ == "__main__":
    {"ops": case_ops, "ddp": case_ddp, "inits": case_inits, "desync": case_desync,
     "kill": case_kill, "survive": case_survive}[sys.argv[1]]()
    if FAILURES:
        log(f"{len(FAILURES)} checks failed")
        sys.exit(1)
    log("all checks passed")
    os._exit(0)  # groups of a failed job are not torn down one by one
