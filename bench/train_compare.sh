#!/usr/bin/env bash
# train_compare.sh: chorus vs PyTorch 1.13 (../shared/peers/train/baseline.py), side by side and
# interleaved round by round, one thread each. Prints images/s medians, ratios and peak memory.
#
#   bench/train_compare.sh [BUILD_DIR]         env: ROUNDS (3), EPOCHS (1), OPENBLAS_DIR, PEER
#
# 1. Fashion-MNIST variant, batch 64, SGD lr 0.01 momentum 0.9: chorus examples/train_cnn vs
#    `baseline.py single` with the serial OpenBLAS on LD_LIBRARY_PATH (the ~11,500 images/s bar).
# 2. CIFAR-shaped net, batch 4, synthetic data: chorus bench/train_step vs `baseline.py synth`.
# images/s is per training epoch (or repetition), wall time, training loop only, as in baseline.py.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
ROUNDS=${ROUNDS:-3}
EPOCHS=${EPOCHS:-1}
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

echo "== train_compare $(date -u +%FT%TZ)  rounds $ROUNDS  epochs $EPOCHS  loadavg $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$ROUNDS"); do
  timed "$BUILD/examples/train_cnn" --data fashion-mnist --epochs "$EPOCHS" --batch-size 64 --lr 0.01 \
    --momentum 0.9 --seed 0 --threads 1 --no-progress > "$OUT/chorus_fm_$r.log" 2>&1
  (cd "$PEER" && timed "${torch_env[@]}" $PY baseline.py single --lr 0.01 --threads 1 --epochs "$EPOCHS") \
    > "$OUT/torch_fm_$r.log" 2>&1
  timed "$BUILD/bench/train_step" --shape 3x32x32 --batch 4 --reps 5 --min-time 2 > "$OUT/chorus_b4_$r.log" 2>&1
  (cd "$PEER" && timed "${torch_env[@]}" $PY baseline.py synth --batches 4 --threads 1 --repeats 5) \
    > "$OUT/torch_b4_$r.log" 2>&1
  echo "   round $r: $(grep -h '^epoch' "$OUT/chorus_fm_$r.log" | tr '\n' ' ')"
  echo "            torch: $(grep -ho 'epoch [0-9]*: time [0-9.]*s *[0-9]* img/s' "$OUT/torch_fm_$r.log" | tr '\n' ' ')"
done

$PY - "$OUT" "$ROUNDS" <<'PYEOF'
import glob, json, re, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def grab(pattern, files, cast=float):
    vals = []
    for f in files:
        vals += [cast(m) for m in re.findall(pattern, open(f).read())]
    return vals
def med(v):
    return f"{statistics.median(v):.0f} [{min(v):.0f}-{max(v):.0f}] (n={len(v)})" if v else "n/a"
def rss(kind):
    v = grab(r"maxrss_kib (\d+)", sorted(glob.glob(f"{out}/{kind}_*.log")), int)
    return f"{max(v) / 1024:.0f} MiB" if v else "n/a"
c_fm = grab(r"epoch \d+: train loss [\d.]+, (\d+) images/s", sorted(glob.glob(f"{out}/chorus_fm_*.log")))
t_fm = grab(r"epoch \d+: time [\d.]+s\s+(\d+) img/s", sorted(glob.glob(f"{out}/torch_fm_*.log")))
c_b4 = []
for f in sorted(glob.glob(f"{out}/chorus_b4_*.log")):
    c_b4 += grab(r"images/s median (\d+)", [f])
t_b4 = []
for f in sorted(glob.glob(f"{out}/torch_b4_*.log")):
    for line in open(f):
        if line.startswith("JSON "):
            for res in json.loads(line[5:])["results"]:
                t_b4 += [r["img_per_s"] for r in res["reps"]]
c_b4_reps = grab(r"images/s median \d+ \[(\d+)-", sorted(glob.glob(f"{out}/chorus_b4_*.log")))
print("== results (images/s, median [min-max]; wall time, 1 thread)")
print(f"   fashion-mnist b64  chorus {med(c_fm)}   torch+openblas {med(t_fm)}   ratio "
      f"{statistics.median(c_fm) / statistics.median(t_fm):.2f}" if c_fm and t_fm else "   fashion-mnist: missing data")
print(f"   cifar-net b4 synth chorus {med(c_b4)} (median of each run's 5 reps)   torch+openblas {med(t_b4)} (all reps)   ratio "
      f"{statistics.median(c_b4) / statistics.median(t_b4):.2f}" if c_b4 and t_b4 else "   cifar b4: missing data")
print(f"   peak memory (max rss): train_cnn {rss('chorus_fm')}, baseline.py single {rss('torch_fm')}, "
      f"train_step {rss('chorus_b4')}, baseline.py synth {rss('torch_b4')}")
PYEOF
