#!/usr/bin/env bash
# The GPU check's two scripts agree (run where no GPU is: a lent GPU's minutes should not find a
# typo): both parse, and every program tests/gpu/run.sh runs from the bundle ("$bin/NAME") is one
# that tests/gpu/pack.sh puts there.
#   check_bundle.sh SOURCE_ROOT
set -u
root=${1:?usage: check_bundle.sh SOURCE_ROOT}
run=$root/tests/gpu/run.sh pack=$root/tests/gpu/pack.sh
bash -n "$run" || { echo "FAIL: $run does not parse"; exit 1; }
bash -n "$pack" || { echo "FAIL: $pack does not parse"; exit 1; }
packed=$(grep -o '"\$build/[^"]*"' "$pack" | sed 's/"//g; s/.*\///' | sort -u)
ran=$(grep -o '\$bin/[A-Za-z0-9_-]*' "$run" | sed 's/\$bin\///' | sort -u)
[ -n "$packed" ] && [ -n "$ran" ] || { echo "FAIL: no programs found in $pack or $run"; exit 1; }
missing=$(comm -13 <(echo "$packed") <(echo "$ran"))
if [ -n "$missing" ]; then
  echo "FAIL: run.sh runs what pack.sh does not pack: $missing"
  exit 1
fi
echo "ok: run.sh runs $(echo "$ran" | wc -l) programs, all packed"
