#!/usr/bin/env bash
# Device call for the exchanges on GPU ranks, the batched fp8 experts and MXFP6 x fp8
# (2026-12-06), sized for one call of at most 600 s:
# Pack first: bash scripts/pack-for-device.sh ../shared/peers/triton_peer.py
# Parts (arguments, in order):
#   tests     every GPU test binary (bench/h200_session.sh tests; the NCCL exchanges at world
#             size 1, the batched fp8 experts and the MXFP6 x fp8 sweep among them)
#   quick     the binaries this work touches, filtered (a short call)
#   memcheck  compute-sanitizer memcheck on the exchange layers and the batched fp8 experts
#   fp8bench  moekit bench --quant fp8_per_tensor / fp8_block128 and the Triton peer's fp8 at
#             decode sizes on qwen3-30b-a3b (the swap-AB rows' transposed epilogue), ratio tables
#   batched   moekit bench of the batched bf16 experts (forced) and the grouped ones, decode sizes
#   bench     moekit bench (bf16) and the Triton peer in the same call
#   eppeer    the peer-memory expert-parallel tests (two forked ranks on the one GPU), both
#             forms of a forward (the launch sequence, the one persistent launch)
#   eppeermem compute-sanitizer memcheck on them
# shellcheck source=bench/device_prelude.sh
. bench/device_prelude.sh
part_tests() {
  OUT=$log timeout 330 bash bench/h200_session.sh tests >/dev/null 2>&1
  cat "$log/summary.txt" 2>/dev/null
  grep -hE "^\[  FAILED|Failure" "$log"/test_*.log | head -20
}
part_quick() {  # the binaries this work touches, filtered; results printed as they come
  run_gtest nccl 60 build/tests/test_gpu_comm_nccl
  run_gtest quantized 120 build/tests/test_gpu_quantized \
    'QuantizedGpu.BatchedFp8*:QuantizedGpu.DeviceQuantizer*:*mxfp6_e3m2_a8*:*mxfp6_e2m3_a8_small_M*:*fp8_per_tensor_small_M*:*fp8_block128_small_h320*'
  run_gtest layer 90 build/tests/test_gpu_layer 'GpuLayer.Batched*:GpuLayer.CudaGraph*'
  run_gtest grouped 90 build/tests/test_grouped_gemm
}
part_memcheck() {
  timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 build/tests/test_gpu_comm_nccl \
    --gtest_brief=1 --gtest_filter='NcclExchangeLayer.*:NcclLowLatencyKernel.*' \
    >"$log/nccl_memcheck.log" 2>&1
  echo "memcheck nccl rc=$? $(grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' "$log/nccl_memcheck.log" | tr '\n' ' ')"
  timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 build/tests/test_gpu_quantized \
    --gtest_brief=1 --gtest_filter='QuantizedGpu.BatchedFp8*' >"$log/batched_fp8_memcheck.log" 2>&1
  echo "memcheck batched fp8 rc=$? $(grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' "$log/batched_fp8_memcheck.log" | tr '\n' ' ')"
}
part_fp8bench() {
  OUT=$log QUANT=fp8_per_tensor,fp8_block128 QUANT_MODELS=qwen3-30b-a3b \
    TENSOR_MODELS=qwen3-30b-a3b QUANT_TOKENS=1,16,64,256 timeout 110 \
    bash bench/h200_session.sh quant peerq >/dev/null 2>&1
  for f in "$log"/bench_fp8_*.log; do grep -E "^ +[0-9]" "$f"; done
  cat "$log"/ratio_fp8*.md 2>/dev/null | tail -n 20
}
part_batched() {  # the batched experts' tiles (T * top_k bound) beside the grouped ones
  local b
  for b in sm90_batched auto; do
    timeout 60 build/moekit bench --backend "$b" --models qwen3-30b-a3b --tokens 1 16 64 \
      --max-tokens 64 >"$log/bench_backend_$b.log" 2>&1
    echo "bench --backend $b rc=$?"
    grep -E "experts:|^ +[0-9]" "$log/bench_backend_$b.log"
  done
}
part_bench() { bench_with_peer ${BENCH_QUANT:-}; }
part_eppeer() {
  timeout 240 build/tests/test_gpu_ep_peer --gtest_brief=1 >"$log/ep_peer.log" 2>&1
  echo "ep_peer rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$log/ep_peer.log" | tr '\n' ' ')"
  grep -E "FAILED|Failure|Expected|Which is|barrier|rror" "$log/ep_peer.log" | head -30
  awk '/rel_l2/ {n++; if ($NF > max) max = $NF} END {print n " checks, max rel_l2 " max}' \
    "$log/ep_peer.log"
}
part_eppeermem() {
  timeout 280 compute-sanitizer --tool memcheck --error-exitcode 9 build/tests/test_gpu_ep_peer \
    --gtest_brief=1 >"$log/ep_peer_memcheck.log" 2>&1
  echo "memcheck ep_peer rc=$? $(grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' \
    "$log/ep_peer_memcheck.log" | tr '\n' ' ')"
}
run_parts "$@"
