#!/usr/bin/env bash
# Device call for the mma.sync decode row of the W4A16 family (MainloopKind::kMmaDecode, tile
# 8x64mma). Parts (arguments, in order):
#   gemm       the W4A16 / NVFP4 / MXFP6 grouped GEMM tests (every row of the family) and the
#              packed-weight layer cases of test_gpu_quantized (every tile forced)
#   sanitizer  memcheck and racecheck on the random-problem grouped GEMM tests of the family
#   tune       moekit tune at decode sizes (every candidate's time): MXFP4 W4A16 on gpt-oss-120b
#              and qwen3-30b-a3b, MXFP6 e2m3 on gpt-oss-120b
#   tests      every GPU test binary (bench/h200_session.sh tests)
#   bench      bench/mxfp6_session.sh bench: bf16 bench with the Triton peer, gpt-oss-120b MXFP4 /
#              MXFP6 layers
# Everything is packed into $OUT/all*.tgz (pack_logs).
# shellcheck source=bench/device_prelude.sh
. bench/device_prelude.sh
for part in "$@"; do
  t0=$(date +%s)
  case $part in
    gemm)
      timeout 200 build/tests/test_grouped_gemm --gtest_brief=1 \
        --gtest_filter='GroupedGemmMxfp6*:GroupedGemmW4A16*:GroupedGemmNvfp4*' \
        >"$log/test_grouped_gemm_w4.log" 2>&1
      echo "test_grouped_gemm (w4) rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$log/test_grouped_gemm_w4.log" | tr '\n' ' ')"
      grep -E "FAILED|Failure" "$log/test_grouped_gemm_w4.log" | head -20
      timeout 200 build/tests/test_gpu_quantized --gtest_brief=1 \
        --gtest_filter='*Every8BitTile*:*mxfp6*tiny*' >"$log/test_gpu_quantized_tiles.log" 2>&1
      echo "test_gpu_quantized (tiles) rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$log/test_gpu_quantized_tiles.log" | tr '\n' ' ')"
      grep -E "FAILED|Failure|Expected|Which is" "$log/test_gpu_quantized_tiles.log" | head -20
      ;;
    sanitizer)
      for tool in memcheck racecheck; do
        timeout 150 compute-sanitizer --tool $tool build/tests/test_grouped_gemm --gtest_brief=1 \
          --gtest_filter='GroupedGemmW4A16.RandomProblem*:GroupedGemmNvfp4.RandomProblem*:GroupedGemmMxfp6.RandomProblem*'
      done >"$log/sanitizer.log" 2>&1
      grep -h "SUMMARY" "$log/sanitizer.log"
      ;;
    tune)
      timeout 120 build/moekit tune --quant mxfp4_w4a16 --models gpt-oss-120b qwen3-30b-a3b \
        --tokens 1 4 16 64 --reps 5 --out "$log/h200_mxfp4_decode.json" >"$log/tune_mxfp4.log" 2>&1
      grep -E "tune M=|wrote" "$log/tune_mxfp4.log"
      timeout 60 build/moekit tune --quant mxfp6_e2m3 --models gpt-oss-120b --tokens 1 16 \
        --reps 5 --out "$log/h200_mxfp6_decode.json" >"$log/tune_mxfp6.log" 2>&1
      grep -E "tune M=|wrote" "$log/tune_mxfp6.log"
      ;;
    tests)
      OUT=$log timeout 300 bash bench/h200_session.sh tests >/dev/null 2>&1
      cat "$log/summary.txt"
      ;;
    bench)  # packs the logs so far with its own (all.tgz); what follows goes to all-2.tgz
      bash bench/mxfp6_session.sh bench
      mkdir -p "$log"
      ;;
    *) echo "unknown part $part" ;;
  esac
  echo "($part: $(($(date +%s) - t0)) s)"
done
pack_logs
