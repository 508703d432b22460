#!/usr/bin/env bash
# Device call for the one-token decode GEMMs (2026-12-06): where do the swap-AB rows wait?
# Nsight Compute, full set with source-level warp-stall sampling, on the layer's GEMM launches at
# M = 1 (qwen3-30b-a3b: GEMM1 32x64 = swapab_kernel, GEMM2 16x64tma = ws_swapab_kernel;
# gpt-oss-120b), then the GPU tests and the bf16 bench with the Triton peer.
# Pack first: bash scripts/pack-for-device.sh ../shared/peers/triton_peer.py
# Parts (arguments, in order):
#   ncu    the profiles: details page and per-SASS-instruction stall samples (CSV) per model
#   tests  every GPU test binary (bench/h200_session.sh tests)
#   bench  moekit bench (bf16) and the Triton peer in the same call, the ratio table; then
#          gpt-oss-120b under each scheme of $BENCH_QUANT
# shellcheck source=bench/device_prelude.sh
. bench/device_prelude.sh
part_ncu() {
  local model rep
  for model in ${NCU_MODELS:-qwen3-30b-a3b gpt-oss-120b}; do
    rep=$log/ncu_$model
    timeout 240 ncu --clock-control none --set full --import-source no -k regex:swapab \
      --launch-count 2 -f -o "$rep" build/moekit bench --models "$model" --tokens 1 --reps 1 \
      >"$log/ncu_${model}_run.log" 2>&1
    echo "ncu $model rc=$?"
    ncu -i "$rep.ncu-rep" --page details >"$rep.details.txt" 2>&1
    ncu -i "$rep.ncu-rep" --page source --csv --print-source sass >"$rep.sass.csv" 2>&1
    grep -E "swapab|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Grid Size|Registers Per|Dynamic Shared|One or More Eligible|Issued Warp|No Eligible" \
      "$rep.details.txt" | head -40
  done
}
part_tests() { all_gpu_tests; }
part_bench() { bench_with_peer ${BENCH_QUANT:-}; }
run_parts "$@"
