#!/usr/bin/env bash
# Device call for the CUDA-core decode rows (MainloopKind::kSimt: 2x64simt for bf16 / f16,
# 1x64simt for MXFP4 / NVFP4 W4A16). Parts (arguments, in order):
#   gemm       test_grouped_gemm (every row of every family, the new rows included) and the
#              W4A16 / NVFP4 layer cases of test_gpu_quantized
#   sanitizer  memcheck and racecheck on the grouped GEMM tests of the new rows' families
#   tune       moekit tune at decode sizes (every candidate's time): bf16 on qwen3-30b-a3b,
#              gpt-oss-120b and mixtral-8x7b at 1 and 16 tokens; MXFP4 W4A16 on gpt-oss-120b
#   tuneqwen   moekit tune bf16 on qwen3-30b-a3b at the shipped table's sizes (1 64 1024 16384)
#   tests      every GPU test binary (bench/h200_session.sh tests)
#   bench      moekit bench (bf16) and the Triton peer, the ratio table; MXFP4 W4A16 on
#              gpt-oss-120b
# Everything is packed into $OUT/all*.tgz (pack_logs).
# shellcheck source=bench/device_prelude.sh
. bench/device_prelude.sh
for part in "$@"; do
  t0=$(date +%s)
  case $part in
    gemm)
      run_gtest test_grouped_gemm 150 build/tests/test_grouped_gemm
      run_gtest test_gpu_quantized_w4 150 build/tests/test_gpu_quantized '*mxfp4*:*nvfp4*'
      ;;
    sanitizer)
      for tool in memcheck racecheck; do
        timeout 120 compute-sanitizer --tool $tool build/tests/test_grouped_gemm --gtest_brief=1 \
          --gtest_filter='GroupedGemm.AwkwardSchedule*:GroupedGemm.FewCtasManyItemsPerCta:GroupedGemmFused.BatchedFewCtasNoBias:GroupedGemmW4A16.RandomProblem*:GroupedGemmNvfp4.RandomProblem*'
      done >"$log/sanitizer.log" 2>&1
      grep -h "SUMMARY" "$log/sanitizer.log"
      ;;
    tune)
      timeout 150 build/moekit tune --models qwen3-30b-a3b gpt-oss-120b mixtral-8x7b --tokens 1 16 \
        --reps 5 --out "$log/h200_bf16_decode.json" >"$log/tune_bf16_decode.log" 2>&1
      grep -E "tune M=|wrote" "$log/tune_bf16_decode.log"
      timeout 120 build/moekit tune --quant mxfp4_w4a16 --models gpt-oss-120b --tokens 1 16 64 \
        --reps 5 --out "$log/h200_mxfp4_decode.json" >"$log/tune_mxfp4.log" 2>&1
      grep -E "tune M=|wrote" "$log/tune_mxfp4.log"
      ;;
    tuneqwen)
      timeout 120 build/moekit tune --models qwen3-30b-a3b --tokens 1 64 1024 16384 --reps 5 \
        --out "$log/h200_bf16_qwen3-30b-a3b.json" >"$log/tune_bf16_qwen3.log" 2>&1
      grep -E "tune M=|wrote" "$log/tune_bf16_qwen3.log"
      ;;
    tests)
      OUT=$log timeout 300 bash bench/h200_session.sh tests >/dev/null 2>&1
      cat "$log/summary.txt"
      ;;
    bench)
      OUT=$log timeout 240 bash bench/h200_session.sh bench peer >/dev/null 2>&1
      tail -n 40 "$log/ratio.md"
      timeout 90 build/moekit bench --quant mxfp4_w4a16 --models gpt-oss-120b \
        --tokens 1 16 64 256 1024 4096 16384 --json "$log/bench_mxfp4_w4a16.json" \
        >"$log/bench_mxfp4_w4a16.log" 2>&1
      grep -E "^ " "$log/bench_mxfp4_w4a16.log" | head -12
      ;;
    *) echo "unknown part $part" ;;
  esac
  echo "($part: $(($(date +%s) - t0)) s)"
done
pack_logs
