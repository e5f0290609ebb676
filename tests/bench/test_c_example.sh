#!/usr/bin/env bash
# The plain-C embedding example: (a) the built allreduce_hello on 2 and 3 ranks under
# chorus-run; (b) the install path: `meson install --destdir` into a temp dir, compile
# allreduce_hello.c with `pkg-config --cflags --libs chorus` against the installed headers and
# library only, and run it on 2 ranks with the installed chorus-run.
# usage: test_c_example.sh CHORUS_RUN HELLO_EXE HELLO_SOURCE BUILD_DIR
set -u
chorus_run=$1 hello=$2 source=$3 build_dir=$4
fail() { echo "FAIL: $*"; exit 1; }

# expect_ranks N OUTPUT: every rank printed its line and said ok twice.
expect_ranks() {
  local n=$1 out=$2 r
  for ((r = 0; r < n; r++)); do
    echo "$out" | grep -q "rank $r of $n: int32 sum ok, float avg ok (1000 elements each)" ||
      fail "rank $r of $n did not report both results ok"
  done
  [ "$(echo "$out" | grep -c 'elements each')" = "$n" ] || fail "expected exactly $n result lines"
}

# (a) the built example
for n in 2 3; do
  out=$(timeout 60 "$chorus_run" -n "$n" "$hello" 2>&1)
  rc=$?
  echo "$out"
  [ $rc = 0 ] || fail "allreduce_hello on $n ranks exited $rc"
  expect_ranks "$n" "$out"
  echo "ok: built example on $n ranks"
done

# (b) the installed library, headers, pkg-config file and launcher
command -v pkg-config >/dev/null || { echo "skip: pkg-config not installed (install path untested)"; exit 77; }
# A sanitizer build's library needs its compiler and runtime (CHORUS_TEST_CC/CFLAGS, meson.build).
c_compiler=${CHORUS_TEST_CC:-cc}
command -v "$c_compiler" >/dev/null || { echo "skip: no C compiler '$c_compiler' (install path untested)"; exit 77; }
tmp=$(mktemp -d /tmp/chorus-install-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
if ! install_log=$(timeout 120 meson install -C "$build_dir" --destdir "$tmp/root" --no-rebuild --quiet 2>&1); then
  echo "$install_log" | tail -20
  echo "skip: meson install --destdir could not run in $build_dir"
  exit 77
fi
pc=$(find "$tmp/root" -name chorus.pc | head -1)
[ -n "$pc" ] || fail "meson install put no chorus.pc under $tmp/root"
[ -n "$(find "$tmp/root" -path '*include/chorus/chorus.h')" ] || fail "chorus.h was not installed"
# The .pc file names the final prefix; PKG_CONFIG_SYSROOT_DIR points its -I/-L into the destdir.
flags=$(PKG_CONFIG_PATH=$(dirname "$pc") PKG_CONFIG_SYSROOT_DIR="$tmp/root" pkg-config --cflags --libs chorus) ||
  fail "pkg-config --cflags --libs chorus failed with $pc"
echo "pkg-config: $flags"
libdir=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --variable=libdir chorus)
libdir="$tmp/root$libdir"
[ -e "$libdir/libchorus.so" ] || fail "libchorus.so is not in the installed libdir $libdir"
# shellcheck disable=SC2086  # flags are meant to split
"$c_compiler" -std=c11 -Wall -Wextra -Werror -o "$tmp/hello" "$source" $flags ${CHORUS_TEST_CFLAGS:-} ||
  fail "$c_compiler could not build $source against the install"
installed_run=$(find "$tmp/root" -path '*/bin/chorus-run' | head -1)
[ -n "$installed_run" ] || installed_run=$chorus_run
out=$(LD_LIBRARY_PATH="$libdir" timeout 60 "$installed_run" -n 2 "$tmp/hello" 2>&1)
rc=$?
echo "$out"
[ $rc = 0 ] || fail "the example built against the install exited $rc"
expect_ranks 2 "$out"
echo "ok: installed headers, library, pkg-config and chorus-run"
