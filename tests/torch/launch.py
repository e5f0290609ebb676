"""Starts the ranks of a torch test as separate processes and reports how each ended.

    launch.py CASE NRANKS [--expect-fail RANKS] [--limit SECONDS]

Each rank runs `/usr/bin/python3 ranks.py CASE` with RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT set (env://), its output captured. The test passes when every rank exits 0 (ranks
listed in --expect-fail may instead die by a signal: the kill -9 case) within the limit; a rank
still running at the limit is killed and the test fails (a hang is a failure, never a wait).
Exit 77 (skip) when torch or chorus_torch cannot be imported, with the reason.
"""
import argparse
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = os.environ.get("CHORUS_TORCH_PYTHON", "/usr/bin/python3")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def skip_reason():
    probe = subprocess.run([PYTHON, "-c", "import torch.distributed, chorus_torch"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if probe.returncode != 0:
        return f"cannot import torch and chorus_torch with {PYTHON}: " + probe.stdout.strip()[-400:]
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("case")
    ap.add_argument("nranks", type=int)
    ap.add_argument("--expect-killed", default="", help="ranks that kill themselves (comma list)")
    ap.add_argument("--limit", type=float, default=120)
    a = ap.parse_args()
    reason = skip_reason()
    if reason:
        print("SKIP:", reason)
        return 77
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(a.nranks), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    procs = []
    t0 = time.monotonic()
    for r in range(a.nranks):
        procs.append(subprocess.Popen([PYTHON, os.path.join(HERE, "ranks.py"), a.case],
                                      env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs, codes = [], []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1.0, a.limit - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, _ = p.communicate()
            out += f"\n[launch] killed at the {a.limit:.0f} s limit: a hang\n"
        outputs.append(out)
        codes.append(p.returncode)
    killed = {int(r) for r in a.expect_killed.split(",") if r}
    ok = True
    for r, (code, out) in enumerate(zip(codes, outputs)):
        good = code == 0 or (r in killed and code == -9)
        ok = ok and good
        print(f"===== rank {r}: exit {code} ({'ok' if good else 'FAILED'})")
        print(out.rstrip())
    print(f"{a.case} with {a.nranks} ranks: {'passed' if ok else 'FAILED'} in "
          f"{time.monotonic() - t0:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
