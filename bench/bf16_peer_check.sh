#!/usr/bin/env bash
# The bf16 layer against the Triton peer in one device call (after a change to the shared kernel
# kit): moekit bench and the peer on every preset, the ratio table; packed into $OUT/all.tgz.
set -u
out=${OUT:-/tmp/out}
log=$out/logs
mkdir -p "$log"
if [ ! -x build/moekit ]; then tar -xJf .carry/moekit-bins.tar.xz || exit 1; fi
export LD_LIBRARY_PATH=$PWD/build/runtime:${LD_LIBRARY_PATH:-}
{
  OUT=$log timeout 240 bash bench/h200_session.sh bench peer
} 2>&1 | tee "$log/session.log"
tar czf "$out/all.tgz" -C "$out" logs && rm -rf "$log"
