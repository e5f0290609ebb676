"""chorus_torch under launchers: an unmodified DDP script (examples/torch_ddp.py, which imports
chorus_torch and calls init_process_group("chorus")) trains under chorus-run with equal
parameters on every rank and under Gloo; a script that never imports chorus_torch runs through
`python3 -m chorus_torch`; importing and registering twice is harmless.

With torch 2.x the same script also runs under torchrun (tests/gpu/torch2.sh, on the GPU
machine). Not with Debian's torch 1.13: its launcher dies under Python 3.11 before starting any
worker (AttributeError in torch/distributed/elastic/multiprocessing/api.py, any backend).
"""
import os
import re
import subprocess
import sys
import tempfile

PY = os.environ.get("CHORUS_TORCH_PYTHON", "/usr/bin/python3")
RUN = os.environ["CHORUS_RUN"]
SRC = os.environ["CHORUS_SOURCE_ROOT"]
FAILED = []


def run(cmd, limit=120):
    print("$", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=limit, env=dict(os.environ, OMP_NUM_THREADS="1"))
    print(p.stdout.rstrip())
    return p


def check(cond, what):
    print(("ok: " if cond else "FAILED: ") + what, flush=True)
    if not cond:
        FAILED.append(what)


def checksums(out, backend):
    found = re.findall(r"backend (\w+), 2 ranks, .* parameter checksum (\S+)", out)
    check(len(found) == 2 and all(b == backend for b, _ in found), f"both ranks ran {backend}")
    return {c for _, c in found}


def main():
    probe = subprocess.run([PY, "-c", "import chorus_torch"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    if probe.returncode != 0:
        print("SKIP: cannot import chorus_torch:", probe.stdout[-300:])
        return 77
    script = os.path.join(SRC, "examples", "torch_ddp.py")
    args = ["--steps", "30", "--batch-size", "8", "--log-every", "0"]
    p = run([RUN, "-n", "2", PY, script] + args)
    check(p.returncode == 0, "examples/torch_ddp.py under chorus-run, backend chorus")
    ours = checksums(p.stdout, "chorus")
    check(len(ours) == 1, "every rank ends with the same parameters")
    p = run([RUN, "-n", "2", PY, script, "--backend", "gloo"] + args)
    check(p.returncode == 0 and checksums(p.stdout, "gloo") == ours,
          "the same script under gloo ends with the same parameters")
    major = subprocess.run([PY, "-c", "import torch; print(torch.__version__.split('.')[0])"],
                           stdout=subprocess.PIPE, text=True).stdout.strip()
    if major.isdigit() and int(major) >= 2:
        p = run([PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                 script] + args)
        check(p.returncode == 0 and checksums(p.stdout, "chorus") == ours,
              "the same script under torchrun ends with the same parameters")
    else:
        print(f"torchrun: not checked with torch {major}.x (its launcher dies under Python 3.11 "
              "here; tests/gpu/torch2.sh checks it with torch 2.x)")

    with tempfile.TemporaryDirectory() as d:
        plain = os.path.join(d, "plain.py")
        with open(plain, "w") as f:
            f.write("import sys, torch, torch.distributed as dist\n"
                    "assert 'chorus_torch' in sys.modules  # registered by -m chorus_torch\n"
                    "dist.init_process_group('chorus')\n"
                    "t = torch.ones(3) * (dist.get_rank() + 1)\n"
                    "dist.all_reduce(t)\n"
                    "print('rank', dist.get_rank(), 'argv', sys.argv[1:], 'sum', t.tolist())\n")
        p = run([RUN, "-n", "2", PY, "-m", "chorus_torch", plain, "--flag", "x"])
        check(p.returncode == 0 and p.stdout.count("argv ['--flag', 'x'] sum [3.0, 3.0, 3.0]") == 2,
              "python3 -m chorus_torch runs a script that never imports it, with its arguments")
    p = run([PY, "-c", "import importlib, chorus_torch, torch.distributed as dist\n"
             "chorus_torch.register(); importlib.reload(chorus_torch); chorus_torch.register()\n"
             "print('backend', dist.Backend('chorus'))"])
    check(p.returncode == 0 and "backend chorus" in p.stdout, "importing and registering twice")
    print(f"{len(FAILED)} failed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
