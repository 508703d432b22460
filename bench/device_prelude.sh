# shellcheck shell=bash
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
# Runs the parts named in its arguments, in order — each the calling script's function
# part_NAME — printing each part's time, then packs the logs:
#   run_parts PART ...
run_parts() {
  local part t0
  for part in "$@"; do
    t0=$(date +%s)
    if declare -F "part_$part" >/dev/null; then "part_$part"; else echo "unknown part $part"; fi
    echo "($part: $(($(date +%s) - t0)) s)"
  done
  pack_logs
}
# Unpacks build_old/ (the binaries of the commit before, for A/B runs) from
# .carry/moekit-old.tar.xz when it was carried and is not unpacked yet.
unpack_old_binary() {
  if [ ! -x build_old/moekit ] && [ -f .carry/moekit-old.tar.xz ]; then
    tar -xJf .carry/moekit-old.tar.xz || return 1
  fi
}
# One `moekit bench` of an A/B, its log and JSON to $log/ab_NAME.{log,json}, its exit status
# printed:
#   ab_run NAME BINARY ARGS...
ab_run() {
  local name=$1 binary=$2
  shift 2
  timeout 150 "$binary" bench --reps 20 --json "$log/ab_$name.json" "$@" >"$log/ab_$name.log" 2>&1
  echo "$name rc=$?"
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
# The Triton peer (.carry/triton_peer.py) on one dtype's shapes and sizes (log, JSON:
# $log/peer_DTYPE.*), then its ratio per case against a `moekit bench --json` of the same cases
# from the same call, printed and kept as $log/ratio_DTYPE.md:
#   peer_ratio DTYPE SHAPES(comma-separated) "SIZES" MOEKIT_JSON
peer_ratio() {
  local dtype=$1 shapes=$2 sizes=$3 ours=$4
  PYTHONUNBUFFERED=1 timeout 150 python3 .carry/triton_peer.py --dtype "$dtype" \
    --shapes "$shapes" --tokens "$(echo "$sizes" | tr ' ' ,)" \
    --json "$log/peer_$dtype.json" >"$log/peer_$dtype.log" 2>&1
  echo "peer $dtype rc=$?"
  python3 bench/compare_peer.py "$ours" "$log/peer_$dtype.json" --dtype "$dtype" \
    >"$log/ratio_$dtype.md" 2>&1
  cat "$log/ratio_$dtype.md"
}
# Every GPU test binary (bench/h200_session.sh tests), its summary printed.
all_gpu_tests() {
  OUT=$log timeout 300 bash bench/h200_session.sh tests >/dev/null 2>&1
  cat "$log/summary.txt"
}
# The bf16 bench and the Triton peer in the same call (bench/h200_session.sh bench peer), the
# ratio table printed; then gpt-oss-120b at the seven sizes under each quantized scheme given:
#   bench_with_peer [SCHEME ...]
bench_with_peer() {
  OUT=$log timeout 240 bash bench/h200_session.sh bench peer >/dev/null 2>&1
  tail -n 40 "$log/ratio.md"
  local q
  for q in "$@"; do
    timeout 90 build/moekit bench --quant "$q" --models gpt-oss-120b \
      --tokens 1 16 64 256 1024 4096 16384 --json "$log/bench_$q.json" >"$log/bench_$q.log" 2>&1
    echo "bench --quant $q rc=$?"
    grep -E "^ " "$log/bench_$q.log" | head -12
  done
}
# memcheck and racecheck on the test_grouped_gemm tests matching FILTER (log: sanitizer.log), the
# summaries printed:
#   sanitize_grouped_gemm SECONDS FILTER
sanitize_grouped_gemm() {
  local limit=$1 filter=$2 tool
  for tool in memcheck racecheck; do
    timeout "$limit" compute-sanitizer --tool $tool build/tests/test_grouped_gemm \
      --gtest_brief=1 --gtest_filter="$filter"
  done >"$log/sanitizer.log" 2>&1
  grep -h "SUMMARY" "$log/sanitizer.log"
}
