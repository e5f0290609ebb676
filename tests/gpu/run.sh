#!/usr/bin/env bash
# The whole GPU check in one call, for a lent GPU machine (see tests/gpu/README.md):
#   1. the platform measurements (bench/gpu-platform: copy rates, the reduction kernel against
#      them, cross-process hand-off latency between two processes on device 0);
#   2. the [cuda] tests (every type x op x length x alignment of the device kernels);
#   3. compute-sanitizer memcheck, racecheck and synccheck on the [cuda] tests (quick cases),
#      and memcheck on every rank of a 3-rank device all-reduce;
#   4. the library's view of the GPU: two ranks made to share device 0 are refused naming the
#      GPU, and allowed with CHORUS_ALLOW_SHARED_GPU=1;
#   5. chorusAllReduce on device buffers over CUDA IPC, 2 and 3 ranks sharing device 0: every
#      type x op x count x in/out of place x offset, stream order, errors, bandwidth; the other
#      collectives, send/recv in a group and the barrier with a stream; the same (quick) and a
#      kill -9 on the staged path, each rank on a host of its own;
#   6. chorus-perf --device cuda, 2 ranks on device 0: every collective from 8 B to 256 MiB,
#      checked, with the efficiency column (all-reduce also on 3 ranks); NCCL's all-reduce beside
#      it (nccl-perf, where the nvidia-nccl wheel is; a launch's latency where NCCL refuses);
#   7. training on the GPU: every CNN operator forward and backward against the cpu, steps of the
#      net on both (test_cuda_ops); the step's time op by op (op-times); train_cnn --device cuda
#      on 1 rank (also with TF32, and with the step as a CUDA graph), and DDP on 2 ranks sharing
#      the GPU (also with CUDA graphs), on synthetic CIFAR-shaped data; a kill -9
#      and restart from a snapshot ending bit for bit as an uninterrupted run (test_restart); the
#      model-parallel example split cpu + cuda and cuda + cuda; then images/s against PyTorch
#      eager on the same GPU, synthetic and Fashion-MNIST, and the test accuracy of each after 3
#      epochs (bench/gpu/train_compare.py, batch 64 and 256).
# Each step has a limit that keeps the whole run inside a 15-minute device lease.
# Every step's log goes into one file, $OUT/suite.log (or ./gpu-logs/suite.log: the device tool
# brings back 8 files at most); the last line is "gpu suite: N passed, N failed".
#   tests/gpu/run.sh [BUNDLE [all|comm|train|bench|mps|quick|torch]]   (default: build-gpu, made here by tests/gpu/pack.sh; unpacked
#                                   from BUNDLE.tar.xz when only that was carried)
set -u
bundle=${1:-build-gpu}
part=${2:-all}  # all | comm (steps 1-6) | train (step 7 but the bench) | bench (7's PyTorch comparison): each fits a 10-minute call | mps (8) | quick (9: about 5 minutes) | torch (10: chorus_torch on torch 2.x, ~3 minutes)
want() { [ "$part" = all ] || [ "$part" = "$1" ]; }
if [ ! -d "$bundle" ] && [ -f "$bundle.tar.xz" ]; then tar -xJf "$bundle.tar.xz"; fi
bin=$bundle/bin
out=${OUT:-gpu-logs}
logs=$(mktemp -d)
mkdir -p "$out"
: > "$out/suite.log"
export LD_LIBRARY_PATH="$PWD/$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
passed=0 failed=0
step() {  # name, timeout seconds, command...
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$logs/$name.log" 2>&1
  local rc=$?
  local took=$((SECONDS - t0))
  { echo "=== $name (rc $rc, ${took} s): $*"; cat "$logs/$name.log"; } >> "$out/suite.log"
  if [ $rc = 0 ]; then passed=$((passed + 1)); echo "ok   $name (${took} s)"
  elif [ $rc = 77 ]; then echo "skip $name: $(tail -1 "$logs/$name.log")"
  else failed=$((failed + 1)); echo "FAIL $name (rc $rc, ${took} s): tail of its log"; tail -15 "$logs/$name.log"; fi
}
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv; } \
  > "$logs/device.log" 2>&1 || true
cat "$logs/device.log" | tee -a "$out/suite.log"
perf() {  # name, ranks, collective [, VAR=value for the run]
  step "perf_$1" 90 env CHORUS_ALLOW_SHARED_GPU=1 ${4:-} "$bin/chorus-run" -n "$2" "$bin/chorus-perf" \
    --device cuda --coll "$3" -b 8 -e 256M -f 8 -n 10 -w 3
  grep -h "^\[0\] *[0-9]\|copy traffic" "$logs/perf_$1.log" 2>/dev/null
}
train() {  # name, ranks, batch [, VAR=value for the run]
  step "train_$1" 120 env CHORUS_ALLOW_SHARED_GPU=1 ${4:-} "$bin/chorus-run" -n "$2" "$bin/train_cnn" \
    --device cuda:0 --data synthetic --synthetic-size 8192 --synthetic-shape 3x32x32 --epochs 1 \
    --batch-size "$3" --log-every 16 --no-progress
  grep -h "images/s\|accuracy\|error" "$logs/train_$1.log" 2>/dev/null | tail -4
}
# With 2 ranks: DDP, forward+backward and the update as two graphs, the all-reduces between.
train_graph() {  # name, ranks, batch
  step "train_$1" 120 env CHORUS_ALLOW_SHARED_GPU=1 "$bin/chorus-run" -n "$2" "$bin/train_cnn" \
    --device cuda:0 --cuda-graph --data synthetic --synthetic-size 8192 \
    --synthetic-shape 3x32x32 --epochs 2 --batch-size "$3" --log-every 16 --no-progress
  grep -h "images/s\|accuracy\|error" "$logs/train_$1.log" 2>/dev/null | tail -4
}
# Where a call's GPU time goes, stage by stage (CHORUS_DEVICE_TIMING: a timing event after each
# signal, wait and kernel; printed at destroy), 1 MiB, 2 ranks. The medians' lines say which wait
# holds the time.
timing() {  # collective [size, default 1M]
  local size=${2:-1M}
  step "timing_$1_$size" 60 env CHORUS_ALLOW_SHARED_GPU=1 CHORUS_DEVICE_TIMING=40 \
    "$bin/chorus-run" -n 2 "$bin/chorus-perf" --device cuda --coll "$1" -b "$size" -e "$size" -n 10 -w 3
  grep -h "median of" "$logs/timing_$1_$size.log" 2>/dev/null
}
# kill -9 of rank 1 of 3 mid-call (CHORUS_TEST_DEVICE_DIE): the survivors' streams end and they
# name it within 5 s ("ok" from each of the two; chorus-run --elastic keeps them running when
# rank 1 dies).
# device_kill staged: the same on the staged path (each rank on a host of its own).
# device_kill 1conn: CUDA IPC with one hardware queue for every stream: the survivors' waits on
# their own flag words, in host memory since the thirtieth session (collectives/device_words.h),
# are released by a store of the host's, which no queue holds back.
# device_kill 1conn_devwords: the same with the words in device memory (CHORUS_IPC_WORDS=device,
# the design before), released by a write on the release stream -- GPU work that a shared queue
# may hold behind those very waits: for comparison, it may hang (then it fails).
device_kill() {
  local name=device_kill env=
  if [ "${1:-}" = staged ]; then name=device_kill_staged env=CHORUS_PROBE_STAGED=1; fi
  if [ "${1:-}" = 1conn ]; then name=device_kill_1conn env=CUDA_DEVICE_MAX_CONNECTIONS=1; fi
  if [ "${1:-}" = 1conn_devwords ]; then
    name=device_kill_1conn_devwords env="CUDA_DEVICE_MAX_CONNECTIONS=1 CHORUS_IPC_WORDS=device"
  fi
  step $name 60 bash -c "env CHORUS_ALLOW_SHARED_GPU=1 CHORUS_TEST_DEVICE_DIE=1 $env \
    '$bin/chorus-run' -n 3 --elastic '$bin/device_allreduce_probe' --die-worker; \
    ! grep -q FAIL '$logs/$name.log' && [ \$(grep -c '] ok\$' '$logs/$name.log') = 2 ]"
}
# The staged path (device calls across hosts: the host collective on the progress thread, the
# stream waiting on a flag word; new 2026-11-27, thirteenth session) forced on this machine by a
# host per rank: the probe's quick matrix, every other call and the stream-order test, 3 ranks.
device_staged() {
  step device_staged 120 env CHORUS_PROBE_STAGED=1 CHORUS_CUDA_TEST_QUICK=1 \
    "$bin/device_allreduce_probe" "$bin/chorus-run" 3
  step device_staged_1conn 120 env CHORUS_PROBE_STAGED=1 CHORUS_CUDA_TEST_QUICK=1 \
    CUDA_DEVICE_MAX_CONNECTIONS=1 "$bin/device_allreduce_probe" "$bin/chorus-run" 3
  # The stage words in device memory, written on the release stream (the design before the
  # seventeenth session), for comparison: with one hardware queue it may hang (then it fails).
  if [ "$part" != quick ]; then
    step device_staged_devwords_1conn 90 env CHORUS_PROBE_STAGED=1 CHORUS_CUDA_TEST_QUICK=1 \
      CHORUS_STAGE_WORDS=device CUDA_DEVICE_MAX_CONNECTIONS=1 "$bin/device_allreduce_probe" \
      "$bin/chorus-run" 3
  fi
  grep -h "cases in\|FAIL" "$logs/device_staged.log" 2>/dev/null | head -5
  device_kill staged
}
if want comm; then
step platform 150 "$bin/gpu-platform"
grep -h "^RESULT\|us per round trip\|MiB:" "$logs/platform.log" 2>/dev/null
step cuda_reduce 120 "$bin/test_cuda_reduce"
step cuda_release 30 "$bin/test_cuda_release"  # the release while a cudaMemcpy waits behind it
# The same with one hardware queue for every stream (Megatron's setting): the release's stream
# must not sit behind the wait it ends (device_staged below runs the staged path so too).
step cuda_release_1conn 30 env CUDA_DEVICE_MAX_CONNECTIONS=1 "$bin/test_cuda_release"
step shared_gpu 60 "$bin/shared_gpu_probe" "$bin/chorus-run"
step device_allreduce 180 "$bin/device_allreduce_probe" "$bin/chorus-run" 2 3
grep -h "cases in\|^\[0\] *[0-9].* [0-9.]*$\|copy engine\|freed\|destroyed" "$logs/device_allreduce.log" 2>/dev/null
device_kill
device_kill 1conn
device_kill 1conn_devwords
device_staged
perf allreduce_p2 2 all_reduce
perf allreduce_p3 3 all_reduce
# The flag words in device memory (the design before the thirtieth session): what host words cost
# or save, 8 B to 256 MiB, side by side with the two lines above.
perf allreduce_p2_devwords 2 all_reduce CHORUS_IPC_WORDS=device
for coll in broadcast reduce all_gather reduce_scatter send_recv gather scatter all_to_all; do
  perf "${coll}_p2" 2 "$coll"
done
perf all_to_all_p3 3 all_to_all
# send/recv (~10 ms a call on the H200) against the all-reduce (~20 us), stage by stage.
timing send_recv
timing all_reduce
timing all_reduce 64M  # issue 19's bar starts at 64 MiB: where its time goes
# NCCL beside it (bench/gpu/nccl_perf.cu), from the nvidia-nccl wheel when python has one.
nccl_lib=$(python3 -c 'import sys, os
for d in sys.path:
    p = os.path.join(d, "nvidia", "nccl", "lib", "libnccl.so.2")
    if os.path.exists(p): print(p); break' 2>/dev/null)
for n in 2 3; do
  step "nccl_p$n" 90 env NCCL_LIB="${nccl_lib:-libnccl.so.2}" CHORUS_ALLOW_SHARED_GPU=1 \
    NCCL_MULTI_RANK_GPU_ENABLE=1 "$bin/chorus-run" -n "$n" "$bin/nccl-perf" -b 8 -e 256M -f 8 -n 10
  grep -h "^\[0\]" "$logs/nccl_p$n.log" 2>/dev/null
done
fi
if want train; then
step cuda_ops 120 "$bin/test_cuda_ops"
# DDP against one process at batch W*B on the GPU, step by step, W = 2 and 3 ranks sharing it,
# with and without no_sync (tests/ddp/test_equivalence.cc, its [device] case).
step ddp_equivalence 150 env CHORUS_TEST_TRAIN_DEVICE=cuda:0 "$bin/test_equivalence" '[device]'
# DDP with the step as CUDA graphs against eager DDP, bit for bit, 2 ranks sharing the GPU
# (tests/ddp/test_step_graph.cc).
step ddp_graph 120 env CHORUS_TEST_TRAIN_DEVICE=cuda:0 "$bin/test_step_graph" 'DDP with cuda_graph*'
# Elastic DDP on the GPU, 3 ranks sharing it: a rank killed after a step's backward, and one
# killed inside a device all-reduce while its peers' streams wait for it; the survivors must end
# with the parameters of a run it left on purpose, bit for bit (tests/ddp/test_elastic_device.cc);
# then train_cnn --elastic under chorus-run with a rank killed mid-epoch.
step elastic_device 150 env CHORUS_TEST_TRAIN_DEVICE=cuda:0 "$bin/test_elastic_device" '[killed]'
step train_elastic 120 bash -c "env CHORUS_ALLOW_SHARED_GPU=1 '$bin/chorus-run' -n 3 --elastic \
  '$bin/train_cnn' --device cuda:0 --data synthetic --synthetic-size 6144 --synthetic-shape 3x32x32 \
  --epochs 1 --batch-size 32 --log-every 16 --no-progress --fail-at-step 20 --fail-rank 2 \
  && grep -q 'continuing with 2 ranks' '$logs/train_elastic.log'"
grep -h "died at step\|continuing" "$logs/train_elastic.log" 2>/dev/null | head -3
# The same kill with --max-restarts 1: chorus-run restarts rank 2, which rejoins on the GPU before
# step 30 (chorusCommGrow; a new communicator with device state of its own) and training goes on
# with 3 ranks.
step train_rejoin 150 bash -c "env CHORUS_ALLOW_SHARED_GPU=1 '$bin/chorus-run' -n 3 --elastic \
  --max-restarts 1 '$bin/train_cnn' --device cuda:0 --data synthetic --synthetic-size 6144 \
  --synthetic-shape 3x32x32 --epochs 1 --batch-size 32 --log-every 16 --no-progress \
  --fail-at-step 20 --fail-rank 2 --await-rejoin-at 30 \
  && grep -q 'rank 2 rejoined at step 29; continuing with 3 ranks' '$logs/train_rejoin.log'"
grep -h "died at step\|rejoined\|continuing" "$logs/train_rejoin.log" 2>/dev/null | head -3
# Where a step's time goes, op by op, batch 64 and 256 (bench/gpu/op_times.cc).
step op_times 90 "$bin/op-times" --device cuda:0
step op_times_host 30 "$bin/op-times" --device null --reps 200  # the host's share of a step
grep -h "^op-times" "$logs/op_times.log" "$logs/op_times_host.log" 2>/dev/null
train p1_b64 1 64
train p1_b256 1 256
train p2_b32 2 32
train p1_b256_tf32 1 256 CHORUS_ALLOW_TF32=1  # the GEMMs on the tensor cores (images/s, accuracy)
# The step captured as a CUDA graph and replayed (train_cnn --cuda-graph, ddp/train/step_graph.h).
train_graph graph_b64 1 64
train_graph graph_b256 1 256
train_graph graph_p2_b32 2 32
# A kill -9 mid-epoch and the restart from the newest snapshot end with the parameters of an
# uninterrupted run, bit for bit, on the GPU (2 ranks sharing it; tests/ddp/test_restart.cc).
step train_resume 150 env CHORUS_TEST_TRAIN_DEVICE=cuda:0 CHORUS_RUN="$bin/chorus-run" \
  TRAIN_CNN="$bin/train_cnn" "$bin/test_restart" "kill -9 mid-epoch*"
# The model split inside each rank (examples/ddp_model_parallel): cpu + GPU, and the GPU twice.
step model_parallel_cpu_cuda 60 env CHORUS_ALLOW_SHARED_GPU=1 "$bin/chorus-run" -n 2 \
  "$bin/ddp_model_parallel" cpu cuda:0
step model_parallel_cuda_cuda 60 env CHORUS_ALLOW_SHARED_GPU=1 "$bin/chorus-run" -n 2 \
  "$bin/ddp_model_parallel" cuda:0 cuda:0
if PATH=$PATH:/usr/local/cuda/bin command -v compute-sanitizer >/dev/null; then
  step sanitizer_cuda_ops 120 env PATH="$PATH:/usr/local/cuda/bin" compute-sanitizer --tool memcheck \
    --error-exitcode 1 "$bin/test_cuda_ops"
fi
fi
if want bench; then  # chorus against PyTorch eager (a call of its own: up to 7 minutes)
step train_bench 420 python3 bench/gpu/train_compare.py "$bin" --steps 100 --rounds 2 \
  --fashion-dir "$bundle/data/fashion-mnist" --accuracy-epochs 3
grep -h "^#\|^  \|accuracy" "$logs/train_bench.log" 2>/dev/null
fi
if want comm; then
PATH=$PATH:/usr/local/cuda/bin:/usr/local/cuda/compute-sanitizer
if command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck synccheck; do
    step "sanitizer_$tool" 100 env CHORUS_CUDA_TEST_QUICK=1 compute-sanitizer --tool "$tool" \
      --error-exitcode 1 "$bin/test_cuda_reduce"
  done
  # The device all-reduce across processes: every rank under the sanitizer.
  step sanitizer_ipc_memcheck 100 env CHORUS_ALLOW_SHARED_GPU=1 CHORUS_CUDA_TEST_QUICK=1 \
    compute-sanitizer --target-processes all --tool memcheck --error-exitcode 1 \
    "$bin/chorus-run" -n 3 "$bin/device_allreduce_probe" --worker
else
  echo "skip compute-sanitizer: not on PATH"
fi
fi
# 8. Part "mps" only (never in "all": it starts a daemon): the GPU shared under MPS, where the
#    driver has its control daemon, so that the ranks' kernels run side by side instead of taking
#    turns by time slice (../shared/notes/gpu-collectives.md). Training on 1 rank at batch 64 and
#    2 ranks at 32 (issue 12's bar: 2 ranks within 10% of 1), send/recv's stages timed.
if [ "$part" = mps ]; then
  if command -v nvidia-cuda-mps-control >/dev/null; then
    mps=$(mktemp -d)
    export CUDA_MPS_PIPE_DIRECTORY=$mps/pipe CUDA_MPS_LOG_DIRECTORY=$mps/log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if timeout 20 nvidia-cuda-mps-control -d; then
      for cfg in "p1_b64 1 64" "p2_b32 2 32"; do
        read -r name ranks batch <<<"$cfg"
        step "mps_train_$name" 120 env CHORUS_ALLOW_SHARED_GPU=1 "$bin/chorus-run" -n "$ranks" \
          "$bin/train_cnn" --device cuda:0 --data synthetic --synthetic-size 8192 \
          --synthetic-shape 3x32x32 --epochs 1 --batch-size "$batch" --log-every 16 --no-progress
        grep -h "images/s" "$logs/mps_train_$name.log" 2>/dev/null | tail -2
      done
      step mps_timing_send_recv 60 env CHORUS_ALLOW_SHARED_GPU=1 CHORUS_DEVICE_TIMING=40 \
        "$bin/chorus-run" -n 2 "$bin/chorus-perf" --device cuda --coll send_recv -b 1M -e 1M -n 10 -w 3
      grep -h "median of" "$logs/mps_timing_send_recv.log" 2>/dev/null
      perf mps_allreduce_p2 2 all_reduce  # issue 19's efficiency with the ranks side by side
      perf mps_allreduce_p3 3 all_reduce
      echo quit | timeout 20 nvidia-cuda-mps-control
    else
      echo "skip mps: nvidia-cuda-mps-control -d failed"
      tail -5 "$CUDA_MPS_LOG_DIRECTORY"/* 2>/dev/null
    fi
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    # chorus-run --mps: the launcher starts and stops a daemon of the job's own.
    step mps_flag_train_p2_b32 120 env CHORUS_ALLOW_SHARED_GPU=1 "$bin/chorus-run" --mps -n 2 \
      "$bin/train_cnn" --device cuda:0 --data synthetic --synthetic-size 8192 \
      --synthetic-shape 3x32x32 --epochs 1 --batch-size 32 --log-every 16 --no-progress
    grep -h "images/s\|mps" "$logs/mps_flag_train_p2_b32.log" 2>/dev/null | tail -3
  else
    echo "skip mps: nvidia-cuda-mps-control is not on PATH"
  fi
fi
# Part "quick" only (one call of about 5 minutes, for a lease too short for the three parts):
# what decides the open questions first -- the operators against the cpu, a step op by op,
# training throughput on 1 and 2 ranks (eager and as graphs), DDP's graph bits, the kill, every
# device collective, the all-reduce's bandwidth on 2 and 3 ranks and send/recv's stages, and a
# short comparison with PyTorch.
if [ "$part" = quick ]; then
  step cuda_release 30 "$bin/test_cuda_release"
  step cuda_release_1conn 30 env CUDA_DEVICE_MAX_CONNECTIONS=1 "$bin/test_cuda_release"
  step cuda_ops 120 "$bin/test_cuda_ops"
  step op_times 90 "$bin/op-times" --device cuda:0
  grep -h "^op-times" "$logs/op_times.log" 2>/dev/null
  train p1_b64 1 64
  train p1_b256 1 256
  train p2_b32 2 32
  train_graph graph_b64 1 64
  train_graph graph_p2_b32 2 32
  step ddp_graph 120 env CHORUS_TEST_TRAIN_DEVICE=cuda:0 "$bin/test_step_graph" 'DDP with cuda_graph*'
  step elastic_device 150 env CHORUS_TEST_TRAIN_DEVICE=cuda:0 "$bin/test_elastic_device" '[killed]'
  device_kill
  device_kill 1conn  # the flag words in host memory (new in the thirtieth session)
  # every device collective on 2 and 3 ranks (gather, scatter, all-to-all(-v) new 2026-11-27)
  step device_allreduce 180 "$bin/device_allreduce_probe" "$bin/chorus-run" 2 3
  grep -h "cases in\|freed\|destroyed" "$logs/device_allreduce.log" 2>/dev/null
  device_staged
  perf allreduce_p2 2 all_reduce
  perf allreduce_p3 3 all_reduce  # the leader-only meeting (2026-11-27) at 64 MiB and up
  perf allreduce_p2_devwords 2 all_reduce CHORUS_IPC_WORDS=device  # host words' cost, side by side
  timing send_recv
  timing all_reduce 64M
  step train_bench 240 python3 bench/gpu/train_compare.py "$bin" --steps 50 --rounds 1 \
    --fashion-dir "$bundle/data/fashion-mnist" --accuracy-epochs 0
  grep -h "^#\|^  " "$logs/train_bench.log" 2>/dev/null
fi
# Part "torch" only (one call, about 3 minutes): chorus_torch built there against the machine's
# PyTorch 2.x, which this Debian machine cannot do, and tests/torch's cases run with it, torchrun
# too (tests/gpu/torch2.sh; issue 13). CPU tensors only: no GPU time goes into it.
if [ "$part" = torch ]; then
  step torch2 400 env OUT="$logs" bash tests/gpu/torch2.sh "$bundle"
  grep -h "^ok \|^FAIL\|^skip\|^torch2\|^built\|^chorus_torch\|error" "$logs/torch2.log" 2>/dev/null | head -40
fi
echo "gpu suite: $passed passed, $failed failed"
[ $failed = 0 ]
