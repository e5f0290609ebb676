#!/usr/bin/env bash
# Elastic training (issue 17 item 6): recovery time from a kill -9 to the next completed training
# step, by world size, and the final test accuracy against an uninterrupted run; the running
# ranks' pause when a restarted worker rejoins (--max-restarts 1); and the cost of --elastic
# without failures (images/s, medians).
#   bench/elastic.sh [BUILD] [REPEATS]     (Fashion-MNIST, one epoch, batch 32 per rank)
set -euo pipefail
build=${1:-build}
repeats=${2:-5}
run="$build/tools/chorus-run"
train="$build/examples/train_cnn"
args=(--epochs 1 --batch-size 32 --lr 0.01 --no-progress)
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
field() { grep -o "$1 [0-9.]*" | head -1 | awk '{print $NF}'; }
# A run's output -> seconds from the test hook's kill to the next completed step.
recovery() {
  local out kill_at done_at
  out=$(cat)
  kill_at=$(echo "$out" | grep -o "kills itself in step [0-9]* at [0-9.]*" | awk '{print $NF}')
  done_at=$(echo "$out" | grep -o "recovered: step [0-9]* completed at [0-9.]*" | awk '{print $NF}')
  awk -v a="$kill_at" -v b="$done_at" 'BEGIN {printf "%.4f", b - a}'
}

echo "== recovery: kill -9 of the last rank after step 200 (and inside step 200's gradient all-reduce)"
for w in 3 4; do
  for mode in after inside; do
    extra=(); [ $mode = inside ] && extra=(--fail-in-sync)
    rec=() acc=()
    for ((i = 0; i < repeats; ++i)); do
      out=$("$run" --elastic -n $w "$train" "${args[@]}" --fail-at-step 200 --fail-rank $((w - 1)) "${extra[@]}" 2>&1)
      rec+=("$(echo "$out" | recovery)")
      acc+=("$(echo "$out" | field "test acc")")
    done
    echo "W=$w, killed $mode step 200: kill -> next completed step $(printf '%s\n' "${rec[@]}" | median) s median (runs: ${rec[*]}); test acc ${acc[*]}"
  done
  plain=() elastic=() plain_acc=""
  for ((i = 0; i < repeats; ++i)); do
    out=$("$run" -n $w "$train" "${args[@]}" 2>&1)
    plain+=("$(echo "$out" | grep -o "[0-9]* images/s, test" | awk '{print $1}')")
    plain_acc=$(echo "$out" | field "test acc")
    out=$("$run" --elastic -n $w "$train" "${args[@]}" 2>&1)
    elastic+=("$(echo "$out" | grep -o "[0-9]* images/s, test" | awk '{print $1}')")
  done
  p=$(printf '%s\n' "${plain[@]}" | median) e=$(printf '%s\n' "${elastic[@]}" | median)
  echo "W=$w, no failure: uninterrupted test acc $plain_acc; images/s median plain $p, --elastic $e (ratio $(awk -v a="$e" -v b="$p" 'BEGIN {printf "%.3f", a / b}'))"
done

echo "== rank 0 killed after step 200, ranks launched as torchrun would (rank 0 hosts the store: the survivors move to a new one)"
# Starts W ranks of train_cnn --elastic by hand (RANK, WORLD_SIZE, MASTER_ADDR/PORT), all output
# in one stream.
env_launch() {
  local w=$1; shift
  local port=$((20000 + RANDOM % 20000)) secret
  secret=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  for ((r = 0; r < w; ++r)); do
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=$w LOCAL_WORLD_SIZE=$w MASTER_ADDR=127.0.0.1 \
      MASTER_PORT=$port CHORUS_JOB_SECRET=$secret "$train" --elastic "$@" 2>&1 &
  done
  wait || true
}
for w in 3 4; do
  rec=() acc=()
  for ((i = 0; i < repeats; ++i)); do
    out=$(env_launch $w "${args[@]}" --fail-at-step 200 --fail-rank 0)
    rec+=("$(echo "$out" | recovery)")
    acc+=("$(echo "$out" | field "test acc")")
  done
  echo "W=$w, rank 0 (the store's host) killed after step 200: kill -> next completed step $(printf '%s\n' "${rec[@]}" | median) s median (runs: ${rec[*]}); test acc ${acc[*]}"
done

echo "== rejoin: the last rank killed after step 100 and restarted (--max-restarts 1); it rejoins when ready"
for w in 3 4; do
  pause=() acc=() at=()
  for ((i = 0; i < repeats; ++i)); do
    out=$("$run" --elastic --max-restarts 1 -n $w "$train" "${args[@]}" --fail-at-step 100 --fail-rank $((w - 1)) --await-rejoin-at 400 2>&1)
    t0=$(echo "$out" | grep -o "worker(s) waiting before step [0-9]* at [0-9.]*" | awk '{print $NF}')
    at+=("$(echo "$out" | grep -o "worker(s) waiting before step [0-9]*" | awk '{print $NF}')")
    t1=$(echo "$out" | grep -o "recovered: step [0-9]* completed at [0-9.]*" | tail -1 | awk '{print $NF}')
    pause+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.4f", b - a}')")
    acc+=("$(echo "$out" | field "test acc")")
  done
  echo "W=$w: rank 0 sees the newcomer -> first step completed with it $(printf '%s\n' "${pause[@]}" | median) s median (runs: ${pause[*]}); joined before steps ${at[*]}; test acc ${acc[*]}"
done
