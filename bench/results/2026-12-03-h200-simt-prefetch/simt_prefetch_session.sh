#!/usr/bin/env bash
# Device call for the CUDA-core rows' cross-task prefetch (simt_kernel loads a warp's next task's
# first chunk during its current task's last one). The change touches only simt_kernel, so the
# tests are those that run its rows: every grouped GEMM test (every row of every family, the
# 16-bit and W4A16 CUDA-core rows among them), the packed-weight layer cases at M = 1 (where the
# CUDA-core row is selected) and every tile forced; then the decode tune, the MXFP4 layer and the
# bf16 bench with the Triton peer (bench/h200_session.sh bench peer).
# shellcheck source=bench/device_prelude.sh
. bench/device_prelude.sh
t0=$(date +%s)
timeout 120 build/tests/test_grouped_gemm --gtest_brief=1 >"$log/test_grouped_gemm.log" 2>&1
echo "test_grouped_gemm rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$log/test_grouped_gemm.log" | tr '\n' ' ')"
grep -E "FAILED|Failure" "$log/test_grouped_gemm.log" | head -10
timeout 150 build/tests/test_gpu_quantized --gtest_brief=1 \
  --gtest_filter='*mxfp*_M1:*nvfp4*_M1:*Every8BitTile*' >"$log/test_gpu_quantized_m1.log" 2>&1
echo "test_gpu_quantized (M=1, tiles) rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$log/test_gpu_quantized_m1.log" | tr '\n' ' ')"
grep -E "FAILED|Failure" "$log/test_gpu_quantized_m1.log" | head -10
echo "(tests: $(($(date +%s) - t0)) s)"
timeout 90 build/moekit tune --quant mxfp4_w4a16 --models gpt-oss-120b qwen3-30b-a3b --tokens 1 \
  --reps 5 --out "$log/h200_mxfp4_m1.json" >"$log/tune_mxfp4.log" 2>&1
grep -E "tune M=" "$log/tune_mxfp4.log"
timeout 60 build/moekit bench --quant mxfp4_w4a16 --models gpt-oss-120b --tokens 1 16 64 \
  --json "$log/bench_mxfp4_w4a16.json" >"$log/bench_mxfp4_w4a16.log" 2>&1
grep -E "^ " "$log/bench_mxfp4_w4a16.log" | head -8
OUT=$log timeout 200 bash bench/h200_session.sh bench peer >/dev/null 2>&1
tail -n 32 "$log/ratio.md"
echo "(all: $(($(date +%s) - t0)) s)"
pack_logs
