#!/usr/bin/env bash
# Device call for the 16-bit swap-AB decode row (tile "16x64" of the k16Bit family: the fp8
# swap-AB kernel on bf16 / f16 operands). Parts (arguments, in order):
#   tests     every GPU test binary; compute-sanitizer memcheck + racecheck on the 16-bit grouped
#             GEMM tests that walk every row of the family (the new one included)
#   tiles     moekit bench bf16 at M = 1 .. 256 on the four presets with the tile forced to each
#             of $TILES (default "16x64 64x64")
#   fp8tiles  moekit bench fp8 block-128 (deepseek-v3, qwen3-30b-a3b; routed like the peer) and
#             per-tensor (qwen3-30b-a3b, mixtral-8x7b) at M = 1 .. 256, each of $FP8_TILES
#             (default "16x64 16x64tma")
#   fp8peer   the fp8 decode rows as auto-selected: fp8 block-128 (deepseek-v3, qwen3-30b-a3b; routed
#             like the peer) and per-tensor (qwen3-30b-a3b, mixtral-8x7b) at M = 1 .. 256, the
#             Triton peer's fp8block / fp8tensor on the same shapes, the ratio tables; before them
#             the grouped GEMM tests and QuantizedGpu.Every8BitTileMatchesEmulation
#   tune      moekit tune bf16 on $TUNE_MODELS (default: the four presets; every 16-bit row timed
#             at M = 1 .. 16384), one table each in logs/tables/, named for data/tile_tables/
#   bench     moekit bench bf16 (4 presets x 7 batch sizes, auto tiles, reading the tables the tune
#             part wrote through MOEKIT_TILE_TABLES) and the Triton peer in the same call, the
#             ratio table
# Everything is packed into $OUT/all.tgz (the device tool returns few files).
# shellcheck source=bench/device_prelude.sh
. bench/device_prelude.sh
presets="mixtral-8x7b qwen3-30b-a3b deepseek-v3 gpt-oss-120b"
for part in "$@"; do
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  if [ "$part" = tests ]; then
  timeout 200 bash bench/h200_session.sh tests
  mv "$out"/test_*.log "$out"/summary.txt "$log"/ 2>/dev/null
  cat "$log/summary.txt"
  for tool in memcheck racecheck; do
    timeout 90 compute-sanitizer --tool $tool build/tests/test_grouped_gemm --gtest_brief=1 \
      --gtest_filter='GroupedGemm.FewCtasManyItemsPerCta:GroupedGemm.AwkwardScheduleGatherPaddingFp32Bias:GroupedGemmFused.BatchedFewCtasNoBias'
  done >"$log/sanitizer.log" 2>&1
  timeout 120 compute-sanitizer --tool memcheck build/tests/test_grouped_gemm --gtest_brief=1 \
    --gtest_filter='GroupedGemmFp8.*' >>"$log/sanitizer.log" 2>&1
  timeout 120 compute-sanitizer --tool memcheck build/tests/test_gpu_quantized --gtest_brief=1 \
    --gtest_filter='QuantizedGpu.Every8BitTileMatchesEmulation' >>"$log/sanitizer.log" 2>&1
  timeout 60 compute-sanitizer --tool memcheck build/tests/test_gpu_layer --gtest_brief=1 \
    --gtest_filter='GpuLayer.CudaGraphReplayIsBitwiseEqual*:GpuLayer.BatchedFormatMatchesReference' \
    >>"$log/sanitizer.log" 2>&1
  grep -h "SUMMARY\|PASSED\|FAILED" "$log/sanitizer.log"
  fi
  if [ "$part" = tiles ]; then
  for tile in ${TILES:-16x64 64x64}; do
    timeout 120 build/moekit bench --models $presets --tokens 1 16 64 256 --tile $tile \
      --json "$log/bench_tile_$tile.json" >"$log/bench_tile_$tile.log" 2>&1
    echo "== tile $tile"
    grep -E "^[a-z]|^ +[0-9]+ " "$log/bench_tile_$tile.log" | grep -v "weights:"
  done
  fi
  if [ "$part" = fp8tiles ]; then
  for tile in ${FP8_TILES:-16x64 16x64tma}; do
    timeout 100 build/moekit bench --quant fp8_block128 --plain-topk \
      --models deepseek-v3 qwen3-30b-a3b --tokens 1 16 64 256 --tile $tile \
      --json "$log/bench_fp8_block128_$tile.json" >"$log/bench_fp8_block128_$tile.log" 2>&1
    timeout 60 build/moekit bench --quant fp8_per_tensor --models qwen3-30b-a3b mixtral-8x7b \
      --tokens 1 16 64 256 --tile $tile --json "$log/bench_fp8_per_tensor_$tile.json" \
      >"$log/bench_fp8_per_tensor_$tile.log" 2>&1
    echo "== fp8 tile $tile"
    grep -hE "^[a-z]|^ +[0-9]+ " "$log/bench_fp8_block128_$tile.log" \
      "$log/bench_fp8_per_tensor_$tile.log" | grep -v "weights:\|experts:"
  done
  fi
  if [ "$part" = fp8peer ]; then
  build/tests/test_grouped_gemm --gtest_brief=1 >"$log/test_grouped_gemm.log" 2>&1
  build/tests/test_gpu_quantized --gtest_brief=1 \
    --gtest_filter='QuantizedGpu.Every8BitTileMatchesEmulation' >"$log/test_gpu_quantized_tiles.log" 2>&1
  grep -h "PASSED\|FAILED" "$log/test_grouped_gemm.log" "$log/test_gpu_quantized_tiles.log"
  timeout 100 build/moekit bench --quant fp8_block128 --plain-topk \
    --models deepseek-v3 qwen3-30b-a3b --tokens 1 16 64 256 \
    --json "$log/bench_fp8_block128.json" >"$log/bench_fp8_block128.log" 2>&1
  timeout 60 build/moekit bench --quant fp8_per_tensor --models qwen3-30b-a3b mixtral-8x7b \
    --tokens 1 16 64 256 --json "$log/bench_fp8_per_tensor.json" \
    >"$log/bench_fp8_per_tensor.log" 2>&1
  PYTHONUNBUFFERED=1 timeout 120 python3 .carry/triton_peer.py --dtype fp8block \
    --shapes deepseek-v3,qwen3-30b-a3b --tokens 1,16,64,256 --json "$log/peer_fp8block.json" \
    >"$log/peer_fp8block.log" 2>&1
  PYTHONUNBUFFERED=1 timeout 90 python3 .carry/triton_peer.py --dtype fp8tensor \
    --shapes qwen3-30b-a3b,mixtral-8x7b --tokens 1,16,64,256 --json "$log/peer_fp8tensor.json" \
    >"$log/peer_fp8tensor.log" 2>&1
  python3 bench/compare_peer.py "$log/bench_fp8_block128.json" "$log/peer_fp8block.json" \
    --dtype fp8block >"$log/ratio_fp8block.md" 2>&1
  python3 bench/compare_peer.py "$log/bench_fp8_per_tensor.json" "$log/peer_fp8tensor.json" \
    --dtype fp8tensor >"$log/ratio_fp8tensor.md" 2>&1
  cat "$log/ratio_fp8block.md" "$log/ratio_fp8tensor.md"
  fi
  if [ "$part" = tune ]; then
  mkdir -p "$log/tables"
  for m in ${TUNE_MODELS:-$presets}; do
    timeout 150 build/moekit tune --models $m --tokens 1 16 64 256 1024 4096 16384 --reps 5 \
      --out "$log/tables/h200_bf16_$m.json" >"$log/tune_bf16_$m.log" 2>&1
    grep -E "tune M=|wrote" "$log/tune_bf16_$m.log"
  done
  MOEKIT_TILE_TABLES="$log/tables" build/moekit explain --model qwen3-30b-a3b \
    >"$log/explain_tuned.log" 2>&1
  grep -A8 "kernels:" "$log/explain_tuned.log"
  fi
  if [ "$part" = bench ]; then
  tables=()
  [ -d "$log/tables" ] && tables=(env "MOEKIT_TILE_TABLES=$log/tables")
  "${tables[@]}" timeout 150 build/moekit bench --models $presets --json "$log/bench_bf16.json" \
    >"$log/bench_bf16.log" 2>&1
  grep -E "^[a-z]|^ +[0-9]+ " "$log/bench_bf16.log" | grep -v "weights:"
  PYTHONUNBUFFERED=1 timeout 150 python3 .carry/triton_peer.py --json "$log/peer_bf16.json" \
    >"$log/peer_bf16.log" 2>&1
  python3 bench/compare_peer.py "$log/bench_bf16.json" "$log/peer_bf16.json" \
    >"$log/ratio_bf16.md" 2>&1
  cat "$log/ratio_bf16.md"
  fi
} 2>&1 | tee -a "$log/session.log"
done
rm -f "$out"/memory_invariance.txt "$out"/device.txt
pack_logs
