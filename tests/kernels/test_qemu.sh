#!/usr/bin/env bash
# The library on a CPU without AVX-512. qemu-x86_64 -cpu max (user mode) emulates an x86-64 CPU
# with AVX2 and F16C but no AVX-512. Under it:
#   1. the kernel tests pass (reductions of all ten types, the training kernels, training steps)
#      and report that the avx2 build was chosen;
#   2. a 2-rank all-reduce of all ten types and five ops (chorus-perf, which checks every
#      element) passes, and each rank logs that it runs the avx2 build;
#   3. CHORUS_CPU_ISA=avx512 is refused at communicator creation with a message saying why.
#   test_qemu.sh TEST_REDUCE TEST_KERNELS TEST_TRAIN_ISA CHORUS_RUN CHORUS_PERF
set -uo pipefail
test_reduce=$1 test_kernels=$2 test_train_isa=$3 chorus_run=$4 perf=$5
fail() {
  echo "FAIL: $*"
  exit 1
}
if [ "$(uname -m)" != x86_64 ]; then
  echo "skip: the host is $(uname -m), not x86-64"
  exit 77
fi
if ! command -v qemu-x86_64 >/dev/null; then
  echo "skip: qemu-x86_64 not found (Debian package qemu-user)"
  exit 77
fi
q=(qemu-x86_64 -cpu max)
start=$(date +%s)

out=$(timeout 240 "${q[@]}" "$test_reduce" 2>&1)
rc=$?
echo "$out" | tail -n 3
[ $rc -eq 0 ] || { echo "$out" | tail -n 40; fail "test_reduce under qemu exited $rc"; }
grep -q '^kernels: active build avx2, best build avx2, this cpu runs scalar, avx2$' <<<"$out" ||
  fail "test_reduce under qemu -cpu max did not choose the avx2 build"
for t in "$test_kernels" "$test_train_isa"; do
  out=$(timeout 240 "${q[@]}" "$t" 2>&1)
  rc=$?
  echo "$out" | tail -n 2
  [ $rc -eq 0 ] || { echo "$out" | tail -n 40; fail "$(basename "$t") under qemu exited $rc"; }
done
echo "ok: kernel tests under qemu -cpu max, avx2 build"

out=$(CHORUS_DEBUG=INFO CHORUS_TIMEOUT=60 timeout 240 "$chorus_run" --no-prefix -n 2 "${q[@]}" "$perf" \
  -b 256 -e 4K -f 16 -d all -o all -c 1 -n 1 -w 0 --csv 2>&1)
rc=$?
[ $rc -eq 0 ] || { echo "$out" | tail -n 40; fail "2-rank chorus-perf under qemu exited $rc"; }
n_avx2=$(grep -c 'kernels: avx2 build (this cpu runs scalar, avx2)' <<<"$out")
[ "$n_avx2" -eq 2 ] || { echo "$out" | grep kernels; fail "expected both ranks on the avx2 build, saw $n_avx2"; }
rows=$(grep -cE '^[0-9]+,[0-9]+,[a-z0-9]+,(sum|prod|min|max|avg),' <<<"$out")
[ "$rows" -ge 100 ] || { echo "$out" | tail -n 20; fail "expected 2 sizes x 10 types x 5 ops rows, got $rows"; }
echo "ok: 2-rank all-reduce, 10 types x 5 ops, every element checked, avx2 build on both ranks"

out=$(CHORUS_CPU_ISA=avx512 CHORUS_TIMEOUT=30 timeout 120 "$chorus_run" --no-prefix -n 2 "${q[@]}" "$perf" \
  -b 256 -e 256 -n 1 -w 0 2>&1)
rc=$?
[ $rc -ne 0 ] || fail "CHORUS_CPU_ISA=avx512 on a cpu without avx-512 was accepted"
grep -q 'CHORUS_CPU_ISA=avx512: this cpu cannot run the avx512 kernels (it runs scalar, avx2)' <<<"$out" ||
  { echo "$out" | tail -n 20; fail "no clear error for CHORUS_CPU_ISA=avx512"; }
echo "ok: CHORUS_CPU_ISA=avx512 refused: $(grep -o 'CHORUS_CPU_ISA=avx512: [^;]*' <<<"$out" | head -n 1)"
echo "qemu checks took $(($(date +%s) - start)) s"
