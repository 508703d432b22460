#!/usr/bin/env bash
# Device call for the exchanges on GPU ranks (2026-12-06): the NCCL tests (world size 1: every
# prepare/finalize on GPU ranks against the same layer without exchange) and compute-sanitizer
# memcheck on them, then every GPU test and the bench with the Triton peer.
# Pack first: bash scripts/pack-for-device.sh ../shared/peers/triton_peer.py
# Parts (arguments, in order):
#   nccl   build/tests/test_gpu_comm_nccl, then memcheck on its exchange tests; the batched fp8
#          experts' and the device quantizer's tests, memcheck on the former
#   tests  every GPU test binary (bench/h200_session.sh tests)
#   bench  moekit bench (bf16) and the Triton peer in the same call; then gpt-oss-120b under each
#          scheme of $BENCH_QUANT
# shellcheck source=bench/device_prelude.sh
. bench/device_prelude.sh
part_nccl() {
  run_gtest nccl 240 build/tests/test_gpu_comm_nccl
  timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 build/tests/test_gpu_comm_nccl \
    --gtest_brief=1 --gtest_filter='NcclExchangeLayer.*:NcclLowLatencyLayer.*' \
    >"$log/nccl_memcheck.log" 2>&1
  echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' "$log/nccl_memcheck.log" | tr '\n' ' ')"
  run_gtest batched_fp8 240 build/tests/test_gpu_quantized 'QuantizedGpu.BatchedFp8*:QuantizedGpu.DeviceQuantizer*'
  timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 build/tests/test_gpu_quantized \
    --gtest_brief=1 --gtest_filter='QuantizedGpu.BatchedFp8*' >"$log/batched_fp8_memcheck.log" 2>&1
  echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' "$log/batched_fp8_memcheck.log" | tr '\n' ' ')"
}
part_tests() { all_gpu_tests; }
part_bench() { bench_with_peer ${BENCH_QUANT:-}; }
run_parts "$@"
