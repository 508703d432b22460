#!/usr/bin/env bash
# Packs what a GPU machine needs to run moekit's GPU tests, benchmarks and Python tests from a
# CUDA build made here (build/): the CLI, the GPU test binaries, the C API library, the Debian
# shared libraries they load (fmt, spdlog, OpenMPI's, which the CLI links for its CPU ranks; NCCL
# and cuBLASLt are on the GPU machine's image) and, when given, extra files (e.g. the Triton peer) —
# into .carry/ (git-ignored), xz-compressed to stay under the device tool's transfer limit.
#   scripts/pack-for-device.sh [extra files...]
# Then on the GPU machine: bash bench/h200_session.sh (it unpacks .carry/moekit-bins.tar.xz).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${MOEKIT_BUILD:-build}
mkdir -p .carry "$build/runtime"
cp -L /lib/x86_64-linux-gnu/libfmt.so.9 /lib/x86_64-linux-gnu/libspdlog.so.1.10 "$build/runtime/"
ldd "$build/moekit" | awk '/libmpi|libopen-(pal|rte)|libhwloc|libevent|libudev/ {print $3}' |
  xargs -r -I{} cp -L {} "$build/runtime/"
bins=("$build/moekit" "$build/runtime" "$build/CTestTestfile.cmake")
for t in "$build"/tests/test_gpu_* "$build"/tests/test_grouped_gemm "$build"/tests/test_moe_support_kernels \
         "$build"/tests/test_sm90_kit; do
  [ -f "$t" ] && bins+=("$t")
done
lib=$(find "$build" -name 'libmoekit_c.so' | head -n 1)
[ -n "$lib" ] && bins+=("$lib")
# Every binary links the same CUDA library (about 30 MB of kernels): xz -9's 64 MiB dictionary
# lets each one reuse its neighbour's bytes (the default -6 window of 8 MiB does not).
XZ_OPT=${XZ_OPT:--9 -T2} tar -cJf .carry/moekit-bins.tar.xz "${bins[@]}"
for f in "$@"; do cp "$f" .carry/; done
du -sh .carry
