# Sourced by the device-call scripts (bench/*_session.sh, bench/bf16_peer_check.sh) on the H200:
# $out ($OUT, what comes back) and $log (the logs, which the script packs with pack_logs: the
# device tool returns few files), the binaries unpacked from .carry/ (scripts/pack-for-device.sh)
# and their shared libraries on the path.
set -u
out=${OUT:-/tmp/out}
log=$out/logs
mkdir -p "$log"
if [ ! -x build/moekit ]; then tar -xJf .carry/moekit-bins.tar.xz || exit 1; fi
export LD_LIBRARY_PATH=$PWD/build/runtime:${LD_LIBRARY_PATH:-}
# Packs $log into $out/all.tgz — or all-2.tgz, all-3.tgz, ... when an earlier script of the same
# device call already wrote one (two scripts in one call must not overwrite each other's logs) —
# and removes $log.
pack_logs() {
  local name=$out/all.tgz n=2
  while [ -e "$name" ]; do name=$out/all-$n.tgz; n=$((n + 1)); done
  tar czf "$name" -C "$out" logs && rm -rf "$log"
}
# Runs one GPU test binary with a time limit and a filter, its log to $log/NAME.log, and prints
# "NAME rc=... [  PASSED  ] ..." and its first failures:
#   run_gtest NAME SECONDS BINARY [FILTER]
run_gtest() {
  local name=$1 limit=$2 binary=$3 filter=${4:-*}
  timeout "$limit" "$binary" --gtest_brief=1 --gtest_filter="$filter" >"$log/$name.log" 2>&1
  echo "$name rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$log/$name.log" | tr '\n' ' ')"
  grep -E "FAILED|Failure" "$log/$name.log" | head -20
}
