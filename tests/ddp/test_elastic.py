#!/usr/bin/env python3
"""Issue 17 item 3: train_cnn under chorus-run --elastic keeps training when a rank dies.

    test_elastic.py CHORUS_RUN TRAIN_CNN [--chaos SECONDS [SEED]]

Three ranks train on synthetic data; one is killed (SIGKILL, by train_cnn's test hook) at a chosen
point: after a step, or inside a step while its gradients are being all-reduced; rank 0 (whose
process would host the store under other launchers) and another rank. Each run must finish with
exit 0, print one line naming the dead rank and the step the survivors continue from, and train
on every sample of the epoch exactly once: the ranks log each step's samples before the step
("try G ...") and, after a recovery, "resume G" (tries after G were undone); the dead rank's tries
after the survivors' G are void too. A second epoch runs on the two survivors. With --chaos, random kills (rank, step, after or inside
it) for a bounded time (make chaos).
"""
import os
import random
import re
import subprocess
import sys
import tempfile
import time

N, BATCH = 960, 16  # 5 steps at 3 ranks = 240 samples; the rest, 720, splits evenly over 2


def run(chorus_run, train_cnn, victim, step, in_sync):
    with tempfile.TemporaryDirectory() as logs:
        cmd = [chorus_run, "--elastic", "-n", "3", train_cnn, "--data", "synthetic",
               "--synthetic-size", str(N), "--synthetic-shape", "3x32x32", "--batch-size",
               str(BATCH), "--epochs", "2", "--no-progress", "--log-every", "10",
               "--fail-at-step", str(step), "--fail-rank", str(victim), "--sample-log", logs]
        if in_sync:
            cmd.append("--fail-in-sync")
        what = f"rank {victim} killed {'inside' if in_sync else 'after'} step {step}"
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=150)
        out = p.stdout
        problems = []
        if p.returncode != 0:
            problems.append(f"chorus-run exited {p.returncode}")
        m = re.search(rf"rank {victim} died at step (\d+) \(.*\); continuing with 2 ranks from "
                      rf"step (\d+), lr", out)
        if not m:
            problems.append("no line saying the rank died and the survivors continue")
            return what, problems, out
        died_at, resume = int(m.group(1)), int(m.group(2))
        # Where the kill lands decides which step the survivors continue from.
        want = (step - 1, step) if in_sync else (step,)
        if resume not in want:
            problems.append(f"continued from step {resume}, expected {' or '.join(map(str, want))}")
        if died_at != resume + 1:
            problems.append(f"died at step {died_at} but continued from {resume}")
        # Epoch 1's steps: up to the last one the log lines count (28 here: 5 + 23).
        epoch1_steps = None
        for mm in re.finditer(r"epoch 1 step (\d+)/(\d+)", out):
            epoch1_steps = int(mm.group(2))
        samples = []
        for r in range(3):
            path = os.path.join(logs, f"rank{r}.txt")
            tries = {}
            with open(path) as f:
                for line in f:
                    words = line.split()
                    if words[0] == "resume":
                        tries = {k: v for k, v in tries.items() if k <= int(words[1])}
                    elif words[0] == "try":
                        tries[int(words[1])] = [int(w) for w in words[2:]]
            if r == victim:
                tries = {k: v for k, v in tries.items() if k <= resume}
            for g, idx in tries.items():
                if epoch1_steps is not None and g <= epoch1_steps:
                    samples += idx
        counts = {}
        for i in samples:
            counts[i] = counts.get(i, 0) + 1
        missing = [i for i in range(N) if i not in counts]
        twice = [i for i, c in counts.items() if c > 1]
        if epoch1_steps is None or missing or twice or len(samples) != N:
            problems.append(f"epoch 1 ({epoch1_steps} steps): {len(samples)} samples trained on, "
                            f"{len(missing)} never, {len(twice)} more than once")
        if not re.search(r"epoch 2 step \d+/30: .*\(2 ranks\)", out):
            problems.append("epoch 2 did not run on the 2 survivors (30 steps)")
        return what, problems, out


def chaos(seconds, seed):
    """Random kills (rank, step, after or inside it) until `seconds` have passed."""
    rng = random.Random(seed)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        yield rng.randrange(3), rng.randrange(1, 20), rng.random() < 0.5


def main():
    chorus_run, train_cnn = sys.argv[1], sys.argv[2]
    cases = [(1, 5, False), (0, 3, False), (2, 4, True), (0, 6, True)]
    if len(sys.argv) > 3:  # --chaos SECONDS [SEED]: make chaos
        seed = int(sys.argv[5]) if len(sys.argv) > 5 else int(time.time())
        print(f"chaos: random kills for {sys.argv[4]} s, seed {seed}")
        cases = chaos(float(sys.argv[4]), seed)
    failed = 0
    runs = 0
    for victim, step, in_sync in cases:
        runs += 1
        what, problems, out = run(chorus_run, train_cnn, victim, step, in_sync)
        if problems:
            failed += 1
            print(out)
            for p in problems:
                print(f"FAIL: {what}: {p}")
        else:
            line = next(l for l in out.splitlines() if "died at step" in l)
            print(f"ok: {what}: {line.strip()}")
    print(f"{runs - failed} of {runs} runs went on and trained on every sample once")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
