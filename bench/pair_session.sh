#!/usr/bin/env bash
# Device calls for the decode pair (GEMM1 + activation and GEMM2 of a layer in one launch on the
# CUDA-core row: cuda::run_grouped_gemm_pair, simt_pair_kernel).
# Parts (arguments, in order):
#   tests      test_grouped_gemm (the pair against two launches, every row), test_gpu_layer (the
#              layer's pair against its two launches, bitwise) and the packed-W layer cases of
#              test_gpu_quantized (MXFP4 / NVFP4 at one token run as the pair)
#   sanitizer  memcheck, racecheck and synccheck on the pair's grouped-GEMM tests
#   ab         the layer at decode sizes, one process each: bf16 with the tables' tiles, with
#              1x64simt as the pair, and with 1x64simt as two launches (AB_BF16_MODES, default
#              "tables pair two"); MXFP4 W4A16 as the pair and as two launches
#              (MOEKIT_DISABLE_DECODE_PAIR=1); AB_RUNS alternating runs (2)
#   explain    moekit explain of the presets' tiles (the pair's rows named)
#   all        every GPU test binary (bench/h200_session.sh tests)
#   bench      moekit bench (bf16) and the Triton peer, the ratio table; MXFP4 W4A16 on
#              gpt-oss-120b
# Each part is a function part_NAME, run in order by run_parts (bench/device_prelude.sh), which
# packs everything into $OUT/all*.tgz.
# shellcheck source=bench/device_prelude.sh
. bench/device_prelude.sh
part_tests() {
  run_gtest test_grouped_gemm 150 build/tests/test_grouped_gemm
  run_gtest test_gpu_layer 150 build/tests/test_gpu_layer
  run_gtest test_gpu_quantized_w4 150 build/tests/test_gpu_quantized '*mxfp4*:*nvfp4*:*Tile*'
}
part_sanitizer() {
  for tool in memcheck racecheck synccheck; do
    timeout 100 compute-sanitizer --tool $tool build/tests/test_grouped_gemm \
      --gtest_brief=1 --gtest_filter='GroupedGemmPair.*'
  done >"$log/sanitizer.log" 2>&1
  grep -h "SUMMARY\|PASSED\|FAILED" "$log/sanitizer.log"
}
part_ab() {
  models="qwen3-30b-a3b gpt-oss-120b mixtral-8x7b"
  for run in $(seq 1 "${AB_RUNS:-2}"); do
    for mode in ${AB_BF16_MODES:-tables pair two}; do
      args="" env_pair=""
      [ $mode != tables ] && args="--tile 1x64simt"
      [ $mode = two ] && env_pair="MOEKIT_DISABLE_DECODE_PAIR=1"
      env $env_pair timeout 90 build/moekit bench --models $models --tokens 1 2 4 8 --reps 30 \
        $args >"$log/ab_bf16_${mode}_$run.log" 2>&1
      echo "bf16 $mode run $run: $(grep -E '^ +[0-9]+ ' "$log/ab_bf16_${mode}_$run.log" |
        awk '{printf "%s ", $2}')"
    done
    for mode in pair two; do
      env_pair=""
      [ $mode = two ] && env_pair="MOEKIT_DISABLE_DECODE_PAIR=1"
      env $env_pair timeout 90 build/moekit bench --quant mxfp4_w4a16 \
        --models gpt-oss-120b qwen3-30b-a3b --tokens 1 2 4 --reps 30 \
        >"$log/ab_mxfp4_${mode}_$run.log" 2>&1
      echo "mxfp4 $mode run $run: $(grep -E '^ +[0-9]+ ' "$log/ab_mxfp4_${mode}_$run.log" |
        awk '{printf "%s ", $2}')"
    done
  done
  grep -hE "^[a-z].*:|^ +[0-9]+ " "$log/ab_bf16_pair_1.log" "$log/ab_mxfp4_pair_1.log" |
    grep -v "weights:\|experts:" | cut -c1-170
}
part_explain() {
  for model in qwen3-30b-a3b gpt-oss-120b; do
    build/moekit explain --model $model --device h200 2>&1 | grep -E "M=1 |M=16 " | head -4
  done
}
part_all() { all_gpu_tests; }
part_bench() { bench_with_peer mxfp4_w4a16; }
run_parts "$@"
