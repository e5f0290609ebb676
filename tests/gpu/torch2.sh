#!/usr/bin/env bash
# chorus_torch against the PyTorch 2.x of a lent GPU machine -- the half of issue 13 that this
# Debian 12 machine (torch 1.13 only, no pip) cannot build or run: compiles the extension there,
# with that machine's C++ compiler against its torch, then runs tests/torch's cases with it
# (operations on 2 and 3 ranks against Gloo, DDP, the init methods, a desync and a kill -9 named,
# the launchers -- torchrun among them, which Debian's 1.13 cannot start).
#   tests/gpu/torch2.sh [BUNDLE]      (default build-gpu: its bin/chorus-run and lib/libchorus.so.0)
# The module goes to $OUT/torch2 (default gpu-logs/torch2), each case's output to the terminal.
# Exit 77 with the reason when there is no torch 2.x, C++ compiler or Python headers.
# Here: `TORCH2_ANY=1 CHORUS_RUN=build/tools/chorus-run LIBCHORUS=build/collectives/libchorus.so.0
# tests/gpu/torch2.sh` builds the same way against torch 1.13, to check this script (make test's
# torch/gpu_script does, with TORCH2_OPT=-O0 TORCH2_CASES=ops_2: the build, the import, one case).
set -u
bundle=${1:-build-gpu}
py=${TORCH_PYTHON:-python3}
run_bin=$(readlink -f "${CHORUS_RUN:-$bundle/bin/chorus-run}")
lib=$(readlink -f "${LIBCHORUS:-$bundle/lib/libchorus.so.0}")
out=$(readlink -f "${OUT:-gpu-logs}")/torch2
src=$(cd "$(dirname "$0")/../.." && pwd)
skip() { echo "SKIP: $*"; exit 77; }

if [ ! -x "$run_bin" ] || [ ! -f "$lib" ]; then
  skip "no chorus-run or libchorus.so.0 ($run_bin, $lib): tests/gpu/pack.sh"
fi
mkdir -p "$out/chorus_torch"
# stdout only: torch may warn on stderr ("No CUDA runtime is found ...").
probe=$("$py" "$src/python/chorus_torch/probe_torch.py" 2> "$out/probe.err") ||
  skip "$(cat "$out/probe.err")"
version=$(sed -n 1p <<< "$probe")
IFS=';' read -r -a incs <<< "$(sed -n 2p <<< "$probe")"
libdir=$(sed -n 3p <<< "$probe")
abi=$(sed -n 4p <<< "$probe")
case $version in
  1.*) [ "${TORCH2_ANY:-0}" = 1 ] || skip "torch $version with $py: make test builds and tests chorus_torch for 1.x" ;;
esac
cxx=${CXX:-c++}
command -v "$cxx" > /dev/null || skip "no C++ compiler ($cxx) to build chorus_torch against torch $version"
# What the interpreter's extension modules need, and the pybind11 ABI tags torch was built with:
# the module receives torch's own objects (the c10d Store), which only works across matching tags.
pyinfo=$("$py" - 2> /dev/null <<'EOF'
import sysconfig, torch
print(sysconfig.get_paths()["include"])
print(sysconfig.get_config_var("EXT_SUFFIX"))
for tag in ("COMPILER_TYPE", "STDLIB", "BUILD_ABI"):
    v = getattr(torch._C, "_PYBIND11_" + tag, None)
    print(f'-DPYBIND11_{tag}="{v}"' if v else "")
EOF
) || skip "cannot ask $py for its include folder"
pyinc=$(sed -n 1p <<< "$pyinfo")
suffix=$(sed -n 2p <<< "$pyinfo")
mapfile -t tags < <(sed -n '3,5p' <<< "$pyinfo" | grep .)
[ -f "$pyinc/Python.h" ] || skip "no Python.h in $pyinc (the Python headers) to build against torch $version"

cp "$src/python/chorus_torch/__init__.py" "$src/python/chorus_torch/__main__.py" "$out/chorus_torch/"
unity=$out/chorus_torch_unity.cc  # one translation unit, as the meson build's
for f in "$src"/python/chorus_torch/csrc/*.cc; do echo "#include \"$f\""; done > "$unity"
inc_flags=()
for d in "${incs[@]}"; do inc_flags+=(-isystem "$d"); done
echo "building chorus_torch against torch $version ($py, $cxx)"
t0=$SECONDS
"$cxx" -std=c++20 "${TORCH2_OPT:--O2}" -fPIC -shared -Wall -Wno-unused-parameter \
  -D_GLIBCXX_USE_CXX11_ABI="$abi" -DTORCH_EXTENSION_NAME=_C "${tags[@]}" \
  -I "$src/include" -I "$src/python/chorus_torch/csrc" "${inc_flags[@]}" -isystem "$pyinc" \
  "$unity" -o "$out/chorus_torch/_C$suffix" \
  "$lib" -L "$libdir" -lc10 -ltorch_cpu -ltorch -ltorch_python -pthread \
  -Wl,-rpath,"$libdir" -Wl,-rpath,"$(dirname "$lib")" -Wl,-rpath-link,"$(dirname "$lib")" ||
  { echo "FAILED: building chorus_torch"; exit 1; }
echo "built in $((SECONDS - t0)) s: $out/chorus_torch/_C$suffix"

export PYTHONPATH=$out${PYTHONPATH:+:$PYTHONPATH}
export CHORUS_TORCH_PYTHON=$py CHORUS_RUN=$run_bin CHORUS_SOURCE_ROOT=$src
"$py" -c "import chorus_torch, torch; print('chorus_torch', chorus_torch.chorus_version(), 'built for torch', chorus_torch._C.torch_version_built, 'runs on', torch.__version__)" ||
  { echo "FAILED: import chorus_torch"; exit 1; }
passed=0 failed=0
cases=" ${TORCH2_CASES:-ops_2 ops_3 ddp desync inits kill launchers} "
case_() {  # name, limit seconds, command...
  local name=$1 limit=$2
  shift 2
  [[ $cases == *" $name "* ]] || return 0
  echo "=== torch2/$name: $*"
  timeout "$limit" "$@"
  local rc=$?
  if [ $rc = 0 ]; then passed=$((passed + 1)); echo "ok   torch2/$name"
  elif [ $rc = 77 ]; then echo "skip torch2/$name"
  else failed=$((failed + 1)); echo "FAIL torch2/$name (rc $rc)"; fi
}
launch=$src/tests/torch/launch.py
case_ ops_2 180 "$py" "$launch" ops 2
case_ ops_3 180 "$py" "$launch" ops 3
case_ ddp 180 "$py" "$launch" ddp 2
case_ desync 180 "$py" "$launch" desync 3
case_ inits 180 "$py" "$launch" inits 2
case_ kill 120 "$py" "$launch" kill 3 --expect-killed 2
case_ launchers 240 "$py" "$src/tests/torch/test_launchers.py"
# chorus_torch.revoke/shrink take torch 1.x's group; with 2.x they refuse (chorus_torch/__init__.py).
echo "skip torch2/survive: chorus_torch.revoke/shrink are built for torch 1.x only"
echo "torch2 (torch $version): $passed passed, $failed failed"
[ "$failed" = 0 ]
