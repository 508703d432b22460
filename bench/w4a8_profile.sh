#!/usr/bin/env bash
# Device call: Nsight Compute on the W4A8 GEMM kernels (the prefill 128x256 row at mixtral-8x7b
# M = 16384 and the swap-AB row at M = 1): warp states, scheduler statistics and the stall
# sampling of the source counters, to find what holds the converting producer back. Each case
# also keeps its report and prints its SASS with the per-instruction stall samples
# (ncu_<kernel>_<M>_<tile>_sass.csv: which instruction the L1TEX waits sit on).
# shellcheck source=bench/device_prelude.sh
. bench/device_prelude.sh
ncu_args=(--clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis
          --section WarpStateStats --section SchedulerStats --section SourceCounters
          --section LaunchStats --section Occupancy --page details)
# W4A8_PROFILE_CASES: "kernel M tile [skip [count]]" cases (default: the auto rows at prefill and decode;
# skip: launches of the kernel passed over first, default 3 — with GEMM1 and GEMM2 alternating,
# an odd skip profiles a GEMM2 and an even one a GEMM1; count: launches profiled, default 1);
# W4A8_PROFILE_QUANT: the scheme profiled (default w4a8_fp8; e.g. fp8_per_tensor for the fp8 rows);
# W4A8_PROFILE_MODEL: the preset (default mixtral-8x7b), routed as the peer (--plain-topk).
cases=${W4A8_PROFILE_CASES:-"ws_tma_kernel 16384 auto;ws_swapab_kernel 1 auto"}
quant=${W4A8_PROFILE_QUANT:-w4a8_fp8}
model=${W4A8_PROFILE_MODEL:-mixtral-8x7b}
IFS=';' read -ra case_list <<<"$cases"
for case in "${case_list[@]}"; do
  # shellcheck disable=SC2086  # the case's words as positional arguments
  set -- $case
  skip=${4:-3}
  count=${5:-1}
  name="ncu_${quant}_${model}_$1_$2_$3_skip$skip"
  timeout 200 ncu "${ncu_args[@]}" -k "regex:$1" --launch-skip "$skip" --launch-count "$count" \
    -o "$log/$name" build/moekit bench --plain-topk --quant "$quant" --models "$model" --tokens "$2" \
    --tile "$3" --reps 1 >"$log/$name.log" 2>&1
  echo "== $1 M=$2 tile $3 skip $skip rc=$?"
  ncu -i "$log/$name.ncu-rep" --page details >>"$log/$name.log" 2>&1
  ncu -i "$log/$name.ncu-rep" --page source --csv --print-source sass >"$log/${name}_sass.csv" 2>&1
  grep -E "Stall|stall|Issued|Eligible|Active Warps|No Eligible|Duration|Registers|Warp Cycles|Throughput|Hit Rate|Bandwidth" \
    "$log/$name.log" | head -60
  wc -l "$log/${name}_sass.csv"
done 2>&1 | tee "$log/session.log"
pack_logs
