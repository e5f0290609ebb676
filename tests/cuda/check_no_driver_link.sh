#!/usr/bin/env bash
# Issue 19 item 1: libchorus.so carries the CUDA runtime (cudart_static) and reaches the driver at
# run time only, so it loads where there is no GPU, driver or CUDA toolkit. Fails if the library
# names libcuda or libcudart among the shared libraries it needs, or lacks the CUDA code.
#   check_no_driver_link.sh LIBCHORUS
set -euo pipefail
command -v readelf >/dev/null || { echo "skip: readelf (binutils) not found"; exit 77; }
lib=$1
needed=$(readelf -d "$lib" | grep NEEDED || true)
if printf '%s\n' "$needed" | grep -E 'libcuda|libcudart|libnvidia' ; then
  echo "FAIL: $lib needs a CUDA shared library at load time (above)"
  exit 1
fi
if ! grep -q cuPointerGetAttributes "$lib"; then
  echo "FAIL: $lib has no CUDA code (the CUDA build was expected to be linked in)"
  exit 1
fi
echo "ok: $lib needs no CUDA library at load time:"
printf '%s\n' "$needed" | sed 's/.*Shared library: /  /'
