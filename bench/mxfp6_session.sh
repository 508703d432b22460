#!/usr/bin/env bash
# Device call for MXFP6 weights on the W4A16 kernels (WPacking::kMxfp6E2M3 / kMxfp6E3M2,
# Sm90Mxfp6Experts). Parts (arguments, in order):
#   gemm       the MXFP6 grouped GEMM tests (every W4A16 row, both elements) and the MXFP6 layer
#              cases of test_gpu_quantized (every preset and M, every tile forced)
#   sanitizer  memcheck and racecheck on the MXFP6 grouped GEMM tests
#   tests      every GPU test binary (bench/h200_session.sh tests)
#   bench      moekit bench (bf16) and the Triton peer, the ratio table; gpt-oss-120b MXFP4 W4A16
#              and MXFP6 (e3m2, e2m3) side by side
#   fixtures   every fixture scheme through `moekit run --checkpoint` on the GPU
# Everything is packed into $OUT/all*.tgz (pack_logs).
# shellcheck source=bench/device_prelude.sh
. bench/device_prelude.sh
for part in "$@"; do
  t0=$(date +%s)
  case $part in
    gemm)
      run_gtest test_grouped_gemm_w4 150 build/tests/test_grouped_gemm \
        'GroupedGemmMxfp6*:GroupedGemmW4A16*:GroupedGemmNvfp4*'
      run_gtest test_gpu_quantized_mxfp6 200 build/tests/test_gpu_quantized '*mxfp6*:*Every8BitTile*'
      grep "\[quantized\] mxfp6" "$log/test_gpu_quantized_mxfp6.log" | head -40
      ;;
    sanitizer)
      sanitize_grouped_gemm 150 'GroupedGemmMxfp6.RandomProblem*:GroupedGemmMxfp6.DeviceRepack*'
      ;;
    tests) all_gpu_tests ;;
    bench) bench_with_peer mxfp4_w4a16 mxfp6_e3m2 mxfp6_e2m3 ;;
    fixtures)
      bash bench/fixtures_gpu.sh
      ;;
    *) echo "unknown part $part" ;;
  esac
  echo "($part: $(($(date +%s) - t0)) s)"
done
pack_logs
