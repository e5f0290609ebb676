#!/usr/bin/env bash
# chorus-perf checks every collective on 3 ranks over shm and over tcp: exit 0, a CSV with the
# expected columns and rows, and 0 wrong elements on every row (in place too; send_recv in
# place is timed only and reports N/A); all-reduce with each forced --algo; every type and op;
# then once under mpirun, when it is installed.
# usage: test_perf.sh CHORUS_RUN CHORUS_PERF
set -u
chorus_run=$1 perf=$2
fail() { echo "FAIL: $*"; exit 1; }
sizes=(-b 8 -e 1M -f 8)   # 8, 64, 512, 4K, 32K, 256K
expected_rows=6

# check_csv LABEL CSV: the header names busbw and wrong columns; every row has 0 wrong.
check_csv() {
  local label=$1 csv=$2
  echo "$csv" | awk -F, -v label="$label" -v want="$expected_rows" '
    NR == 1 {
      for (i = 1; i <= NF; i++) col[$i] = i
      if (!("busbw_GBps" in col) || !("wrong" in col) || !("ip_wrong" in col)) {
        print "FAIL: " label ": CSV header lacks busbw_GBps/wrong/ip_wrong: " $0; bad = 1; exit
      }
      next
    }
    {
      rows++
      if ($col["wrong"] != "0") { print "FAIL: " label ": " $col["wrong"] " wrong out of place: " $0; bad = 1 }
      ip = $col["ip_wrong"]
      if (ip != "0" && !(label ~ /send_recv/ && ip == "N/A")) { print "FAIL: " label ": " ip " wrong in place: " $0; bad = 1 }
      if ($col["busbw_GBps"] !~ /^[0-9.]+$/) { print "FAIL: " label ": busbw not a number: " $0; bad = 1 }
    }
    END {
      if (!bad && rows != want) { print "FAIL: " label ": " rows " rows, expected " want; bad = 1 }
      exit bad
    }' || exit 1
}

for transport in shm tcp; do
  for coll in all_reduce broadcast reduce all_gather reduce_scatter send_recv gather scatter \
      all_to_all; do
    label="$coll/$transport"
    extra=()
    case $coll in broadcast|reduce|gather|scatter) extra=(--root 1) ;; esac
    csv=$(timeout 30 "$chorus_run" --no-prefix -n 3 "$perf" "${sizes[@]}" -c 1 --csv -n 5 -w 1 \
      --coll "$coll" --transport "$transport" "${extra[@]}" 2>/tmp/chorus-perf-test.$$.err)
    rc=$?
    echo "== $label (rc=$rc)"
    echo "$csv"
    [ $rc = 0 ] || { cat /tmp/chorus-perf-test.$$.err; rm -f /tmp/chorus-perf-test.$$.err; fail "$label: chorus-perf exited $rc"; }
    check_csv "$label" "$csv"
  done
done
rm -f /tmp/chorus-perf-test.$$.err

# Every forced all-reduce algorithm (CHORUS_ALGO through --algo), 3 ranks.
for algo in ring tree rd; do
  csv=$(timeout 30 "$chorus_run" --no-prefix -n 3 "$perf" "${sizes[@]}" -c 1 --csv -n 5 -w 1 --algo "$algo") ||
    { echo "$csv"; fail "all_reduce --algo $algo: chorus-perf failed"; }
  check_csv "all_reduce/algo=$algo" "$csv"
done
echo "ok: --algo ring, tree, rd"

# One sweep of every type and op, 2 ranks, small sizes: the reference for each (type, op).
csv=$(timeout 30 "$chorus_run" --no-prefix -n 2 "$perf" -b 4K -e 4K -c 1 --csv -n 2 -w 0 -d all -o all) ||
  { echo "$csv"; fail "all types and ops: chorus-perf failed"; }
expected_rows=50 check_csv "all_reduce/all types and ops" "$csv"
echo "ok: 10 types x 5 ops"

# --json: a file rank 0 writes, with one result per size and the quantiles.
json=$(mktemp /tmp/chorus-perf-test.XXXXXX.json)
timeout 30 "$chorus_run" --no-prefix -n 2 "$perf" "${sizes[@]}" -n 5 -w 1 --json "$json" >/dev/null ||
  { rm -f "$json"; fail "chorus-perf --json failed"; }
if command -v python3 >/dev/null; then
  python3 - "$json" "$expected_rows" <<'PY' || { rm -f "$json"; fail "bad JSON from chorus-perf --json"; }
import json, sys
j = json.load(open(sys.argv[1]))
rows = j["results"]
assert j["coll"] == "all_reduce" and j["nranks"] == 2 and j["wrong"] == 0, j
assert len(rows) == int(sys.argv[2]), len(rows)
for r in rows:
    for v in ("out_of_place", "in_place"):
        m = r[v]
        assert m["wrong"] == 0 and m["iters"] == 5, m
        assert 0 < m["min_us"] <= m["median_us"] <= m["max_us"], m
PY
  echo "ok: --json"
else
  grep -q '"busbw_GBps"' "$json" || { rm -f "$json"; fail "no busbw_GBps in the --json file"; }
fi
rm -f "$json"

if command -v mpirun >/dev/null; then
  mpi=(mpirun --bind-to none --oversubscribe -n 2)
  [ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
  csv=$(timeout 60 "${mpi[@]}" "$perf" "${sizes[@]}" -c 1 --csv -n 5 -w 1) ||
    { echo "$csv"; fail "chorus-perf under mpirun failed"; }
  check_csv "all_reduce/mpirun" "$csv"
  echo "ok: under mpirun"
else
  echo "note: mpirun not installed, mpirun run skipped"
fi
echo "ok: chorus-perf checked every collective on shm and tcp"
