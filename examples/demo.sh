#!/usr/bin/env bash
# make demo: the main job. A 2-rank DDP training of the tutorial CNN on Fashion-MNIST (one epoch,
# one global log line per interval from rank 0, final test accuracy), launched by chorus-run;
# then a short chorus-perf table when that benchmark is built.
set -euo pipefail
build=${1:-build}
run="$build/tools/chorus-run"
train="$build/examples/train_cnn"
echo "== chorus demo: DDP training, 2 ranks (chorus-run -n 2), Fashion-MNIST, 1 epoch, batch 32 per rank (64 in all) =="
echo "\$ $run -n 2 $train --epochs 1 --batch-size 32 --lr 0.01 --log-every 188"
"$run" -n 2 "$train" --epochs 1 --batch-size 32 --lr 0.01 --log-every 188
echo
perf="$build/bench/chorus-perf"
if [ -x "$perf" ]; then
  echo "== chorus-perf: all_reduce, 2 ranks, 8 B .. 16 MiB =="
  echo "\$ $run -n 2 $perf -b 8 -e 16M -f 8"
  "$run" -n 2 "$perf" -b 8 -e 16M -f 8
else
  echo "(chorus-perf is not built in $build/bench yet; skipping the all-reduce table)"
fi
