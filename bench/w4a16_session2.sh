#!/usr/bin/env bash
# Second W4A16 device call (the mainloop converting one K step ahead): every GPU test, sanitizer
# on the W4A16 kernels, the W4A16 bench and the bf16 bench; packed into $OUT/all.tgz.
set -u
out=${OUT:-/tmp/out}
log=$out/logs
mkdir -p "$log"
export LD_LIBRARY_PATH=$PWD/build/runtime:${LD_LIBRARY_PATH:-}
{
  timeout 150 bash bench/h200_session.sh tests
  mv "$out"/test_*.log "$out"/summary.txt "$log"/ 2>/dev/null
  for tool in memcheck racecheck; do
    timeout 40 compute-sanitizer --tool $tool build/tests/test_grouped_gemm --gtest_brief=1 \
      --gtest_filter='GroupedGemmW4A16.*'
  done >"$log/sanitizer.log" 2>&1
  grep -h "SUMMARY" "$log/sanitizer.log"
  timeout 70 build/moekit bench --quant mxfp4_w4a16 --models gpt-oss-120b qwen3-30b-a3b \
    --tokens 1 64 1024 16384 --json "$log/bench_mxfp4_w4a16.json" \
    >"$log/bench_mxfp4_w4a16.log" 2>&1
  grep -E "^ +[0-9]+ " "$log/bench_mxfp4_w4a16.log"
  timeout 30 build/moekit bench --json "$log/bench.json" >"$log/bench.log" 2>&1
  grep -E "^ +(1|64|16384) " "$log/bench.log"
} 2>&1 | tee "$log/session.log"
rm -f "$out"/memory_invariance.txt "$out"/device.txt
tar czf "$out/all.tgz" -C "$out" logs && rm -rf "$log"
