#!/usr/bin/env bash
# One device call for the W4A16 / int8 work: the GPU tests, compute-sanitizer on the new kernels,
# the quantized fixtures through `moekit run --checkpoint` on the GPU, the quantized bench and
# the bf16 bench + Triton peer. Writes everything under $OUT and packs it into $OUT/all.tgz (the
# device tool returns 8 files).
set -u
out=${OUT:-/tmp/out}
mkdir -p "$out/logs"
export LD_LIBRARY_PATH=$PWD/build/runtime:${LD_LIBRARY_PATH:-}
log=$out/logs
{
  timeout 200 bash bench/h200_session.sh tests
  cp "$out"/test_*.log "$out"/summary.txt "$log"/ 2>/dev/null
  for tool in memcheck racecheck; do
    compute-sanitizer --tool $tool build/tests/test_grouped_gemm --gtest_brief=1 \
      --gtest_filter='GroupedGemmW4A16.*'
    compute-sanitizer --tool $tool build/tests/test_gpu_quantized --gtest_brief=1 \
      --gtest_filter='*mxfp4_w4a16_small_h320_M33*:*mxfp4_w4a16_tiny_M257*'
  done >"$log/sanitizer.log" 2>&1
  grep -h "SUMMARY" "$log/sanitizer.log"
  for scheme in mxfp4_w4a16 int8_w8a8 int8_per_tensor; do
    for model in tiny tiny-deepseek; do
      build/moekit make-fixture --scheme $scheme --model $model --out /tmp/fx_${scheme}_$model
      build/moekit run --checkpoint /tmp/fx_${scheme}_$model -m 33 2>&1 | grep -E "^forward|^check"
    done
  done >"$log/fixtures.log" 2>&1
  cat "$log/fixtures.log"
  timeout 150 build/moekit bench --quant mxfp4_w4a16 --models gpt-oss-120b qwen3-30b-a3b \
    --tokens 1 16 64 256 1024 4096 16384 --json "$log/bench_mxfp4_w4a16.json" \
    >"$log/bench_mxfp4_w4a16.log" 2>&1
  grep -E "^ +[0-9]+ " "$log/bench_mxfp4_w4a16.log"
} 2>&1 | tee "$log/session.log"
rm -f "$out"/test_*.log "$out"/summary.txt "$out"/memory_invariance.txt "$out"/device.txt
timeout 120 bash bench/h200_session.sh bench peer >/dev/null 2>&1
mv "$out"/bench.json "$out"/bench.log "$out"/peer.json "$out"/ratio.md "$out"/device.txt "$log"/ \
  2>/dev/null
rm -f "$out"/peer.log "$out"/summary.txt
tail -n 3 "$log/ratio.md"
tar czf "$out/all.tgz" -C "$out" logs && rm -rf "$log"
