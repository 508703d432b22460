#!/usr/bin/env bash
# Device call for the 2-CTA cluster rows (128x256mc: each W tile multicast to two m-tiles), sized
# for one call of at most 600 s. Pack first: bash scripts/pack-for-device.sh ../shared/peers/triton_peer.py
# Parts (arguments, in order):
#   tests     test_grouped_gemm (every 16-bit row on the awkward, batched, fused, few-CTA and graph
#             cases; the fp8 rows against float64) and the quantized layers with every 8-bit row
#             forced (128x256mc on fp8 block-128, per channel, per tensor)
#   memcheck  compute-sanitizer memcheck on the grouped kernels' 16-bit few-CTA case and the fp8
#             float64 test (every row, 128x256mc among them)
#   bench     (= fp8, bf16, block: one part per scheme) moekit bench --plain-topk (routed as the peer), 128x256 against 128x256mc forced,
#             bf16 / fp8 per tensor / fp8 block-128 on mixtral-8x7b, qwen3-30b-a3b, deepseek-v3 at
#             prefill sizes (CLUSTER_TOKENS)
#   peer      the Triton peer's bf16 / fp8 per-tensor / fp8 block layers at the same sizes, and the
#             ratio per case against the bench part's 128x256mc runs
#   profile   Nsight Compute (speed of light, memory workload) on one fp8 per-tensor GEMM launch of
#             each row at mixtral-8x7b M = 16384: L2 and DRAM throughput with and without multicast
#   mxfp4     bench/w4a8_group_session.sh's mxfp4 part (MXFP4 x fp8 layer test, pending)
# shellcheck source=bench/device_prelude.sh
. bench/device_prelude.sh
tokens=${CLUSTER_TOKENS:-4096 16384}
part_tests() {
  run_gtest grouped 300 build/tests/test_grouped_gemm '*'
  grep -h "128x256mc" "$log/grouped.log" | head -20
  run_gtest quantized_tiles 240 build/tests/test_gpu_quantized 'QuantizedGpu.Every8BitTile*'
}
part_memcheck() {
  timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 build/tests/test_grouped_gemm \
    --gtest_brief=1 --gtest_filter='GroupedGemm.FewCtas*:GroupedGemmFp8.LongK*' \
    >"$log/cluster_memcheck.log" 2>&1
  echo "memcheck grouped rc=$? $(grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' "$log/cluster_memcheck.log" | tr '\n' ' ')"
}
bench_one() {  # bench_one QUANT TILE MODELS...
  local q=$1 t=$2
  shift 2
  # shellcheck disable=SC2086  # one argument per size
  timeout 150 build/moekit bench --plain-topk --quant "$q" --tile "$t" --models "$@" --tokens $tokens \
    --json "$log/bench_${q}_$t.json" >"$log/bench_${q}_$t.log" 2>&1
  echo "bench --quant $q --tile $t rc=$?"
  grep -E "^[a-z0-9-]+:|^ +[0-9]" "$log/bench_${q}_$t.log"
}
part_fp8() {
  local t
  for t in 128x256 128x256mc; do bench_one fp8_per_tensor "$t" mixtral-8x7b qwen3-30b-a3b; done
}
part_bf16() {
  local t
  for t in 128x256 128x256mc; do bench_one bf16 "$t" mixtral-8x7b qwen3-30b-a3b deepseek-v3; done
}
part_block() {
  local t
  for t in 128x256 128x256mc; do bench_one fp8_block128 "$t" deepseek-v3 qwen3-30b-a3b; done
}
part_bench() { part_fp8; part_bf16; part_block; }
part_peer() {
  local d q
  for d in bf16:bf16 fp8tensor:fp8_per_tensor fp8block:fp8_block128; do
    q=${d#*:}
    d=${d%%:*}
    PYTHONUNBUFFERED=1 timeout 150 python3 .carry/triton_peer.py --dtype "$d" \
      --shapes mixtral-8x7b,qwen3-30b-a3b,deepseek-v3 --tokens "$(echo $tokens | tr ' ' ,)" \
      --json "$log/peer_$d.json" >"$log/peer_$d.log" 2>&1
    echo "peer $d rc=$?"
    for t in 128x256 128x256mc; do
      python3 bench/compare_peer.py "$log/bench_${q}_$t.json" "$log/peer_$d.json" \
        --dtype "$d" >"$log/ratio_${q}_$t.md" 2>&1
      echo "== peer $d / moekit $q $t"
      cat "$log/ratio_${q}_$t.md"
    done
  done
}
part_profile() {  # Nsight Compute speed of light + memory of one GEMM1 launch per row
  local t name
  for t in 128x256 128x256mc; do
    name=ncu_fp8_tensor_mixtral_$t
    timeout 150 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section LaunchStats -k regex:ws_tma_kernel --launch-skip 2 --launch-count 1 \
      build/moekit bench --quant fp8_per_tensor --tile "$t" --models mixtral-8x7b --tokens 16384 \
      --reps 1 >"$log/$name.log" 2>&1
    echo "== ncu fp8 per tensor mixtral-8x7b M=16384 $t rc=$?"
    grep -E "Duration|Throughput|L2 Cache|L1/TEX Hit|Cluster|Mem Busy|Max Bandwidth" \
      "$log/$name.log" | head -24
  done
}
part_mxfp4() {
  OUT=$out/mxfp4 bash bench/w4a8_group_session.sh mxfp4
}
run_parts "$@"
