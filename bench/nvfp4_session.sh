#!/usr/bin/env bash
# Device call for NVFP4 weights with bf16 activations on Hopper (Sm90Nvfp4Experts, the weight-only
# sm90_nvfp4 backend). Parts (arguments, in order):
#   tests     every GPU test binary (plaintests: only that); compute-sanitizer memcheck + racecheck on the NVFP4 grouped
#             GEMM tests and memcheck on NVFP4 layers (H = 320 at M = 33, graph replay)
#   align     moekit bench bf16 on the same models at M = 1 .. 256 (the align stage's cost)
#   quicktests  the W4A16 / NVFP4 grouped GEMM tests and quantized-layer tests only
#   tune      moekit tune: the W4A16 family on gpt-oss-120b (MXFP4; NVFP4 runs the same rows), bf16
#             on gpt-oss-120b and mixtral-8x7b, one table each
#   fixtures  `moekit make-fixture` nvfp4 (W4A4, run weight-only) and nvfp4_w4a16 for tiny and
#             tiny-deepseek, each through `moekit run --checkpoint` on the GPU (float64 check)
#   bench     moekit bench --quant nvfp4_w4a16 and mxfp4_w4a16 on gpt-oss-120b and qwen3-30b-a3b at
#             M = 1 .. 16384 (TB/s counts packed codes + scales), moekit bf16 and the Triton peer
#             (bf16: it has no fp4) on the same shapes, and the ratio tables
# Everything is packed into $OUT/all.tgz (the device tool returns few files).
# shellcheck source=bench/device_prelude.sh
. bench/device_prelude.sh
tokens="1 16 64 256 1024 4096 16384"
models="gpt-oss-120b qwen3-30b-a3b"
for part in "$@"; do
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  if [ "$part" = tests ] || [ "$part" = plaintests ]; then
  timeout 200 bash bench/h200_session.sh tests
  mv "$out"/test_*.log "$out"/summary.txt "$log"/ 2>/dev/null
  cat "$log/summary.txt"
  grep -h "^\[quantized\] nvfp4" "$log/test_gpu_quantized.log" | head -60
  fi
  if [ "$part" = tests ]; then
  {
    for tool in memcheck racecheck; do
      timeout 60 compute-sanitizer --tool $tool build/tests/test_grouped_gemm --gtest_brief=1 \
        --gtest_filter='GroupedGemmNvfp4.*'
    done
    timeout 90 compute-sanitizer --tool memcheck build/tests/test_gpu_quantized --gtest_brief=1 \
      --gtest_filter='*nvfp4_w4a16_small_h320_M33*:*nvfp4_small_M257*:QuantizedGpu.CudaGraph*'
  } >"$log/sanitizer.log" 2>&1
  grep -h "SUMMARY\|PASSED\|FAILED" "$log/sanitizer.log"
  fi
  if [ "$part" = tune ]; then  # tile tables: W4A16 (MXFP4 / NVFP4 share it) and bf16
  timeout ${TUNE_SECONDS:-220} build/moekit tune --quant mxfp4_w4a16 --models gpt-oss-120b --reps 5 \
    --out "$log/h200_w4a16_gpt-oss-120b.json" >"$log/tune_w4a16_gpt-oss-120b.log" 2>&1
  grep -E "tune M=|wrote" "$log/tune_w4a16_gpt-oss-120b.log"
  for m in gpt-oss-120b mixtral-8x7b; do
    timeout 80 build/moekit tune --models $m --reps 5 --out "$log/h200_bf16_$m.json" \
      >"$log/tune_bf16_$m.log" 2>&1
    grep -E "tune M=|wrote" "$log/tune_bf16_$m.log"
  done
  fi
  if [ "$part" = align ]; then  # decode after the token rows moved into align (one launch less)
  timeout 90 build/moekit bench --models $models --tokens 1 16 64 256 \
    --json "$log/bench_bf16_align.json" >"$log/bench_bf16_align.log" 2>&1
  grep -E "^ +[0-9]+ " "$log/bench_bf16_align.log"
  fi
  if [ "$part" = quicktests ]; then  # the packed-W4 kernels' tests only
  build/tests/test_grouped_gemm --gtest_brief=1 --gtest_filter='GroupedGemmW4A16.*:GroupedGemmNvfp4.*' \
    >"$log/test_grouped_gemm_w4.log" 2>&1
  build/tests/test_gpu_quantized --gtest_brief=1 --gtest_filter='*w4a16*:*nvfp4*:QuantizedGpu.*' \
    >"$log/test_gpu_quantized_w4.log" 2>&1
  grep -h "PASSED\|FAILED" "$log/test_grouped_gemm_w4.log" "$log/test_gpu_quantized_w4.log"
  fi
  if [ "$part" = fixtures ]; then
  for scheme in nvfp4 nvfp4_w4a16; do
    for model in tiny tiny-deepseek; do
      echo "== $scheme $model"
      build/moekit make-fixture --scheme $scheme --model $model --out /tmp/fx_${scheme}_$model
      build/moekit run --checkpoint /tmp/fx_${scheme}_$model -m 33 2>&1 | grep -E "^forward|^check|experts|OK|FAIL"
    done
  done >"$log/fixtures.log" 2>&1
  cat "$log/fixtures.log"
  fi
  if [ "$part" = bench ]; then
  for q in nvfp4_w4a16 mxfp4_w4a16; do
    timeout 240 build/moekit bench --quant $q --models $models --tokens $tokens \
      --json "$log/bench_$q.json" >"$log/bench_$q.log" 2>&1
    echo "== $q"
    grep -E "^ +[0-9]+ |experts:" "$log/bench_$q.log"
  done
  timeout 90 build/moekit bench --models $models --tokens $tokens --json "$log/bench_bf16.json" \
    >"$log/bench_bf16.log" 2>&1
  echo "== bf16"
  grep -E "^ +[0-9]+ " "$log/bench_bf16.log"
  models_csv=${models// /,}
  PYTHONUNBUFFERED=1 timeout 150 python3 .carry/triton_peer.py --dtype bf16 --shapes "$models_csv" \
    --tokens ${tokens// /,} --json "$log/peer_bf16.json" >"$log/peer_bf16.log" 2>&1
  for q in nvfp4_w4a16 mxfp4_w4a16 bf16; do
    python3 bench/compare_peer.py "$log/bench_$q.json" "$log/peer_bf16.json" \
      >"$log/ratio_$q.md" 2>&1
    echo "== ratio $q (peer bf16 / moekit)"
    tail -n 20 "$log/ratio_$q.md"
  done
  fi
} 2>&1 | tee -a "$log/session.log"
done
rm -f "$out"/memory_invariance.txt "$out"/device.txt
pack_logs
