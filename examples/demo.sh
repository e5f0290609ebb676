#!/usr/bin/env bash
# make demo: the main job. Today: a 2-rank broadcast/barrier run over shared memory and then
# over TCP, launched by chorus-run, printing the link bandwidths.
set -euo pipefail
build=${1:-build}
run="$build/tools/chorus-run"
ex="$build/examples/bcast_barrier"
echo "== chorus demo: 2 ranks, shared memory (same host) =="
"$run" -n 2 "$ex"
echo
echo "== chorus demo: 2 ranks, TCP loopback (CHORUS_TRANSPORT=tcp) =="
CHORUS_TRANSPORT=tcp "$run" -n 2 "$ex"
