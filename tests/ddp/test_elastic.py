#!/usr/bin/env python3
"""Issue 17 item 3: train_cnn under chorus-run --elastic keeps training when a rank dies.

    test_elastic.py CHORUS_RUN TRAIN_CNN [--light | --chaos SECONDS [SEED]]

Three or four ranks train on synthetic data, with small gradient buckets (several all-reduces
overlap backward); one is killed (SIGKILL, by train_cnn's test hook) at a chosen point: after a
step, inside a step's backward (a gradient hook, while earlier buckets are being all-reduced),
inside its gradient all-reduce after backward, or while rank 0 writes a snapshot; rank 0 (whose
process would host the store under other launchers) and others. Each run must finish with exit
0, print one line naming the dead rank and the step the survivors continue from, and train on
every sample of the epoch exactly once: the ranks log each step's samples before the step
("try G ...") and, after a recovery, "resume G" (tries after G were undone); the dead rank's tries
after the survivors' G are void too. A second epoch runs on the survivors. With --max-restarts 1
(the rejoin cases), chorus-run restarts the dead worker, it rejoins before a chosen step (rank 0
waits for it there: --await-rejoin-at) with rank 0's state, the rest of the epoch is re-divided
over the full world again, and the second epoch runs on all of them.

The final parameters and momenta must equal, bit for bit, those of an uninterrupted run on the
same schedule of world sizes: a second run in which the victim leaves on purpose after the step
the survivors continued from (train_cnn --leave-at, a split instead of a death), and, in the
rejoin cases, is restarted and rejoins at the same step. Both runs' last snapshots (written at
the end of epoch 2) are compared byte for byte.

With --light, three of the cases (rank 0 dying inside a backward with buckets in flight, a
death and a rejoin, rank 0 dying while it writes a snapshot; the sanitizer build runs these);
with --chaos, random kills (rank, step, where) and rejoins for a bounded time (make chaos).

Every wait of the ranks ends within 60 s (CHORUS_TIMEOUT, unless set), well before the 150 s a run
may take here: a run that hangs in chorus names the wait, the rank and the call.
"""
import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

N, BATCH = 960, 16  # one epoch: 20 steps of 3 ranks or 15 of 4
# Where the victim dies: train_cnn's flag for each (after the step: none).
WHERE = {"after": [], "sync": ["--fail-in-sync"], "backward": ["--fail-in-backward"],
         "checkpoint": ["--fail-in-checkpoint"], "eval": ["--fail-in-eval"]}


def epoch_steps(world):
    return -(-(-(-N // world)) // BATCH)  # ceil(ceil(N / world) / BATCH)


def epoch_samples(path, last_step, void_after=None):
    """The samples a rank's log says it trained on in steps up to last_step: "try G ..." lines,
    less those a later "resume G" undid, and (the dead rank) those after void_after."""
    tries = {}
    with open(path) as f:
        for line in f:
            words = line.split()
            if words[0] == "resume":
                tries = {k: v for k, v in tries.items() if k <= int(words[1])}
            elif words[0] == "try":
                tries[int(words[1])] = [int(w) for w in words[2:]]
    out = []
    for g, idx in tries.items():
        if (void_after is None or g <= void_after) and last_step is not None and g <= last_step:
            out += idx
    return out


def snapshot_problems(ckpt, cut, epoch_end):
    """The snapshot of step `cut` was cut between its files (tensors, no record; at the epoch's
    end the survivors' new rank 0 writes it again); every record left names a tensor file of its
    size; the new rank 0 wrote later ones."""
    problems = []
    names = sorted(os.listdir(ckpt)) if os.path.isdir(ckpt) else []
    if f"snapshot-{cut:09d}.json" in names and not epoch_end:
        problems.append(f"the snapshot of step {cut} has its record: the kill did not cut it")
    records = [n for n in names if n.endswith(".json")]
    for n in records:
        with open(os.path.join(ckpt, n)) as f:
            rec = json.load(f)
        t = os.path.join(ckpt, rec["tensors"])
        if not os.path.exists(t) or os.path.getsize(t) != rec["tensors_bytes"]:
            problems.append(f"{n} names {rec['tensors']}, missing or not {rec['tensors_bytes']} bytes")
    if not any(int(n[9:18]) > cut for n in records):
        problems.append(f"no snapshot after step {cut} ({names})")
    orphans = [n for n in names if n.endswith(".safetensors") and n[:-12] + ".json" not in names]
    if orphans:
        problems.append(f"tensors without a record left behind: {orphans}")
    return problems


def tally(samples):
    """Samples of 0..N-1 never trained on, and repeats."""
    counts = {}
    for i in samples:
        counts[i] = counts.get(i, 0) + 1
    return [i for i in range(N) if i not in counts], sum(c - 1 for c in counts.values())


def last_snapshot(ckpt):
    """The tensors (parameters and momenta) of the newest complete snapshot in ckpt, or None."""
    names = sorted(n for n in os.listdir(ckpt) if n.endswith(".json")) if os.path.isdir(ckpt) else []
    if not names:
        return None, None
    with open(os.path.join(ckpt, names[-1])) as f:
        rec = json.load(f)
    with open(os.path.join(ckpt, rec["tensors"]), "rb") as f:
        return names[-1], f.read()


def train_cmd(chorus_run, train_cnn, world, join_at, logs, ckpt, every):
    cmd = [chorus_run, "--elastic", "-n", str(world), train_cnn, "--data", "synthetic",
           "--synthetic-size", str(N), "--synthetic-shape", "3x32x32", "--batch-size", str(BATCH),
           "--epochs", "2", "--no-progress", "--log-every", "10", "--first-bucket-mb", "0.02",
           "--bucket-cap-mb", "0.05", "--checkpoint-dir", ckpt, "--checkpoint-every", str(every)]
    if logs:
        cmd += ["--sample-log", logs]
    if join_at:  # chorus-run restarts it; rank 0 waits for it before step join_at
        cmd[1:1] = ["--max-restarts", "1"]
        cmd += ["--await-rejoin-at", str(join_at)]
    return cmd


def epoch_lines(out):
    """Each epoch's global train loss, train accuracy and test accuracy, as printed."""
    return re.findall(r"epoch \d+: train loss \S+, train acc \S+, .* test acc \S+", out)


def metrics(line):
    return re.sub(r", \d+ images/s", "", line)


def reference_problems(chorus_run, train_cnn, victims, world, join_at, every, resume, killed, out):
    """The same schedule of world sizes without a death: the victim leaves after step `resume`
    (and rejoins before join_at); the last snapshots must be the same bytes, and the epochs'
    global loss and accuracy the same numbers (each rank's part of the sums is its own)."""
    if killed[1] is None:
        return ["the run left no snapshot to compare"]
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = os.path.join(tmp, "ckpt")
        cmd = train_cmd(chorus_run, train_cnn, world, join_at, None, ckpt, every)
        cmd += ["--leave-at", str(resume), "--leave-rank", ",".join(map(str, victims))]
        code, ref_out, hung = run_job(cmd)
        if code != 0 or f"{who(victims)} left at step {resume}" not in ref_out:
            return [f"reference run ({who(victims)} leave after step {resume}): "
                    + ("a hang" if hung else f"exit {code}") + f", or no line saying so:\n{ref_out}"]
        name, tensors = last_snapshot(ckpt)
        if (name, tensors) != killed:
            return [f"final parameters differ from the reference run's ({who(victims)} left "
                    f"after step {resume}): snapshots {killed[0]} and {name}"]
        mine = [metrics(l.split("|")[0]) for l in epoch_lines(out)]
        ref = [metrics(l.split("|")[0]) for l in epoch_lines(ref_out)]
        if mine != ref or len(mine) != 2:
            return [f"epoch metrics differ from the reference run's: {mine} and {ref}"]
    return []


def run_env_launched(cmd, world, victim):
    """The ranks started as torchrun would (RANK, WORLD_SIZE, MASTER_ADDR/PORT; rank 0 hosts the
    bootstrap store, so killing it takes the store away: the survivors move to a new one).
    Returns (0 when the survivors exited 0 and the victim was killed, the ranks' output)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    secret = secrets.token_hex(16)
    procs = []
    for r in range(world):
        env = {k: v for k, v in os.environ.items() if not k.startswith("CHORUS_")}
        env.update({"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(world),
                    "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port), "CHORUS_JOB_SECRET": secret,
                    "CHORUS_TIMEOUT": os.environ["CHORUS_TIMEOUT"]})
        procs.append(subprocess.Popen(cmd + ["--elastic"], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs, code = [], 0
    for r, proc in enumerate(procs):
        try:
            text, _ = proc.communicate(timeout=150)
        except subprocess.TimeoutExpired:
            dump = stacks([proc.pid])
            proc.kill()
            text, _ = proc.communicate()
            text += dump
        outs += [f"[{r}] {line}" for line in text.splitlines()]
        if proc.returncode != (-signal.SIGKILL if r == victim else 0):
            code = proc.returncode or 1
    return code, "\n".join(outs) + "\n"


def descendants(pid):
    """The processes under pid (children first found, then theirs), from /proc."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    out, todo = [], [pid]
    while todo:
        kids = [c for c, p in parent.items() if p == todo[0]]
        out += kids
        todo = todo[1:] + kids
    return out


def stacks(pids):
    """Every thread's stack of each process of pids (gdb, when installed), for a hang."""
    gdb = shutil.which("gdb")
    if not gdb:
        return "(no stacks: gdb is not installed)\n"
    text = ""
    for p in pids[:8]:
        name, bt = "?", ""
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                name = f.read().replace(b"\0", b" ").decode(errors="replace")[:200]
            bt = subprocess.run([gdb, "-p", str(p), "-batch", "-ex", "thread apply all bt"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                timeout=60).stdout
        except (OSError, subprocess.TimeoutExpired) as e:
            bt += f"({e})"
        text += f"--- stacks of pid {p}: {name}\n{bt}\n"
    return text


def run_job(cmd, env=None, timeout=150):
    """(exit code, output, hung): a run still going after `timeout` s is a hang; its processes'
    stacks go into the output before they are killed."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out, False
    except subprocess.TimeoutExpired:
        tree = [proc.pid] + descendants(proc.pid)
        dump = stacks(tree)
        for p in tree:  # the workers too, whatever their process group
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        out, _ = proc.communicate()
        return proc.returncode, out + dump, True


def who(victims):
    """How train_cnn names the ranks that died or left: "rank 2", "ranks 1,2"."""
    return f"rank{'s' if len(victims) > 1 else ''} {','.join(map(str, sorted(victims)))}"


def run(chorus_run, train_cnn, victim, step, where, world=3, join_at=None, launcher="chorus-run",
        second=None):
    """One run: `victim` killed at (step, where); with `second`, that rank too, in the
    survivors' agreement that follows (CHORUS_TEST_SHRINK_DIE), before giving its view."""
    victims = [victim] + ([second] if second is not None else [])
    with tempfile.TemporaryDirectory() as logs:
        ckpt = os.path.join(logs, "ckpt")
        every = 4 if where == "checkpoint" else 0  # rank 0 dies between a snapshot's two files
        cmd = train_cmd(chorus_run, train_cnn, world, join_at, logs, ckpt, every)
        cmd += ["--fail-at-step", str(step), "--fail-rank", str(victim)] + WHERE[where]
        what = (f"{world} ranks, rank {victim} killed "
                + {"after": "after", "sync": "in the gradient all-reduce of",
                   "backward": "in the backward of", "checkpoint": "writing the snapshot of",
                   "eval": "in the evaluation after"}[where]
                + f" step {step}" + (f", rejoins before step {join_at}" if join_at else "")
                + (" (launched as torchrun would: rank 0 hosts the store)"
                   if launcher == "env" else "")
                + (f", rank {second} in the agreement after it" if second is not None else ""))
        left = world - len(victims)
        env = dict(os.environ)
        if second is not None:
            env["CHORUS_TEST_SHRINK_DIE"] = f"{second}:view"
        if launcher == "env":
            code, out = run_env_launched(cmd[cmd.index(train_cnn):], world, victim)
        else:
            code, out, hung = run_job(cmd, env)
            if hung:  # what it said until then, and where its processes stood
                return what, ["still running after 150 s (killed): a hang"], out
        problems = []
        if code != 0:
            problems.append(f"{launcher} exited {code}")
        m = re.search(rf"{who(victims)} died at step (\d+) \(.*\); continuing with {left} rank"
                      rf"s? from step (\d+), lr", out)
        if not m:
            problems.append("no line saying the rank died and the survivors continue")
            return what, problems, out
        died_at, resume = int(m.group(1)), int(m.group(2))
        # Where the kill lands decides which step the survivors continue from (inside a step:
        # the one before it; after a step too: the victim may have its all-reduce result while others still wait
        # for its last pieces; they roll back to step - 1, and the victim's step is void.)
        # Killed inside step s (its backward or its all-reduce), the victim had finished step
        # s - 1, but a survivor may still have been taking its last pieces of step s - 1's
        # all-reduce: the news of the death fails that call too (the communicator is broken),
        # and the survivors' last common step is s - 2 (seen twice in 1,363 chaos runs, two
        # chaos runs at a time on 2 cores).
        want = (step - 2, step - 1, step) if where in ("backward", "sync") else (step - 1, step)
        if resume not in want:
            problems.append(f"continued from step {resume}, expected {' or '.join(map(str, want))}")
        if died_at not in (resume + 1, resume + 2):  # + 2: the printing rank had finished one more
            problems.append(f"died at step {died_at} but continued from {resume}")
        # Epoch 1's steps: up to the last one the log lines count (28 here: 5 + 23).
        epoch1_steps = None
        for mm in re.finditer(r"epoch 1 step (\d+)/(\d+)", out):
            epoch1_steps = int(mm.group(2))
        samples = []
        for r in range(world):
            samples += epoch_samples(os.path.join(logs, f"rank{r}.txt"), epoch1_steps,
                                     resume if r in victims else None)
        # The ranks pad the rest of the epoch to a multiple of their number at its last
        # re-division, as DistributedSampler pads a whole epoch: those repeats are the only ones
        # allowed.
        position, final = min(N, resume * BATCH * world), left
        if join_at:
            m = re.search(rf"rank {victim} rejoined at step (\d+); continuing with {world} ranks",
                          out)
            if not m or int(m.group(1)) != join_at - 1:
                problems.append(f"no line saying rank {victim} rejoined at step {join_at - 1}")
            samples += epoch_samples(os.path.join(logs, f"rank{victim}.rejoin1.txt"),
                                     epoch1_steps)
            position = min(N, position + (join_at - 1 - resume) * BATCH * left)
            final = world
        missing, repeats = tally(samples)
        rest = N - position
        pad = (final - rest % final) % final
        if epoch1_steps is None or missing or repeats != pad or len(samples) != N + pad:
            problems.append(f"epoch 1 ({epoch1_steps} steps): {len(samples)} samples trained on, "
                            f"{len(missing)} never, {repeats} repeats (padding {pad})")
        if where == "checkpoint":
            problems += snapshot_problems(ckpt, step, step == epoch_steps(world))
        steps2 = epoch_steps(final)
        if not re.search(rf"epoch 2 step \d+/{steps2}: .*\({final} ranks\)", out):
            problems.append(f"epoch 2 did not run on {final} ranks ({steps2} steps)")
        if not problems:
            problems += reference_problems(chorus_run, train_cnn, victims, world, join_at, every,
                                           resume, last_snapshot(ckpt), out)
        return what, problems, out


def chaos(seconds, seed):
    """Random kills (rank, step, where), half of them followed by a rejoin a few steps later,
    until `seconds` have passed. Only rank 0 writes snapshots, so only it dies writing one."""
    rng = random.Random(seed)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        world = rng.choice([3, 4])
        victim = rng.randrange(world)
        where = rng.choice(list(WHERE) if victim == 0 else ["after", "sync", "backward", "eval"])
        step = rng.randrange(1, 14) if where != "checkpoint" else rng.choice([4, 8, 12])
        if where == "eval":
            yield victim, epoch_steps(world), where, world
        elif rng.random() < 0.5:
            yield victim, step, where, world
        else:  # rejoins inside epoch 1 (which has at least 12 steps then)
            step = min(step, 8)
            if where == "checkpoint":
                step = rng.choice([4, 8])
            yield victim, step, where, world, step + rng.randrange(2, 5)


def bad_rejoin_env(train_cnn):
    """train_cnn refuses a CHORUS_ELASTIC_REJOIN that is not a count, or one without its
    directory, naming the variable."""
    problems = []
    for env, want in [({"CHORUS_ELASTIC_REJOIN": "abc", "CHORUS_ELASTIC_DIR": "/tmp"},
                       "env CHORUS_ELASTIC_REJOIN='abc' is not a count"),
                      ({"CHORUS_ELASTIC_REJOIN": "1"},
                       "CHORUS_ELASTIC_REJOIN is set but CHORUS_ELASTIC_DIR is not")]:
        e = {k: v for k, v in os.environ.items() if not k.startswith("CHORUS_ELASTIC")}
        e.update(env)
        p = subprocess.run([train_cnn, "--data", "synthetic", "--synthetic-size", "64"], env=e,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
        if p.returncode != 1 or want not in p.stdout:
            problems.append(f"{env}: exit {p.returncode}, expected 1 and '{want}':\n{p.stdout}")
    return problems


def main():
    chorus_run, train_cnn = sys.argv[1], sys.argv[2]
    os.environ.setdefault("CHORUS_TIMEOUT", "60")  # a stuck wait says so before the 150 s
    light = sys.argv[3:4] == ["--light"]
    if len(sys.argv) <= 3 or light:
        for p in bad_rejoin_env(train_cnn):
            print(f"FAIL: {p}")
            sys.exit(1)
        print("ok: train_cnn refuses a bad CHORUS_ELASTIC_REJOIN by name")
    cases = [(1, 5, "after", 3), (0, 3, "after", 3), (2, 4, "sync", 3), (0, 6, "sync", 3),
             (1, 4, "backward", 3), (0, 5, "backward", 4), (3, 3, "after", 4), (1, 3, "sync", 4)]
    # chorus-run --max-restarts 1: the dead worker is restarted and rejoins mid-epoch (grow).
    cases += [(1, 5, "after", 3, 12), (0, 4, "sync", 3, 9), (2, 3, "after", 4, 8),
              (3, 6, "backward", 4, 9)]
    # Rank 0 (the writer) killed while step 8's snapshot is written, with and without a rejoin.
    cases += [(0, 8, "checkpoint", 3), (0, 8, "checkpoint", 4, 12)]
    # At the epoch's end: after its last step, in its evaluation, writing its snapshot.
    cases += [(2, 20, "after", 3), (1, 20, "eval", 3), (0, 15, "eval", 4),
              (0, 20, "checkpoint", 3)]
    # A second rank dies in the survivors' agreement on the first one's death.
    cases += [(1, 5, "after", 4, None, "chorus-run", 2), (0, 4, "sync", 4, None, "chorus-run", 3)]
    # Launched without chorus-run, as torchrun would: rank 0 hosts the bootstrap store, and its
    # death takes the store with it (the survivors move to a new one, collectives/failover.cc).
    cases += [(0, 4, "after", 3, None, "env"), (0, 5, "sync", 4, None, "env"),
              (1, 3, "backward", 3, None, "env")]
    if light:  # the DDP trainer's three paths of a death: in flight, a rejoin, a snapshot
        cases = [(0, 5, "backward", 4), (1, 5, "after", 3, 12), (0, 8, "checkpoint", 3)]
    elif len(sys.argv) > 3:  # --chaos SECONDS [SEED]: make chaos
        seed = int(sys.argv[5]) if len(sys.argv) > 5 else int(time.time())
        print(f"chaos: random kills for {sys.argv[4]} s, seed {seed}")
        cases = chaos(float(sys.argv[4]), seed)
    failed = 0
    runs = 0
    for case in cases:
        runs += 1
        what, problems, out = run(chorus_run, train_cnn, *case)
        if problems:
            failed += 1
            print(out)
            for p in problems:
                print(f"FAIL: {what}: {p}")
        else:
            lines = [l.strip() for l in out.splitlines() if "died at step" in l or "rejoined" in l]
            print(f"ok: {what}: {' / '.join(lines)}")
    print(f"{runs - failed} of {runs} runs went on, trained on every sample once and ended with "
          "the reference run's parameters")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
