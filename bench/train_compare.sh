#!/usr/bin/env bash
# train_compare.sh: chorus vs PyTorch 1.13 (../shared/peers/train/baseline.py), side by side and
# interleaved round by round, one thread each. Prints images/s medians, ratios and peak memory.
#
#   bench/train_compare.sh [BUILD_DIR]   env: SEEDS ("0 1 2"), EPOCHS (3), ROUNDS (3), OPENBLAS_DIR, PEER
#
# 1. Fashion-MNIST variant, batch 64, SGD lr 0.01 momentum 0.9, per seed: chorus
#    examples/train_cnn, then `baseline.py single` with the serial OpenBLAS on LD_LIBRARY_PATH
#    (the ~11,500 images/s bar). Reports images/s per epoch and the mean final test accuracy.
# 2. CIFAR-shaped net, batch 4, synthetic data, per round: chorus bench/train_step vs
#    `baseline.py synth`, each with and without flushing denormals (chorus flushes by default;
#    torch.set_flush_denormal(True) for PyTorch).
# images/s: wall time of the training loop only, as in baseline.py; "cpu" divides by the
# process's CPU seconds instead, which other programs on the machine disturb far less.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
ROUNDS=${ROUNDS:-3}
EPOCHS=${EPOCHS:-3}
SEEDS=${SEEDS:-0 1 2}
PEER=${PEER:-$ROOT/../shared/peers/train}
OPENBLAS_DIR=${OPENBLAS_DIR:-/tmp/openblas-local/root/usr/lib/x86_64-linux-gnu/openblas-serial}
PY=/usr/bin/python3
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

[ -x "$BUILD/examples/train_cnn" ] || { echo "train_compare: $BUILD/examples/train_cnn not built" >&2; exit 1; }
[ -f "$PEER/baseline.py" ] || { echo "train_compare: $PEER/baseline.py not found" >&2; exit 1; }
if [ ! -e "$OPENBLAS_DIR/libopenblas.so.0" ]; then
  echo "train_compare: no serial OpenBLAS at $OPENBLAS_DIR (see $PEER/README.md); torch uses its default BLAS" >&2
fi
torch_env=(env LD_LIBRARY_PATH="$OPENBLAS_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
timed() { /usr/bin/time -f "maxrss_kib %M" "$@"; }

echo "== train_compare $(date -u +%FT%TZ)  seeds $SEEDS  epochs $EPOCHS  rounds $ROUNDS  loadavg $(cut -d' ' -f1-3 /proc/loadavg)"
for seed in $SEEDS; do
  timed "$BUILD/examples/train_cnn" --data fashion-mnist --epochs "$EPOCHS" --batch-size 64 --lr 0.01 \
    --momentum 0.9 --seed "$seed" --threads 1 --no-progress > "$OUT/chorus_fm_$seed.log" 2>&1
  (cd "$PEER" && timed "${torch_env[@]}" $PY baseline.py single --lr 0.01 --threads 1 --epochs "$EPOCHS" \
    --seed "$seed") > "$OUT/torch_fm_$seed.log" 2>&1
  echo "   seed $seed chorus: $(grep -h '^epoch' "$OUT/chorus_fm_$seed.log" | cut -d'|' -f1 | tr '\n' ' ')"
  echo "          torch:  $(grep -ho 'epoch [0-9]*: time [0-9.]*s *[0-9]* img/s .*test_acc [0-9.]*' \
    "$OUT/torch_fm_$seed.log" | sed 's/  *| fwd.*//' | tr '\n' ' ')"
done
torch_ftz() {  # baseline.py with torch.set_flush_denormal(True), everything else unchanged
  (cd "$PEER" && timed "${torch_env[@]}" $PY -c "import sys, runpy, torch
torch.set_flush_denormal(True)
sys.argv = ['baseline.py'] + sys.argv[1:]
runpy.run_path('baseline.py', run_name='__main__')" "$@")
}
for r in $(seq 1 "$ROUNDS"); do
  timed "$BUILD/bench/train_step" --shape 3x32x32 --batch 4 --reps 5 --min-time 2 > "$OUT/chorus_b4_$r.log" 2>&1
  (cd "$PEER" && timed "${torch_env[@]}" $PY baseline.py synth --batches 4 --threads 1 --repeats 5) \
    > "$OUT/torch_b4_$r.log" 2>&1
  timed "$BUILD/bench/train_step" --shape 3x32x32 --batch 4 --reps 5 --min-time 2 --keep-denormals \
    > "$OUT/chorusdn_b4_$r.log" 2>&1
  torch_ftz synth --batches 4 --threads 1 --repeats 5 > "$OUT/torchftz_b4_$r.log" 2>&1
  echo "   round $r: cifar-net b4 done"
done

$PY - "$OUT" <<'PYEOF'
import glob, json, re, statistics, sys
out = sys.argv[1]
def files(kind):
    return sorted(glob.glob(f"{out}/{kind}_*.log"))
def grab(pattern, kind, cast=float):
    return [cast(m) for f in files(kind) for m in re.findall(pattern, open(f).read())]
def med(v):
    return f"{statistics.median(v):.0f} [{min(v):.0f}-{max(v):.0f}] (n={len(v)})" if v else "n/a"
def ratio(a, b):
    return f"{statistics.median(a) / statistics.median(b):.2f}" if a and b else "n/a"
def rss(kind):
    v = grab(r"maxrss_kib (\d+)", kind, int)
    return f"{max(v) / 1024:.0f} MiB" if v else "n/a"
def torch_json(kind):
    objs = []
    for f in files(kind):
        objs += [json.loads(l[5:]) for l in open(f) if l.startswith("JSON ")]
    return objs
# Fashion-MNIST b64: per epoch, wall and process-cpu images/s
c_fm = grab(r"epoch \d+: train loss [\d.]+, (\d+) images/s", "chorus_fm")
c_fm_cpu = [60000 / c for c in grab(r"cpu ([\d.]+) s", "chorus_fm")]
t_ep = [e for o in torch_json("torch_fm") for e in o["epochs"]]
t_fm = [e["img_per_s"] for e in t_ep]
t_fm_cpu = [e["imgs"] / e["cpu_s"] for e in t_ep]
# CIFAR-net b4: per repetition
def chorus_b4(kind):
    wall, cpu = [], []
    for f in files(kind):
        for w, c in re.findall(r"reps wall:([\d ]+) \| cpu:([\d ]+)", open(f).read()):
            wall += [float(x) for x in w.split()]
            cpu += [float(x) for x in c.split()]
    return wall, cpu
c_b4, c_b4_cpu = chorus_b4("chorus_b4")
d_b4, d_b4_cpu = chorus_b4("chorusdn_b4")
t_reps = [r for o in torch_json("torch_b4") for res in o["results"] for r in res["reps"]]
t_b4 = [r["img_per_s"] for r in t_reps]
t_b4_cpu = [r["iters"] * 4 / r["cpu_s"] for r in t_reps]
print("== results: images/s median [min-max]; 1 thread; wall = the bar, cpu = images per CPU-second (robust to other load)")
print(f"   fashion-mnist b64 (per epoch)    wall: chorus {med(c_fm)}  torch {med(t_fm)}  ratio {ratio(c_fm, t_fm)}")
print(f"                                     cpu: chorus {med(c_fm_cpu)}  torch {med(t_fm_cpu)}  ratio {ratio(c_fm_cpu, t_fm_cpu)}")
tf_reps = [r for o in torch_json("torchftz_b4") for res in o["results"] for r in res["reps"]]
f_b4 = [r["img_per_s"] for r in tf_reps]
f_b4_cpu = [r["iters"] * 4 / r["cpu_s"] for r in tf_reps]
print(f"   cifar-net b4, both flush denormals    wall: chorus {med(c_b4)}  torch {med(f_b4)}  ratio {ratio(c_b4, f_b4)}")
print(f"                                          cpu: chorus {med(c_b4_cpu)}  torch {med(f_b4_cpu)}  ratio {ratio(c_b4_cpu, f_b4_cpu)}")
print(f"   cifar-net b4, both keep denormals     wall: chorus {med(d_b4)}  torch {med(t_b4)}  ratio {ratio(d_b4, t_b4)}")
print(f"                                          cpu: chorus {med(d_b4_cpu)}  torch {med(t_b4_cpu)}  ratio {ratio(d_b4_cpu, t_b4_cpu)}")
print(f"   cifar-net b4, chorus default (flush) vs torch default (keep): wall ratio {ratio(c_b4, t_b4)}, cpu ratio {ratio(c_b4_cpu, t_b4_cpu)}")
c_acc = [float(x) for f in files("chorus_fm") for x in re.findall(r"test acc ([\d.]+)", open(f).read())[-1:]]
t_acc = [o["epochs"][-1]["test_acc"] for o in torch_json("torch_fm")]
if c_acc and t_acc:
    print(f"   fashion-mnist final test acc per seed: chorus {c_acc} mean {statistics.mean(c_acc):.4f}; "
          f"torch {t_acc} mean {statistics.mean(t_acc):.4f}; difference {100 * (statistics.mean(c_acc) - statistics.mean(t_acc)):+.2f} pp")
print(f"   peak memory (max rss): train_cnn {rss('chorus_fm')}, baseline.py single {rss('torch_fm')}, "
      f"train_step {rss('chorus_b4')}, baseline.py synth {rss('torch_b4')}")
PYEOF
