#!/usr/bin/env bash
# Device call for the work of 2026-12-05 (parts smoke fixtures tp probe ran that day,
# bench/results/2026-12-05-h200-checkpoint-probe; sharedtp, tests and bench did not):
# gpt-oss's checkpoint layout (HuggingFace MXFP4, fused experts, router bias), tensor-parallel
# ranks loading their slice of every expert (shared experts included), and the decode
# weight-streaming probe (bench/probes/weight_stream_probe.cu).
# Pack first (the probe built here, carried beside the binaries):
#   nvcc -std=c++20 -O3 -gencode arch=compute_90a,code=sm_90a -o /tmp/stream_probe \
#     bench/probes/weight_stream_probe.cu
#   bash scripts/pack-for-device.sh ../shared/peers/triton_peer.py /tmp/stream_probe
# Parts (arguments, in order):
#   smoke     one GPU layer test; the call stops when it fails
#   fixtures  every fixture scheme through `moekit run --checkpoint --device auto` (hf_mxfp4 on
#             tiny-gpt-oss among them: Sm90Mxfp4Experts with gpt-oss's biases and router bias;
#             the compressed-tensors and ModelOpt schemes on the fp8 / int8 / NVFP4 kernels)
#   tp        tensor-parallel ranks on the GPU: hf_mxfp4 (tiny-gpt-oss), bf16 tiny-deepseek (its
#             shared expert sliced) and tiny-llama4 (fused, concatenated gate/up) at --tp 2, each
#             rank checked against float64 by `run`
#   sharedtp  deepseek-v3 --tp 8 at decode and prefill sizes, shared experts auto / folded /
#             separate: the fold decision re-measured now that a rank holds I_s / 8 (one chunk)
#   probe     the weight-streaming probe (prints its markdown table)
#   tests     every GPU test binary (bench/h200_session.sh tests)
#   bench     moekit bench (bf16) and the Triton peer in the same call, the ratio table
# Each part is a function part_NAME, run in order by run_parts (bench/device_prelude.sh), which
# packs everything into $OUT/all*.tgz.
# shellcheck source=bench/device_prelude.sh
. bench/device_prelude.sh
part_smoke() {
  run_gtest smoke 60 build/tests/test_gpu_layer '*SharedExpert*'
  grep -q '^\[  PASSED  \]' "$log/smoke.log" || { pack_logs; exit 1; }
}
part_fixtures() { bash bench/fixtures_gpu.sh; }
part_tp() {
  local fx model scheme rank
  fx=$(mktemp -d)
  for c in "tiny-gpt-oss hf_mxfp4" "tiny-deepseek bf16" "tiny-llama4 bf16"; do
    read -r model scheme <<<"$c"
    build/moekit make-fixture --scheme "$scheme" --model "$model" --out "$fx/$model" >/dev/null
    for rank in 0 1; do
      timeout 60 build/moekit run --checkpoint "$fx/$model" --layer 1 --tp 2 --tp-rank $rank \
        --device auto -m 33 >"$log/tp_${model}_$rank.log" 2>&1
      echo "tp $model $scheme rank $rank rc=$? $(grep -h 'check' "$log/tp_${model}_$rank.log" | tail -n 1)"
    done
  done
}
part_sharedtp() {
  local mode
  for mode in auto folded separate; do
    timeout 150 build/moekit bench --models deepseek-v3 --tp 8 --shared-experts $mode \
      --tokens 1 64 1024 16384 --reps 20 >"$log/sharedtp_$mode.log" 2>&1
    echo "== deepseek-v3 --tp 8 --shared-experts $mode rc=$?"
    grep -E '^ +[0-9]+ ' "$log/sharedtp_$mode.log" | cut -c1-60
  done
}
part_probe() {
  if [ -x .carry/stream_probe ]; then
    timeout 200 .carry/stream_probe | tee "$log/stream_probe.md"
  else
    echo "probe: .carry/stream_probe was not carried"
  fi
}
part_tests() { all_gpu_tests; }
part_bench() { bench_with_peer mxfp4_w4a16; }
run_parts "$@"
