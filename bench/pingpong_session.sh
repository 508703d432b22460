#!/usr/bin/env bash
# Device call for the ping-pong rows (128x128pp: each consumer warpgroup a whole 128x128 item, the
# two warpgroups' mainloops in turn, each epilogue under the other's mainloop) and the cooperative
# 128x128 rows beside them (the same L2 bytes per FLOP, no overlap), 16-bit and K-invariant fp8.
# Pack first: bash scripts/pack-for-device.sh ../shared/peers/triton_peer.py
# Parts (arguments, in order):
#   tests     test_grouped_gemm (every 16-bit and fp8 row on the awkward, batched, fused, few-CTA
#             and graph cases), the quantized layers with every 8-bit row forced, the layer tests
#   memcheck  compute-sanitizer memcheck and racecheck on the grouped kernels' few-CTA and fp8
#             float64 cases (every row)
#   probe     128x256, 128x128 and 128x128pp forced, fp8 per tensor and bf16, mixtral-8x7b and
#             qwen3-30b-a3b at M = 4096 / 16384 (routed as the peer), new/128x256 per case
#   peer      the Triton peer's bf16 / fp8 per-tensor layers on the same shapes, the ratio per case
#             against 128x128pp's runs
# shellcheck source=bench/device_prelude.sh
. bench/device_prelude.sh
tokens=${PINGPONG_TOKENS:-4096 16384}
part_tests() {
  run_gtest test_grouped_gemm 150 build/tests/test_grouped_gemm
  run_gtest quantized_tiles 240 build/tests/test_gpu_quantized 'QuantizedGpu.Every8BitTile*'
  run_gtest test_gpu_layer 90 build/tests/test_gpu_layer
}
part_memcheck() {
  local tool
  for tool in memcheck racecheck; do
    timeout 240 compute-sanitizer --tool "$tool" --error-exitcode 9 build/tests/test_grouped_gemm \
      --gtest_brief=1 --gtest_filter='GroupedGemm.FewCtas*:GroupedGemmFp8.LongK*' \
      >"$log/pingpong_$tool.log" 2>&1
    echo "$tool grouped rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED)' "$log/pingpong_$tool.log" | tr '\n' ' ')"
  done
}
part_probe() {
  local q t
  for q in fp8_per_tensor bf16; do
    for t in 128x256 128x128 128x128pp; do
      # shellcheck disable=SC2086  # one argument per size
      ab_run "${q}_$t" build/moekit --plain-topk --quant "$q" --tile "$t" \
        --models mixtral-8x7b qwen3-30b-a3b --tokens $tokens
    done
    for t in 128x128 128x128pp; do
      python3 bench/compare_ab.py "$log/ab_${q}_128x256.json" "$log/ab_${q}_$t.json" 2>&1 |
        tee "$log/ab_${q}_$t.md"
    done
  done
}
part_peer() {
  local d q
  for d in bf16:bf16 fp8tensor:fp8_per_tensor; do
    q=${d#*:}
    d=${d%%:*}
    peer_ratio "$d" mixtral-8x7b,qwen3-30b-a3b "$tokens" "$log/ab_${q}_128x128pp.json"
  done
}
run_parts "$@"
