#!/usr/bin/env bash
# Device call for W4A8 with int4 groups of 128 along K (the kW4A8Group rows, 2026-12-07), sized
# for one call of at most 600 s. Pack first: bash scripts/pack-for-device.sh ../shared/peers/triton_peer.py
# Parts (arguments, in order):
#   kernels   test_grouped_gemm's W4A8 rows against float64 (per channel and groups of 128) and the
#             quantized layers' W4A8 cases against the CPU emulation (every preset and M, every
#             W4A8 tile forced, an expert map, graph replay)
#   memcheck  compute-sanitizer memcheck on the grouped kernels and one layer of each W4A8 form
#   bench     moekit bench --quant w4a8_fp8_g128 / w4a8_fp8 / fp8_per_channel on qwen3-30b-a3b and
#             mixtral-8x7b (decode and prefill sizes)
#   exchange  bench/exchange_gpu_session.sh's quick and eppeer parts (the 2026-12-06 commits'
#             check), logs in exchange/
#   mxfp4     MXFP4 with fp8 activations on the e4m3 rows (sm90_mxfp4_fp8): the kernel test
#             against float64, the layer tests against the CPU emulation and graph replay,
#             compute-sanitizer memcheck on the kernel test
#   mxbench   moekit bench --quant mxfp4_a8 on sm90_mxfp4 (bf16 rows) and sm90_mxfp4_fp8 (e4m3
#             rows), qwen3-30b-a3b and mixtral-8x7b
#   rows      moekit bench --quant w4a8_fp8 with each W4A8 prefill row forced (W4A8_ROWS) and
#             fp8_per_channel, qwen3-30b-a3b and mixtral-8x7b at prefill sizes
#   peer      moekit bench --quant w4a8_fp8 / fp8_per_tensor (auto rows) and the Triton peer's fp8
#             per-tensor layer on qwen3-30b-a3b and mixtral-8x7b, M = 1 .. 16384, with the ratios
#   profile   bench/w4a8_profile.sh (Nsight Compute on the W4A8 prefill and decode kernels, their
#             SASS with per-instruction stall samples), its logs in profile/
# shellcheck source=bench/device_prelude.sh
. bench/device_prelude.sh
part_kernels() {
  run_gtest grouped_w4a8 120 build/tests/test_grouped_gemm 'GroupedGemmW4A8*'
  grep -h "^\[w4a8\]" "$log/grouped_w4a8.log"
  run_gtest quantized_w4a8 240 build/tests/test_gpu_quantized \
    '*w4a8*:QuantizedGpu.Every8BitTile*:QuantizedGpu.ExpertMap*:QuantizedGpu.CudaGraph*'
  grep -h "^\[quantized\] w4a8" "$log/quantized_w4a8.log" | sort -t' ' -k3,3 | head -60
}
part_memcheck() {
  timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 build/tests/test_grouped_gemm \
    --gtest_brief=1 --gtest_filter='GroupedGemmW4A8*' >"$log/w4a8_memcheck.log" 2>&1
  echo "memcheck grouped w4a8 rc=$? $(grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' "$log/w4a8_memcheck.log" | tr '\n' ' ')"
  timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 build/tests/test_gpu_quantized \
    --gtest_brief=1 --gtest_filter='*w4a8_fp8*small_M33*:*w4a8_fp8*small_M257*' \
    >"$log/w4a8_layer_memcheck.log" 2>&1
  echo "memcheck layers w4a8 rc=$? $(grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' "$log/w4a8_layer_memcheck.log" | tr '\n' ' ')"
}
part_bench() {
  local q
  for q in w4a8_fp8_g128 w4a8_fp8 fp8_per_channel; do
    # shellcheck disable=SC2086  # one argument per size
    timeout 120 build/moekit bench --quant "$q" --models qwen3-30b-a3b mixtral-8x7b \
      --tokens ${W4A8_TOKENS:-1 64 1024 16384} --json "$log/bench_$q.json" >"$log/bench_$q.log" 2>&1
    echo "bench --quant $q rc=$?"
    grep -E "^[a-z0-9-]+:|experts:|^ +[0-9]" "$log/bench_$q.log"
  done
}
part_exchange() {  # its own logs, packed into $out/exchange/ (it packs and removes its log dir)
  OUT=$out/exchange bash bench/exchange_gpu_session.sh quick eppeer
}
part_mxfp4() {
  run_gtest grouped_mxfp4 150 build/tests/test_grouped_gemm 'GroupedGemmMxfp4Fp8*'
  grep -h "^\[mxfp4_fp8\]" "$log/grouped_mxfp4.log"
  run_gtest quantized_mxfp4 240 build/tests/test_gpu_quantized \
    'QuantizedGpu.Mxfp4Fp8*:QuantizedGpu.CudaGraph*'
  grep -h "^\[mxfp4_fp8\]" "$log/quantized_mxfp4.log" | head -60
  timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 build/tests/test_grouped_gemm \
    --gtest_brief=1 --gtest_filter='GroupedGemmMxfp4Fp8*' >"$log/mxfp4_memcheck.log" 2>&1
  echo "memcheck grouped mxfp4_fp8 rc=$? $(grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' "$log/mxfp4_memcheck.log" | tr '\n' ' ')"
}
part_mxbench() {
  local b
  for b in sm90_mxfp4 sm90_mxfp4_fp8; do
    # shellcheck disable=SC2086  # one argument per size
    timeout 120 build/moekit bench --quant mxfp4_a8 --backend "$b" \
      --models qwen3-30b-a3b mixtral-8x7b --tokens ${W4A8_TOKENS:-1 64 1024 16384} \
      --json "$log/bench_mxfp4_a8_$b.json" >"$log/bench_mxfp4_a8_$b.log" 2>&1
    echo "bench --quant mxfp4_a8 --backend $b rc=$?"
    grep -E "^[a-z0-9-]+:|experts:|^ +[0-9]" "$log/bench_mxfp4_a8_$b.log"
  done
}
part_rows() {
  local t
  for t in ${W4A8_ROWS:-128x256 256x128}; do
    # shellcheck disable=SC2086  # one argument per size
    timeout 120 build/moekit bench --quant w4a8_fp8 --tile "$t" --models qwen3-30b-a3b mixtral-8x7b \
      --tokens ${W4A8_TOKENS:-4096 16384} --json "$log/bench_rows_$t.json" >"$log/bench_rows_$t.log" 2>&1
    echo "bench --quant w4a8_fp8 --tile $t rc=$?"
    grep -E "^[a-z0-9-]+:|experts:|^ +[0-9]" "$log/bench_rows_$t.log"
  done
  # shellcheck disable=SC2086
  timeout 120 build/moekit bench --quant fp8_per_channel --models qwen3-30b-a3b mixtral-8x7b \
    --tokens ${W4A8_TOKENS:-4096 16384} >"$log/bench_rows_fp8.log" 2>&1
  echo "bench --quant fp8_per_channel rc=$?"
  grep -E "^[a-z0-9-]+:|experts:|^ +[0-9]" "$log/bench_rows_fp8.log"
}
part_peer() {
  local q
  for q in w4a8_fp8 fp8_per_tensor; do
    timeout 150 build/moekit bench --quant "$q" --models qwen3-30b-a3b mixtral-8x7b \
      --tokens 1 64 1024 4096 16384 --json "$log/bench_peer_$q.json" >"$log/bench_peer_$q.log" 2>&1
    echo "bench --quant $q rc=$?"
    grep -E "^[a-z0-9-]+:|experts:|^ +[0-9]" "$log/bench_peer_$q.log"
  done
  PYTHONUNBUFFERED=1 timeout 150 python3 .carry/triton_peer.py --dtype fp8tensor \
    --shapes qwen3-30b-a3b,mixtral-8x7b --tokens 1,64,1024,4096,16384 \
    --json "$log/peer_fp8tensor.json" >"$log/peer_fp8tensor.log" 2>&1
  echo "peer fp8tensor rc=$?"
  for q in w4a8_fp8 fp8_per_tensor; do
    python3 bench/compare_peer.py "$log/bench_peer_$q.json" "$log/peer_fp8tensor.json" \
      --dtype fp8tensor >"$log/ratio_$q.md" 2>&1
    echo "== peer fp8tensor / moekit $q"
    cat "$log/ratio_$q.md"
  done
}
part_profile() {  # its own logs, packed into $out/profile/
  OUT=$out/profile timeout 300 bash bench/w4a8_profile.sh
}
run_parts "$@"
