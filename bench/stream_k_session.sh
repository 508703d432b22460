#!/usr/bin/env bash
# Device call for stream-K on the swap-AB tiles (GroupedGemmParams::stream_k; 2026-12-06): each
# CTA an equal share of the (work item, K step) units where round-robin items leave SMs unevenly
# loaded (qwen3-30b-a3b GEMM1 at M = 1: 192 items over 132 SMs).
# Pack first: bash scripts/pack-for-device.sh ../shared/peers/triton_peer.py
# Parts (arguments, in order):
#   gg     test_grouped_gemm's stream-K and fp8 tests, then memcheck / racecheck on them
#   ab     moekit bench bf16, the four presets at M = 1, 16, 64: stream-K off
#          (MOEKIT_DISABLE_STREAM_K=1) and on, same binary, interleaved
#   tests  every GPU test binary (bench/h200_session.sh tests)
#   bench  moekit bench (bf16) and the Triton peer in the same call, the ratio table
# shellcheck source=bench/device_prelude.sh
. bench/device_prelude.sh
part_gg() {
  run_gtest gg 240 build/tests/test_grouped_gemm '*StreamK*:GroupedGemmFp8.*:GroupedGemm.*'
  sanitize_grouped_gemm 150 'GroupedGemmStreamK.Split*'
}
part_ab() {
  local model round
  for round in 1 2; do
    for model in ${AB_MODELS:-qwen3-30b-a3b gpt-oss-120b mixtral-8x7b deepseek-v3}; do
      MOEKIT_DISABLE_STREAM_K=1 ab_run "${model}_off_$round" build/moekit --models "$model" \
        --tokens 1 16 64
      ab_run "${model}_on_$round" build/moekit --models "$model" --tokens 1 16 64
    done
  done
  for model in ${AB_MODELS:-qwen3-30b-a3b gpt-oss-120b mixtral-8x7b deepseek-v3}; do
    for round in 1 2; do
      for mode in off on; do
        echo "== $model stream-K $mode (round $round)"
        grep -E "^ +[0-9]+ " "$log/ab_${model}_${mode}_$round.log"
      done
    done
  done
}
part_tests() { all_gpu_tests; }
part_bench() { bench_with_peer; }
run_parts "$@"
