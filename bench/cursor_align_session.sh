#!/usr/bin/env bash
# Device calls for the single-role rows loading across work items (RingLoadCursor in
# sm90/grouped_kernels.cuh: the 64x64 rows of the 16-bit, fp8 and int8 families no longer refill
# their ring from empty at every work item) and the one-launch align up to 16384 slots
# (align_chunked_kernel in moe_permute.cu).
# Parts (arguments, in order):
#   tests   test_grouped_gemm (every row, few-CTA schedules), test_moe_support_kernels (align
#           against the host reference at every path's boundaries), test_gpu_layer and the 8-bit
#           tile sweep of test_gpu_quantized
#   align   build_old/moekit and build/moekit alternating, AB_RUNS times (1): bf16 layers at
#           M = 1 .. 4096 (the align stage and the layer)
#   ab      the layer where auto-selection takes 64x64 (9..63 rows per expert), one process each:
#           build_old/moekit (the commit before, unpacked from .carry/moekit-old.tar.xz) and
#           build/moekit alternating, AB_RUNS times (1); bf16, fp8 block-128 and per-tensor
#   wide    the 32-token swap-AB row (32x64) against 16x64 and 64x64, each forced (--tile), at 2 to
#           64 rows per expert: bf16 qwen3-30b-a3b / mixtral-8x7b / gpt-oss-120b, fp8 per-tensor
#           qwen3-30b-a3b / mixtral-8x7b
#   final   moekit tune bf16 on qwen3-30b-a3b (every 16-bit row, the table into $log/tables), then
#           moekit bench bf16 (the four presets, reading that table) and the Triton peer, the
#           ratio table; fp8 per-tensor on qwen3-30b-a3b / mixtral-8x7b at M = 1 .. 256 and the
#           peer's fp8tensor, the ratio table
#   fp8wide the block-128 32x64 row: test_grouped_gemm's fp8 tests and the 8-bit tile sweep, the
#           16x64tma / 32x64 / 64x64 rows forced on qwen3-30b-a3b at 8, 16 and 32 rows per
#           expert, then the auto tiles and the peer's fp8block at M = 1 .. 256, the ratio table
#   all     every GPU test binary (bench/h200_session.sh tests)
#   bench   moekit bench (bf16) and the Triton peer, the ratio table
# Each part is a function part_NAME, run in order by run_parts (bench/device_prelude.sh), which
# packs everything into $OUT/all*.tgz.
# shellcheck source=bench/device_prelude.sh
. bench/device_prelude.sh
if [ ! -x build_old/moekit ] && [ -f .carry/moekit-old.tar.xz ]; then
  tar -xJf .carry/moekit-old.tar.xz || exit 1
fi
# One bench of the A/B: ab_bench NAME BINARY ARGS...; prints NAME and the per-size times.
ab_bench() {
  local name=$1 binary=$2
  shift 2
  timeout 120 "$binary" bench --reps 30 "$@" >"$log/ab_$name.log" 2>&1
  echo "$name rc=$?: $(grep -E '^ +[0-9]+ ' "$log/ab_$name.log" | awk '{printf "%s ", $2}')"
}
part_tests() {
  run_gtest test_grouped_gemm 150 build/tests/test_grouped_gemm
  run_gtest test_moe_support_kernels 100 build/tests/test_moe_support_kernels
  run_gtest test_gpu_layer 150 build/tests/test_gpu_layer
  run_gtest test_gpu_quantized_tiles 150 build/tests/test_gpu_quantized \
    'QuantizedGpu.Every8BitTileMatchesEmulation'
}
part_ab() {
  for run in $(seq 1 "${AB_RUNS:-1}"); do
    for build in build_old build; do
      ab_bench "bf16_${build}_$run" $build/moekit \
        --models mixtral-8x7b qwen3-30b-a3b gpt-oss-120b --tokens 64 256 1024
      ab_bench "fp8block_${build}_$run" $build/moekit --quant fp8_block128 \
        --models qwen3-30b-a3b --tokens 64 256 1024
      ab_bench "fp8tensor_${build}_$run" $build/moekit --quant fp8_per_tensor \
        --models qwen3-30b-a3b mixtral-8x7b --tokens 64 256 1024
    done
  done
}
part_align() {
  for run in $(seq 1 "${AB_RUNS:-1}"); do
    for build in build_old build; do
      ab_bench "align_${build}_$run" $build/moekit \
        --models qwen3-30b-a3b gpt-oss-120b --tokens 1 64 256 512 1024 2048 4096
      grep -E "^ +[0-9]+ " "$log/ab_align_${build}_$run.log" |
        sed -E 's/^ +([0-9]+) +([0-9.]+) .*align ([0-9.]+).*/M=\1 \2 us, align \3/' | tr '\n' ';'
      echo
    done
  done
}
part_wide() {
  for tile in 16x64 32x64 64x64; do
    ab_bench "wide_bf16_$tile" build/moekit --tile $tile \
      --models qwen3-30b-a3b mixtral-8x7b gpt-oss-120b --tokens 32 64 128 256 512 1024
  done
  for tile in 16x64tma 32x64 64x64; do
    ab_bench "wide_fp8tensor_$tile" build/moekit --quant fp8_per_tensor --tile $tile \
      --models qwen3-30b-a3b mixtral-8x7b --tokens 32 64 128 256 512 1024
  done
}
part_final() {
  mkdir -p "$log/tables"
  timeout 150 build/moekit tune --models qwen3-30b-a3b --tokens 1 16 64 256 1024 4096 16384 \
    --reps 5 --out "$log/tables/h200_bf16_qwen3-30b-a3b.json" >"$log/tune_bf16.log" 2>&1
  grep -E "tune M=|wrote" "$log/tune_bf16.log"
  MOEKIT_TILE_TABLES="$log/tables" OUT=$log timeout 240 bash bench/h200_session.sh bench peer \
    >/dev/null 2>&1
  tail -n 32 "$log/ratio.md"
  timeout 90 build/moekit bench --quant fp8_per_tensor --models qwen3-30b-a3b mixtral-8x7b \
    --tokens 1 16 64 128 256 --json "$log/bench_fp8_per_tensor.json" \
    >"$log/bench_fp8_per_tensor.log" 2>&1
  PYTHONUNBUFFERED=1 timeout 90 python3 .carry/triton_peer.py --dtype fp8tensor \
    --shapes qwen3-30b-a3b,mixtral-8x7b --tokens 1,16,64,128,256 \
    --json "$log/peer_fp8tensor.json" >"$log/peer_fp8tensor.log" 2>&1
  python3 bench/compare_peer.py "$log/bench_fp8_per_tensor.json" "$log/peer_fp8tensor.json" \
    --dtype fp8tensor >"$log/ratio_fp8tensor.md" 2>&1
  cat "$log/ratio_fp8tensor.md"
}
part_fp8wide() {
  run_gtest test_grouped_gemm_fp8 100 build/tests/test_grouped_gemm 'GroupedGemmFp8.*'
  run_gtest test_gpu_quantized_tiles 150 build/tests/test_gpu_quantized \
    'QuantizedGpu.Every8BitTileMatchesEmulation'
  for tile in 16x64tma 32x64 64x64; do
    ab_bench "fp8block_$tile" build/moekit --quant fp8_block128 --tile $tile \
      --models qwen3-30b-a3b --tokens 128 256 512
  done
  timeout 90 build/moekit bench --quant fp8_block128 --models qwen3-30b-a3b \
    --tokens 1 16 64 128 256 --json "$log/bench_fp8_block128.json" \
    >"$log/bench_fp8_block128.log" 2>&1
  PYTHONUNBUFFERED=1 timeout 90 python3 .carry/triton_peer.py --dtype fp8block \
    --shapes qwen3-30b-a3b --tokens 1,16,64,128,256 \
    --json "$log/peer_fp8block.json" >"$log/peer_fp8block.log" 2>&1
  python3 bench/compare_peer.py "$log/bench_fp8_block128.json" "$log/peer_fp8block.json" \
    --dtype fp8block >"$log/ratio_fp8block.md" 2>&1
  cat "$log/ratio_fp8block.md"
}
part_all() { all_gpu_tests; }
part_bench() { bench_with_peer; }
run_parts "$@"
