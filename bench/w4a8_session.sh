#!/usr/bin/env bash
# Device call for the W4A8 rows (TileFamily::kW4A8: int4 weights converted to e4m3 by the
# producer warpgroup, fp8 activations; Sm90W4A8Experts, backend sm90_w4a8). Parts (arguments, in
# order):
#   tests   every GPU test binary; compute-sanitizer memcheck on QuantizedGpu's every-tile and
#           graph-replay tests and on the W4A8 grouped GEMM test, memcheck + racecheck on the W4A8
#           layer cases at M = 33 and 257 (the swap-AB and the 128x256 rows)
#   quick   the grouped GEMM tests (GroupedGemmW4A8: every kW4A8 row against float64) and every
#           quantized layer test (and the binaries in $QUICK_MORE), before the whole suite
#   bench   moekit bench --quant w4a8_fp8 and --quant fp8_per_channel (the same shapes: W4A8's
#           prefill target is a ratio to our fp8; $QUANTS) on qwen3-30b-a3b, mixtral-8x7b and
#           deepseek-v3 ($MODELS) at M = 1 .. 16384, each within $BENCH_TIMEOUT s (default 120;
#           deepseek-v3 W4A8 needs more: making its random weights took 38 s per set on the
#           2-core development machine), and the Triton peer's fp8 per-tensor layer on those
#           shapes in the same call (the peer has no int4 path), the ratio tables
# Everything is packed into $OUT/all.tgz (the device tool returns few files).
# shellcheck source=bench/device_prelude.sh
. bench/device_prelude.sh
models=${MODELS:-qwen3-30b-a3b mixtral-8x7b deepseek-v3}
tokens="1 16 64 256 1024 4096 16384"
for part in "$@"; do
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  if [ "$part" = tests ]; then
  timeout 220 bash bench/h200_session.sh tests
  mv "$out"/test_*.log "$out"/summary.txt "$log"/ 2>/dev/null
  cat "$log/summary.txt"
  timeout 170 compute-sanitizer --tool memcheck build/tests/test_gpu_quantized --gtest_brief=1 \
    --gtest_filter='QuantizedGpu.Every8BitTileMatchesEmulation:QuantizedGpu.CudaGraphReplayIsBitwiseIdentical' \
    >"$log/sanitizer.log" 2>&1
  timeout 60 compute-sanitizer --tool memcheck build/tests/test_grouped_gemm --gtest_brief=1 \
    --gtest_filter='GroupedGemmW4A8.*' >>"$log/sanitizer.log" 2>&1
  for tool in memcheck racecheck; do
    timeout 90 compute-sanitizer --tool $tool build/tests/test_gpu_quantized --gtest_brief=1 \
      --gtest_filter='*w4a8_fp8_small_M33*:*w4a8_fp8_small_M257*'
  done >>"$log/sanitizer.log" 2>&1
  grep -h "SUMMARY\|PASSED\|FAILED" "$log/sanitizer.log"
  fi
  if [ "$part" = quick ]; then
  for t in test_grouped_gemm test_gpu_quantized ${QUICK_MORE:-}; do
    timeout 150 build/tests/$t --gtest_brief=1 >"$log/$t.log" 2>&1
    echo "$t rc=$?"
    grep -h "\[w4a8\]\|PASSED\|FAILED" "$log/$t.log"
  done
  grep -h "w4a8" "$log/test_gpu_quantized.log" | head -40
  fi
  if [ "$part" = bench ]; then
  for q in ${QUANTS:-w4a8_fp8 fp8_per_channel}; do
    timeout ${BENCH_TIMEOUT:-120} build/moekit bench --quant $q --models $models --tokens $tokens \
      --json "$log/bench_$q.json" >"$log/bench_$q.log" 2>&1
    echo "== $q"
    grep -hE "^[a-z]|^ +[0-9]+ " "$log/bench_$q.log" | grep -v "weights:\|experts:"
  done
  PYTHONUNBUFFERED=1 timeout 120 python3 .carry/triton_peer.py --dtype fp8tensor \
    --shapes "$(echo $models | tr ' ' ,)" --tokens 1,16,64,256,1024,4096,16384 \
    --json "$log/peer_fp8tensor.json" >"$log/peer_fp8tensor.log" 2>&1
  for q in ${QUANTS:-w4a8_fp8 fp8_per_channel}; do
    python3 bench/compare_peer.py "$log/bench_$q.json" "$log/peer_fp8tensor.json" \
      --dtype fp8tensor >"$log/ratio_$q.md" 2>&1
    echo "== $q vs the peer's fp8 per-tensor"
    cat "$log/ratio_$q.md"
  done
  fi
} 2>&1 | tee -a "$log/session.log"
done
rm -f "$out"/memory_invariance.txt "$out"/device.txt
pack_logs
