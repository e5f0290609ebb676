#!/usr/bin/env bash
# Run here before a lent GPU machine is used (it has none of our Debian packages): gathers the
# GPU programs and every shared library they need (libchorus, libfmt, libopenblas and its
# Fortran runtime, libhwloc, ...; not the C and C++ runtimes every Linux has) into one folder
# small enough to carry (the device tool carries at most 64 MiB):
#   tests/gpu/pack.sh [BUILD] [BUNDLE]        (defaults: build, build-gpu)
# and BUNDLE.tar.xz, the same compressed (the device tool carries 64 MiB at most: carry that);
# then, on the device machine: tests/gpu/run.sh BUNDLE  (it unpacks BUNDLE.tar.xz when BUNDLE
# is absent).
set -euo pipefail
build=${1:-build}
bundle=${2:-build-gpu}
progs=("$build/bench/gpu-platform" "$build/tests/cuda/test_cuda_reduce" "$build/tests/cuda/test_cuda_release"
       "$build/tests/gpu/shared_gpu_probe" "$build/tests/gpu/device_allreduce_probe"
       "$build/tools/chorus-run" "$build/bench/chorus-perf" "$build/bench/nccl-perf" "$build/tests/ddp/test_cuda_ops"
       "$build/examples/train_cnn" "$build/examples/ddp_model_parallel" "$build/bench/op-times"
       "$build/tests/ddp/test_restart" "$build/tests/ddp/test_equivalence"
       "$build/tests/ddp/test_step_graph" "$build/tests/ddp/test_elastic_device")
# Whatever the build left out: build what is packed.
ninja -C "$build" "${progs[@]#"$build"/}"
rm -rf "$bundle" && mkdir -p "$bundle/bin" "$bundle/lib"
for p in "${progs[@]}"; do
  [ -x "$p" ] || { echo "pack.sh: $p is missing (build here with nvcc first)" >&2; exit 1; }
  cp "$p" "$bundle/bin/"
  ldd "$p" | awk '/=> \// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libstdc++.so*|libgcc_s.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*) ;;
      *) cp -Ln "$lib" "$bundle/lib/" ;;
    esac
  done
done
# Fashion-MNIST for bench/gpu/train_compare.py (the GPU machine has no Debian packages): 30 MiB
# of .gz, which xz leaves as they are.
fm=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
if [ -f "$fm/train-images-idx3-ubyte.gz" ]; then
  mkdir -p "$bundle/data/fashion-mnist" && cp "$fm"/*-ubyte.gz "$bundle/data/fashion-mnist/"
else
  echo "pack.sh: no Fashion-MNIST in $fm: the GPU bench will use synthetic data only" >&2
fi
# Symbols only: the device tool carries 64 MiB at most (OpenBLAS alone is 35).
strip --strip-unneeded "$bundle"/bin/* "$bundle"/lib/* 2>/dev/null || true
tar -C "$(dirname "$bundle")" -cJf "$bundle.tar.xz" "$(basename "$bundle")"
echo "pack.sh: $bundle.tar.xz $(du -sh "$bundle.tar.xz" | cut -f1); $bundle holds $(ls "$bundle/bin" | wc -l) programs and $(ls "$bundle/lib" | wc -l) libraries, $(du -sh "$bundle" | cut -f1)"
