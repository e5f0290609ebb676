#!/usr/bin/env bash
# CHORUS_CPU_ISA: each build this CPU runs can be forced (and is the one that runs); "auto" picks
# the best; a name that is not a build is refused with a message saying what is expected, also
# by a training program (an error exit, not an abort inside a kernel).
#   test_isa_env.sh TEST_REDUCE TRAIN_CNN
set -uo pipefail
test_reduce=$1 train_cnn=$2
fail() {
  echo "FAIL: $*"
  exit 1
}
out=$("$test_reduce" "[isa]" 2>&1) || { echo "$out"; fail "test_reduce [isa] failed"; }
runs=$(sed -n 's/^kernels: .*this cpu runs //p' <<<"$out")
echo "this cpu runs: $runs"
for isa in ${runs//,/} auto; do
  out=$(CHORUS_CPU_ISA=$isa "$test_reduce" "[isa]" 2>&1) || { echo "$out"; fail "CHORUS_CPU_ISA=$isa failed"; }
  echo "CHORUS_CPU_ISA=$isa: $(grep '^kernels:' <<<"$out")"
done
out=$(CHORUS_CPU_ISA=sse9 "$test_reduce" "[isa]" 2>&1) && fail "CHORUS_CPU_ISA=sse9 was accepted"
grep -q "CHORUS_CPU_ISA='sse9': expected scalar, avx2, avx512 or auto" <<<"$out" ||
  { echo "$out"; fail "no clear error for CHORUS_CPU_ISA=sse9"; }
echo "ok: CHORUS_CPU_ISA=sse9 refused: CHORUS_CPU_ISA='sse9': expected scalar, avx2, avx512 or auto"
out=$(CHORUS_CPU_ISA=sse9 "$train_cnn" --data synthetic --synthetic-size 64 --synthetic-shape 1x28x28 \
  --epochs 1 --batch-size 32 --no-progress 2>&1)
rc=$?
[ $rc -eq 1 ] || { echo "$out"; fail "train_cnn with CHORUS_CPU_ISA=sse9 exited $rc, expected 1"; }
grep -q "train_cnn: error: CHORUS_CPU_ISA='sse9'" <<<"$out" || { echo "$out"; fail "train_cnn: no clear error"; }
echo "ok: train_cnn with CHORUS_CPU_ISA=sse9: $(grep 'train_cnn: error' <<<"$out")"
