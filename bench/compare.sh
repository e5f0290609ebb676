#!/usr/bin/env bash
# bench/compare.sh: chorus all-reduce side by side with OpenMPI and Gloo on this machine, in one run.
# (Named compare.sh, not compare: a file called "compare" in bench/ would shadow C++20's <compare>
# header for every C++ target built from bench/, since meson puts that folder on the include path.)
# 2 ranks, float32 sum, 8 B .. 128 MiB. Peers (built from ../shared/peers/comm, as its run.sh
# builds them): MPI_Allreduce over shared memory (OpenMPI's default path) and over TCP loopback,
# Gloo ring / ring_chunked / halving-doubling over TCP loopback. chorus runs as chorus-perf under
# chorus-run over shm and over tcp. Every program reports the median over timed ops of the
# slowest rank's time per op, as a RESULT line in the peers' format (bench_common.h).
#
#   bench/compare.sh                    # ~3 min: table per size, ratios, CSV and PNG in bench/out/
#   bench/compare.sh --repeats 1        # one pass instead of 3 (passes interleave; medians of passes)
#   bench/compare.sh --contention       # beside one busy loop per core: 8 B latency, 1 MiB busbw
#   bench/compare.sh --summarize bench/out/compare-....txt   # tables again from a raw file
#   bench/compare.sh --deterministic --ranks 3   # also chorus with CHORUS_DETERMINISTIC=1
#   bench/compare.sh --mem-alloc        # also chorus-shm-R: chorus-perf -R (chorusMemAlloc buffers)
#
# Options: --repeats N (default 3), --ranks N (default 2), --deterministic (adds chorus-shm-det and
# chorus-tcp-det: the deterministic mode, with its ratios to chorus's default), --mem-alloc (adds
# chorus-shm-R: buffers from chorusMemAlloc, which peers map: one copy), --contention, --sizes LIST (bytes, comma-separated),
# --budget S (seconds of timed ops per program and size, default 0.25), --build DIR (default
# <repo>/build), --out DIR (default <repo>/bench/out), --peers DIR (the peers' sources),
# --summarize FILE. Needs a built tree (meson setup build && ninja -C build). Installs missing
# Debian packages (libgloo-dev, openmpi-bin, libopenmpi-dev, gnuplot-nox) when run as root;
# otherwise a peer whose package is missing is left out with a note.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$ROOT/build
OUT=$ROOT/bench/out
PEERS=${PEERS_DIR:-}
REPEATS=3
CONTENTION=0
SIZES=""
BUDGET=0.25
SUMMARIZE=""
PER_CMD_TIMEOUT=${PER_CMD_TIMEOUT:-300}
NRANKS=2
DETERMINISTIC=0
MEM_ALLOC=0

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}"; }
while (($#)); do
  case $1 in
    --repeats) REPEATS=${2:?--repeats needs a number}; shift ;;
    --contention) CONTENTION=1 ;;
    --deterministic) DETERMINISTIC=1 ;;
    --mem-alloc) MEM_ALLOC=1 ;;
    --ranks) NRANKS=${2:?--ranks needs a number}; shift ;;
    --sizes) SIZES=${2:?--sizes needs a list}; shift ;;
    --budget) BUDGET=${2:?--budget needs seconds}; shift ;;
    --build) BUILD=$(cd "${2:?}" && pwd) || exit 2; shift ;;
    --out) OUT=${2:?}; shift ;;
    --peers) PEERS=${2:?}; shift ;;
    --summarize) SUMMARIZE=${2:?--summarize needs a file}; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "compare: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ $REPEATS =~ ^[1-9][0-9]*$ ]] || { echo "compare: --repeats wants a positive integer" >&2; exit 2; }
[[ $NRANKS =~ ^[2-8]$ ]] || { echo "compare: --ranks wants 2..8" >&2; exit 2; }
if [ -z "$SIZES" ]; then
  if [ "$CONTENTION" = 1 ]; then SIZES=8,1048576; else SIZES=8,1024,65536,1048576,16777216,134217728; fi
fi

# ---------------------------------------------------------------- summary (from RESULT lines)

# summarize RAW CSV: per size, each peer's median over passes of its per-pass median time and
# the busbw from it; the chorus/peer ratios; the CSV of every (peer, size).
summarize() {
  local raw=$1 csv=$2
  awk -v csv="$csv" '
  function kv(line, key,   re) {
    re = " " key "=[^ ]*"
    if (match(" " line, re)) return substr(" " line, RSTART + length(key) + 2, RLENGTH - length(key) - 2)
    return ""
  }
  function label(b) {
    if (b >= 1048576) return (b / 1048576) " MiB"
    if (b >= 1024) return (b / 1024) " KiB"
    return b " B"
  }
  function median(arr, n,   i, j, t, tmp) {
    for (i = 1; i <= n; i++) tmp[i] = arr[i]
    for (i = 2; i <= n; i++) { t = tmp[i]; j = i - 1; while (j > 0 && tmp[j] > t) { tmp[j + 1] = tmp[j]; j-- } tmp[j + 1] = t }
    if (n % 2) return tmp[(n + 1) / 2]
    return (tmp[n / 2] + tmp[n / 2 + 1]) / 2
  }
  function ratio(a, b) { return (a in bw && b in bw && bw[b] > 0) ? sprintf("%.2f", bw[a] / bw[b]) : "n/a" }
  /^# mode=/ { mode = kv($0, "mode") }
  /^RESULT / {
    p = kv($0, "peer"); b = kv($0, "bytes") + 0; n = kv($0, "ranks") + 0
    if (!(p in seenp)) { seenp[p] = 1; peers[++np] = p }
    if (!(b in seenb)) { seenb[b] = 1; sizes[++ns] = b }
    c = ++cnt[p, b]; t[p, b, c] = kv($0, "median_us") + 0; ranks[p] = n
  }
  END {
    if (np == 0) { print "no RESULT lines to summarize"; exit 1 }
    for (i = 2; i <= ns; i++) { x = sizes[i]; j = i - 1; while (j > 0 && sizes[j] > x) { sizes[j + 1] = sizes[j]; j-- } sizes[j + 1] = x }
    print "mode,peer,ranks,bytes,passes,median_us,pass_min_us,pass_max_us,algbw_GBps,busbw_GBps" > csv
    printf "\nmedian over passes of each pass'"'"'s median time per op (slowest rank); busbw = size/time * 2(n-1)/n, GB = 1e9 B\n"
    printf "ratio = chorus busbw / peer busbw (= peer time / chorus time): above 1, chorus is faster\n"
    for (k = 1; k <= ns; k++) {
      b = sizes[k]
      delete bw
      printf "\n%s\n  %-22s %5s %12s %23s %11s\n", label(b), "peer", "runs", "time_us", "pass spread (min..max)", "busbw GB/s"
      for (i = 1; i <= np; i++) {
        p = peers[i]; n = cnt[p, b]
        if (n == 0) continue
        lo = hi = t[p, b, 1]
        for (j = 1; j <= n; j++) { v[j] = t[p, b, j]; if (v[j] < lo) lo = v[j]; if (v[j] > hi) hi = v[j] }
        m = median(v, n); r = ranks[p]
        alg = (m > 0) ? b / m / 1e3 : 0
        bw[p] = alg * 2 * (r - 1) / r
        printf "  %-22s %5d %12.2f %11.2f..%-11.2f %11.4f\n", p, n, m, lo, hi, bw[p]
        printf "%s,%s,%d,%d,%d,%.3f,%.3f,%.3f,%.6f,%.6f\n", mode, p, r, b, n, m, lo, hi, alg, bw[p] > csv
      }
      sfx = (mode == "contention") ? "+hog" : ""
      best = ""
      for (i = 1; i <= np; i++) {
        p = peers[i]
        if (p ~ /^gloo-/ && (p in bw) && (best == "" || bw[p] > bw[best])) best = p
      }
      printf "  ratios: chorus-shm/mpi-shm %s   chorus-tcp/mpi-tcp %s   chorus-tcp/best gloo (%s) %s", \
        ratio("chorus-shm" sfx, "mpi-shm" sfx), ratio("chorus-tcp" sfx, "mpi-tcp" sfx), \
        (best == "" ? "none" : best), (best == "" ? "n/a" : ratio("chorus-tcp" sfx, best))
      if (sfx != "") printf "   chorus-shm/mpi-shm-yield %s", ratio("chorus-shm" sfx, "mpi-shm-yield" sfx)
      printf "\n"
      if (("chorus-shm-R" sfx) in bw)
        printf "  chorusMemAlloc buffers: shm-R/shm %s   shm-R/mpi-shm %s\n", \
          ratio("chorus-shm-R" sfx, "chorus-shm" sfx), ratio("chorus-shm-R" sfx, "mpi-shm" sfx)
      if (("chorus-shm-det" sfx) in bw || ("chorus-tcp-det" sfx) in bw)
        printf "  deterministic: shm-det/shm %s   tcp-det/tcp %s   shm-det/mpi-shm %s   tcp-det/mpi-tcp %s   tcp-det/best gloo %s\n", \
          ratio("chorus-shm-det" sfx, "chorus-shm" sfx), ratio("chorus-tcp-det" sfx, "chorus-tcp" sfx), \
          ratio("chorus-shm-det" sfx, "mpi-shm" sfx), ratio("chorus-tcp-det" sfx, "mpi-tcp" sfx), \
          (best == "" ? "n/a" : ratio("chorus-tcp-det" sfx, best))
    }
  }' "$raw"
}

# plot CSV PNG: busbw against size, log-log, one line per peer.
plot() {
  local csv=$1 png=$2 data
  command -v gnuplot >/dev/null || { echo "note: gnuplot not installed; no plot (apt-get install gnuplot-nox)"; return 0; }
  data=$(mktemp)
  # One gnuplot data block per peer (blocks separated by two blank lines), title first.
  awk -F, 'NR > 1 && $10 > 0 { if (!($2 in seen)) { seen[$2] = 1; order[++n] = $2 } rows[$2] = rows[$2] $4 " " $10 "\n" }
    END { for (i = 1; i <= n; i++) { printf "\"%s\"\n%s\n\n", order[i], rows[order[i]] } }' "$csv" >"$data"
  local blocks
  blocks=$(grep -c '^"' "$data")
  if [ "$blocks" = 0 ]; then rm -f "$data"; echo "note: nothing to plot"; return 0; fi
  gnuplot <<EOF 2>&1 | grep -v '^$' || true
set terminal pngcairo size 1000,650 noenhanced font ",10"
set output "$png"
set title "all-reduce float32 sum, $NRANKS ranks: bus bandwidth (median time per op), $(hostname), $(date -u +%Y-%m-%d)"
set logscale xy
set xlabel "size (bytes)"
set ylabel "busbw (GB/s)"
set format x "%.0s%cB"
set format y "%g"
set grid
set key outside right
plot for [i=0:$((blocks - 1))] "$data" index i using 1:2 with linespoints title columnheader(1)
EOF
  rm -f "$data"
  [ -s "$png" ] && echo "plot: $png"
}

if [ -n "$SUMMARIZE" ]; then
  [ -r "$SUMMARIZE" ] || { echo "compare: cannot read $SUMMARIZE" >&2; exit 2; }
  csv=${SUMMARIZE%.txt}.csv
  summarize "$SUMMARIZE" "$csv" && echo && echo "csv: $csv" && plot "$csv" "${SUMMARIZE%.txt}.png"
  exit
fi

# ---------------------------------------------------------------- 1. what we run

CHORUS_RUN=$BUILD/tools/chorus-run
CHORUS_PERF=$BUILD/bench/chorus-perf
for f in "$CHORUS_RUN" "$CHORUS_PERF"; do
  [ -x "$f" ] || { echo "compare: $f missing; build first: meson setup build && ninja -C build" >&2; exit 2; }
done
if [ -z "$PEERS" ]; then
  for d in "$ROOT/../shared/peers/comm" /work/shared/peers/comm; do
    [ -r "$d/bench_common.h" ] && { PEERS=$(cd "$d" && pwd); break; }
  done
fi
[ -n "$PEERS" ] && [ -r "$PEERS/bench_common.h" ] ||
  { echo "compare: peers' sources not found (../shared/peers/comm); pass --peers DIR" >&2; exit 2; }

need=()
for p in openmpi-bin libopenmpi-dev libgloo-dev gnuplot-nox g++; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if ((${#need[@]})); then
  if [ "$(id -u)" = 0 ]; then
    echo ">> installing: ${need[*]}" >&2
    apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 "${need[@]}" >/dev/null ||
      echo "!! could not install ${need[*]}; those peers are left out" >&2
  else
    echo "!! not root: missing packages ${need[*]} stay missing; those peers are left out" >&2
  fi
fi

# ---------------------------------------------------------------- 2. build the peers

PEER_BIN=$BUILD/peers
mkdir -p "$PEER_BIN"
CXXFLAGS=(-O3 -march=native -std=c++17 -Wall)   # as ../shared/peers/comm/run.sh
# build_peer OUT SRC COMPILER LIBS...: rebuild when the source or bench_common.h is newer.
build_peer() {
  local out=$1 src=$2 cxx=$3
  shift 3
  if [ -x "$out" ] && [ "$out" -nt "$src" ] && [ "$out" -nt "$PEERS/bench_common.h" ]; then return 0; fi
  command -v "$cxx" >/dev/null || { echo "!! $cxx not found: $(basename "$out") left out" >&2; return 1; }
  echo ">> building $(basename "$out")" >&2
  "$cxx" "${CXXFLAGS[@]}" -o "$out" "$src" "$@" || { echo "!! building $(basename "$out") failed: left out" >&2; rm -f "$out"; return 1; }
}
HAVE_MPI=0 HAVE_GLOO=0
build_peer "$PEER_BIN/mpi_allreduce" "$PEERS/mpi_allreduce.cc" mpicxx && command -v mpirun >/dev/null && HAVE_MPI=1
build_peer "$PEER_BIN/gloo_allreduce" "$PEERS/gloo_allreduce.cc" g++ -lgloo -pthread && HAVE_GLOO=1

# ---------------------------------------------------------------- 3. run, interleaved

MPIRUN=(mpirun --bind-to none)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
((NRANKS > $(nproc))) && MPIRUN+=(--oversubscribe)  # more ranks than cores: mpirun refuses otherwise
MPI_TCP=(--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo)
export BENCH_SIZES=$SIZES BENCH_TIME_BUDGET=$BUDGET
NCPU=$(nproc)
NHOGS=${HOGS:-$NCPU}  # --contention: busy loops to start (HOGS=1: run.sh's single hog)
STAMP=$(date -u +%Y-%m-%dT%H%M%SZ)
mkdir -p "$OUT"
RAW=$OUT/compare-$STAMP.txt CSV=$OUT/compare-$STAMP.csv PNG=$OUT/compare-$STAMP.png
MODE=$([ "$CONTENTION" = 1 ] && echo contention || echo plain)
SFX=$([ "$CONTENTION" = 1 ] && echo +hog || echo "")
T0=$(date +%s)
{
  echo "# bench/compare.sh started $(date -u +%Y-%m-%dT%H:%M:%SZ) host=$(hostname) cpus=$NCPU load=\"$(cut -d' ' -f1-3 /proc/loadavg)\""
  echo "# mode=$MODE repeats=$REPEATS sizes=$SIZES budget_s=$BUDGET ranks=$NRANKS chorus=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)"
  echo "# cpu: $(lscpu | sed -n 's/^Model name: *//p'); kernel $(uname -r)"
  dpkg-query -W -f='# pkg ${Package} ${Version}\n' openmpi-bin libgloo-dev 2>/dev/null
} | tee "$RAW"

# chorus-perf's warm-up per size: enough ops that --time-budget can judge the time per op.
chorus_warmup() {
  local b=$1
  if ((b <= 65536)); then echo 200; elif ((b <= 1048576)); then echo 20; elif ((b <= 16777216)); then echo 3; else echo 2; fi
}
run_chorus() {  # run_chorus TRANSPORT LABEL [FLAG]: one chorus-perf per size (sizes are not geometric)
  local transport=$1 label=$2 flag=${3:-} b rc=0
  for b in ${SIZES//,/ }; do
    timeout "$PER_CMD_TIMEOUT" "$CHORUS_RUN" --no-prefix -n "$NRANKS" "$CHORUS_PERF" -b "$b" -e "$b" -d float -o sum -c 1 \
      --transport "$transport" -n 20000 -w "$(chorus_warmup "$b")" --time-budget "$BUDGET" \
      --result-label "$label" $flag || rc=$?
  done
  return $rc
}

HOGS=()
start_hogs() {
  local i
  for ((i = 0; i < NHOGS; i++)); do
    bash -c 'while :; do :; done' &
    HOGS+=($!)
  done
}
stop_hogs() {
  local pid
  for pid in "${HOGS[@]}"; do kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
  HOGS=()
}
trap 'stop_hogs' EXIT
trap 'stop_hogs; exit 130' INT TERM

# step PASS LABEL CMD...: run with a timeout (and the hogs in --contention), keep RESULT lines.
step() {
  local pass=$1 label=$2 rc=0 tmp t1
  shift 2
  tmp=$(mktemp)
  t1=$(date +%s.%N)
  [ "$CONTENTION" = 1 ] && start_hogs
  if declare -F "$1" >/dev/null; then  # run_chorus puts the timeout on each of its launches
    BENCH_LABEL_SUFFIX=$SFX "$@" >"$tmp" 2>&1 || rc=$?
  else
    BENCH_LABEL_SUFFIX=$SFX timeout "$PER_CMD_TIMEOUT" "$@" >"$tmp" 2>&1 || rc=$?
  fi
  [ "$CONTENTION" = 1 ] && stop_hogs
  {
    echo "## pass=$pass step=$label rc=$rc secs=$(awk -v a="$t1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') load=\"$(cut -d' ' -f1-3 /proc/loadavg)\""
    grep -E '^(RESULT|SKIP) ' "$tmp" | sed "s/^RESULT /RESULT pass=$pass /"
  } >>"$RAW"
  if [ $rc != 0 ]; then
    echo "!! pass $pass: $label failed (rc=$rc); its last lines:" >&2
    tail -5 "$tmp" >&2
  fi
  echo ">> pass $pass: $label done (rc=$rc, $(grep -c '^RESULT ' "$tmp") results)" >&2
  rm -f "$tmp"
}

for pass in $(seq 1 "$REPEATS"); do
  step "$pass" chorus-shm run_chorus shm "chorus-shm$SFX"
  [ $DETERMINISTIC = 1 ] && step "$pass" chorus-shm-det run_chorus shm "chorus-shm-det$SFX" --deterministic
  [ $MEM_ALLOC = 1 ] && step "$pass" chorus-shm-R run_chorus shm "chorus-shm-R$SFX" -R
  [ $HAVE_MPI = 1 ] && step "$pass" mpi-shm "${MPIRUN[@]}" -np "$NRANKS" "$PEER_BIN/mpi_allreduce" mpi-shm
  if [ $HAVE_MPI = 1 ] && [ "$CONTENTION" = 1 ]; then  # the spin-then-yield variant, fairer under load
    step "$pass" mpi-shm-yield "${MPIRUN[@]}" --mca mpi_yield_when_idle 1 -np "$NRANKS" "$PEER_BIN/mpi_allreduce" mpi-shm-yield
  fi
  step "$pass" chorus-tcp run_chorus tcp "chorus-tcp$SFX"
  [ $DETERMINISTIC = 1 ] && step "$pass" chorus-tcp-det run_chorus tcp "chorus-tcp-det$SFX" --deterministic
  [ $HAVE_MPI = 1 ] && step "$pass" mpi-tcp "${MPIRUN[@]}" "${MPI_TCP[@]}" -np "$NRANKS" "$PEER_BIN/mpi_allreduce" mpi-tcp
  [ $HAVE_GLOO = 1 ] && step "$pass" gloo "$PEER_BIN/gloo_allreduce" "$NRANKS" ring,ring_chunked,hd
done

{
  summarize "$RAW" "$CSV"
  echo
  echo "# total runtime of bench/compare.sh: $(($(date +%s) - T0)) s; load now \"$(cut -d' ' -f1-3 /proc/loadavg)\""
} | tee -a "$RAW"
echo "raw: $RAW"
echo "csv: $CSV"
plot "$CSV" "$PNG"
