#!/usr/bin/env bash
# The fuzz tests of the test suite (label fuzz), run by ctest:
#   tests/fuzz/run.sh build BUILD_DIR                  configure + build the libFuzzer targets
#                                                     with clang++ (MOEKIT_FUZZ_CXX overrides)
#   tests/fuzz/run.sh run BUILD_DIR TARGET SECONDS     fuzz TARGET for SECONDS on its seed corpus
# Any finding (crash, sanitizer report, leak, a 10 s input, an uncaught exception) fails the test;
# the input that caused it is left in BUILD_DIR/work/TARGET/artifacts/ — add it to
# tests/fuzz/corpus/TARGET/ with the fix. Inputs the run discovers go to BUILD_DIR/work, never
# into the repository.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
mode="$1"
bin="$2"
case "$mode" in
  build)
    cxx="${MOEKIT_FUZZ_CXX:-clang++}"
    if ! command -v "$cxx" >/dev/null 2>&1; then
      echo "error: $cxx not found. The fuzz tests need clang with libFuzzer (Debian packages" \
           "clang and libclang-rt-14-dev); scripts/install-deps.sh installs them." >&2
      exit 1
    fi
    cmake -S "$here" -B "$bin" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      >/dev/null
    cmake --build "$bin" -j"$(nproc)"
    ;;
  run)
    target="$3"
    seconds="$4"
    exe="$bin/fuzz_$target"
    [ -x "$exe" ] || { echo "error: $exe was not built (see the fuzz_build test)" >&2; exit 1; }
    work="$bin/work/$target"
    rm -rf "$work"
    mkdir -p "$work/discovered" "$work/artifacts" "$work/tmp"
    TMPDIR="$work/tmp" "$exe" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -dict="$here/json.dict" -print_final_stats=1 -artifact_prefix="$work/artifacts/" \
      "$work/discovered" "$here/corpus/$target"
    ;;
  *)
    echo "usage: $0 build BUILD_DIR | run BUILD_DIR TARGET SECONDS" >&2
    exit 2
    ;;
esac
