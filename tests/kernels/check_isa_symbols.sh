#!/usr/bin/env bash
# Checks that each instruction-set build of kernels/cpu/isa/ defines external symbols only in its
# own namespaces (chorus::kernels::<isa>:: and ::helpers_<isa>::). An inline function or template
# from elsewhere (std::fill, a shape struct's member) compiled into the avx512 objects would be a
# weak symbol the linker may pick for every caller, putting AVX-512 code on a CPU without it.
#   check_isa_symbols.sh NAME LIBRARY [NAME LIBRARY ...]
set -euo pipefail
command -v nm >/dev/null || { echo "skip: nm (binutils) not found"; exit 77; }
bad=0
while [ $# -ge 2 ]; do
  name=$1 lib=$2
  shift 2
  # typeinfo objects hold no code: UBSan's -fsanitize=function emits them for function types.
  syms=$(nm -C --defined-only -g "$lib" | grep -E '^[0-9a-f]+ [A-Z] ' | cut -d' ' -f3- |
         grep -v -E '^typeinfo (name )?for ' || true)
  count=$(printf '%s\n' "$syms" | grep -c . || true)
  stray=$(printf '%s\n' "$syms" | grep -v -E "^chorus::kernels::(helpers_)?$name::" | grep . || true)
  if [ -n "$stray" ]; then
    echo "$name build ($lib): symbols outside chorus::kernels::$name:: --"
    printf '  %s\n' "$stray"
    bad=1
  else
    echo "$name build: $count external symbols, all in chorus::kernels::$name::"
  fi
  [ "$count" -gt 0 ] || { echo "$name build: no symbols found in $lib"; bad=1; }
done
exit $bad
