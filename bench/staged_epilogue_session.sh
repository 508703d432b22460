#!/usr/bin/env bash
# Device calls for the staged epilogue of the 128x256 rows (sm90/epilogue.cuh,
# store_warpgroup_tile_staged: 64 columns at a time through shared memory, then whole 128-byte
# lines of C). Call 1 staged the fused epilogue too (GEMM1: slower; since plain only).
# Parts (arguments, in order):
#   tests  test_grouped_gemm (every row: plain, fused, padded and 4-byte-aligned C rows),
#          test_gpu_layer, the 8-bit tile sweep of test_gpu_quantized
#   ab     build_old/moekit (0a59684, the same GEMM kernels as the commit before) and
#          build/moekit, one process each: bf16 and fp8 layers at prefill sizes (the GEMM stages)
#   peer   the Triton peer's bf16 on the ab shapes, the ratio table against build/moekit
#   sanitize memcheck / racecheck on the 4-byte-aligned C test (both epilogue paths)
# Each part is a function part_NAME, run in order by run_parts (bench/device_prelude.sh), which
# packs everything into $OUT/all*.tgz.
# shellcheck source=bench/device_prelude.sh
. bench/device_prelude.sh
unpack_old_binary || exit 1
# One bench: ab_bench NAME BINARY ARGS...; prints NAME and, per size, the layer and its GEMMs.
ab_bench() {
  ab_run "$@"
  grep -E '^ +[0-9]+ ' "$log/ab_$1.log" |
    sed -E 's/^ +([0-9]+) +([0-9.]+) .*(gemm1 [0-9.]+).*(gemm2 [0-9.]+).*/M=\1 \2 us: \3 \4/' |
    head -16
}
part_tests() {
  run_gtest test_grouped_gemm 200 build/tests/test_grouped_gemm
  run_gtest test_gpu_layer 150 build/tests/test_gpu_layer
  run_gtest test_gpu_quantized_tiles 150 build/tests/test_gpu_quantized \
    'QuantizedGpu.Every8BitTileMatchesEmulation'
}
ab_cases() {
  echo "bf16 --models mixtral-8x7b qwen3-30b-a3b deepseek-v3 gpt-oss-120b --tokens 1024 4096 16384"
  echo "fp8tensor --quant fp8_per_tensor --models mixtral-8x7b qwen3-30b-a3b --tokens 4096 16384"
  echo "fp8block --quant fp8_block128 --plain-topk --models qwen3-30b-a3b --tokens 4096 16384"
}
part_ab() {
  local name args
  while read -r name args; do
    # shellcheck disable=SC2086
    ab_bench "${name}_old" build_old/moekit $args
    # shellcheck disable=SC2086
    ab_bench "${name}_new" build/moekit $args
  done < <(ab_cases | head -n "${AB_CASES:-3}")
}
part_peer() {
  PYTHONUNBUFFERED=1 timeout 150 python3 .carry/triton_peer.py \
    --shapes mixtral-8x7b,qwen3-30b-a3b,deepseek-v3,gpt-oss-120b --tokens 1024,4096,16384 \
    --json "$log/peer_bf16.json" >"$log/peer_bf16.log" 2>&1
  python3 bench/compare_peer.py "$log/ab_bf16_new.json" "$log/peer_bf16.json" \
    >"$log/ratio_bf16.md" 2>&1
  cat "$log/ratio_bf16.md"
}
part_sanitize() { sanitize_grouped_gemm 60 'GroupedGemm.RowsOfCNotSixteenByteAligned'; }
# AB_CASES=N: the first N cases of ab_cases only (default all 3).
run_parts "$@"
