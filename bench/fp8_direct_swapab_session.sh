#!/usr/bin/env bash
# Device call for the fp8 direct-accumulation rows and the W4A16 swap-AB decode row: every GPU
# test, compute-sanitizer on the new kernels, moekit bench --quant for fp8 per-tensor /
# per-channel (mixtral-8x7b, qwen3-30b-a3b) and MXFP4 W4A16 (gpt-oss-120b), the Triton peer in
# fp8tensor on the same shapes; everything packed into $OUT/all.tgz (the device tool returns few
# files). Parts (arguments, in order): tests w4a16 fp8 ncu (the swap-AB kernel at M=64) bf16
# (moekit bench on gpt-oss-120b, the W4A16 comparison) fp8block (block-128 on deepseek-v3,
# qwen3-30b-a3b and mixtral-8x7b with plain top-k routing, auto and forced 128x256 tiles, and the
# peer's fp8block on the same shapes) ncufp8 (ncu of the block-scaled and the direct fp8 kernels:
# 128x256 on mixtral-8x7b M=4096, 64x64 on qwen3-30b-a3b M=64) ncusrc (the same two block-scaled
# launches with per-instruction stall samples: ncu --page source, SASS and CUDA lines, as CSV)
# plaintests (every GPU test binary, no sanitizer) tune (moekit tune on qwen3-30b-a3b bf16 and
# explain reading the table it wrote) tunepresets (moekit tune for the presets and schemes in
# $TUNE_SCHEMES, default "bf16 fp8_block128 fp8_per_tensor mxfp4_w4a16", one table per scheme
# named for data/tile_tables/; budget minutes of device time: each scheme builds its layers once)
# fp8decode (fp8 block-128 and per-tensor at M = 1 .. 256, auto and forced 64x64 tiles, the peer's
# fp8block / fp8tensor on the same shapes, ratios; $FP8DECODE_TILES: the tiles) ncuswap (ncu of the fp8 swap-AB kernel at
# qwen3-30b-a3b M = 64, block-128 and per-tensor).
# shellcheck source=bench/device_prelude.sh
. bench/device_prelude.sh
tokens="1 16 64 256 1024 4096 16384"
for part in "$@"; do
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  if [ "$part" = tests ]; then
  timeout 170 bash bench/h200_session.sh tests
  mv "$out"/test_*.log "$out"/summary.txt "$log"/ 2>/dev/null
  grep -h "fp8 accumulation" "$log"/test_grouped_gemm.log
  for tool in memcheck racecheck; do
    timeout 60 compute-sanitizer --tool $tool build/tests/test_grouped_gemm --gtest_brief=1 \
      --gtest_filter='GroupedGemmW4A16.*:GroupedGemmFp8.*'
  done >"$log/sanitizer.log" 2>&1
  grep -h "SUMMARY" "$log/sanitizer.log"
  fi
  if [ "$part" = plaintests ]; then
  timeout 140 bash bench/h200_session.sh tests
  mv "$out"/test_*.log "$out"/summary.txt "$log"/ 2>/dev/null
  cat "$log/summary.txt"
  fi
  if [ "$part" = tune ]; then
  timeout 60 build/moekit tune --models qwen3-30b-a3b --tokens 1 64 1024 16384 --reps 5 \
    --out "$log/h200_bf16_qwen3.json" >"$log/tune_qwen3.log" 2>&1
  tail -n 12 "$log/tune_qwen3.log"
  MOEKIT_TILE_TABLES="$log/h200_bf16_qwen3.json" build/moekit explain --model qwen3-30b-a3b \
    >"$log/explain_tuned.log" 2>&1
  grep -A8 "kernels:" "$log/explain_tuned.log"
  fi
  if [ "$part" = tunepresets ]; then
  for q in ${TUNE_SCHEMES:-bf16 fp8_block128 fp8_per_tensor mxfp4_w4a16}; do
    models="mixtral-8x7b qwen3-30b-a3b deepseek-v3"
    [ "$q" = mxfp4_w4a16 ] && models="gpt-oss-120b"
    [ "$q" = bf16 ] && models="$models gpt-oss-120b"
    timeout 300 build/moekit tune --quant "$q" --models $models --reps 5 \
      --out "$log/h200_$q.json" >"$log/tune_$q.log" 2>&1
    grep -E "tune M=|wrote" "$log/tune_$q.log"
  done
  fi
  if [ "$part" = w4a16 ]; then
  timeout 150 build/moekit bench --quant mxfp4_w4a16 --models gpt-oss-120b --tokens $tokens \
    --json "$log/bench_mxfp4_w4a16.json" >"$log/bench_mxfp4_w4a16.log" 2>&1
  grep -E "^ +[0-9]+ " "$log/bench_mxfp4_w4a16.log"
  fi
  if [ "$part" = fp8 ]; then
  for q in fp8_per_tensor fp8_per_channel; do
    timeout 100 build/moekit bench --quant $q --models mixtral-8x7b qwen3-30b-a3b \
      --tokens $tokens --json "$log/bench_$q.json" >"$log/bench_$q.log" 2>&1
    grep -E "^ +[0-9]+ " "$log/bench_$q.log"
  done
  PYTHONUNBUFFERED=1 timeout 120 python3 .carry/triton_peer.py --dtype fp8tensor \
    --shapes mixtral-8x7b,qwen3-30b-a3b --tokens ${tokens// /,} \
    --json "$log/peer_fp8tensor.json" >"$log/peer_fp8tensor.log" 2>&1
  python3 bench/compare_peer.py "$log/bench_fp8_per_tensor.json" "$log/peer_fp8tensor.json" \
    --dtype fp8tensor >"$log/ratio_fp8tensor.md" 2>&1
  tail -n 30 "$log/ratio_fp8tensor.md"
  fi
  if [ "$part" = fp8block ]; then
  block_models="deepseek-v3 qwen3-30b-a3b mixtral-8x7b"
  timeout 200 build/moekit bench --quant fp8_block128 --plain-topk --models $block_models \
    --tokens $tokens --json "$log/bench_fp8_block128.json" >"$log/bench_fp8_block128.log" 2>&1
  grep -E "^ +[0-9]+ " "$log/bench_fp8_block128.log"
  for tile in 128x256 128x128; do
    timeout 120 build/moekit bench --quant fp8_block128 --plain-topk --models $block_models \
      --tokens 1024 4096 16384 --tile $tile --json "$log/bench_fp8_block128_$tile.json" \
      >"$log/bench_fp8_block128_$tile.log" 2>&1
    grep -E "^ +[0-9]+ " "$log/bench_fp8_block128_$tile.log"
  done
  PYTHONUNBUFFERED=1 timeout 200 python3 .carry/triton_peer.py --dtype fp8block \
    --shapes ${block_models// /,} --tokens 1,64,1024,16384 \
    --json "$log/peer_fp8block.json" >"$log/peer_fp8block.log" 2>&1
  python3 bench/compare_peer.py "$log/bench_fp8_block128.json" "$log/peer_fp8block.json" \
    --dtype fp8block >"$log/ratio_fp8block.md" 2>&1
  tail -n 30 "$log/ratio_fp8block.md"
  fi
  if [ "$part" = fp8decode ]; then
  block_models="deepseek-v3 qwen3-30b-a3b mixtral-8x7b"
  for tile in ${FP8DECODE_TILES:-auto 64x64}; do
    timeout 150 build/moekit bench --quant fp8_block128 --plain-topk --models $block_models \
      --tokens 1 16 64 256 --tile $tile --json "$log/bench_fp8_block128_dec_$tile.json" \
      >"$log/bench_fp8_block128_dec_$tile.log" 2>&1
    grep -E "^ +[0-9]+ " "$log/bench_fp8_block128_dec_$tile.log"
    timeout 100 build/moekit bench --quant fp8_per_tensor --models mixtral-8x7b qwen3-30b-a3b \
      --tokens 1 16 64 256 --tile $tile --json "$log/bench_fp8_per_tensor_dec_$tile.json" \
      >"$log/bench_fp8_per_tensor_dec_$tile.log" 2>&1
    grep -E "^ +[0-9]+ " "$log/bench_fp8_per_tensor_dec_$tile.log"
  done
  PYTHONUNBUFFERED=1 timeout 150 python3 .carry/triton_peer.py --dtype fp8block \
    --shapes ${block_models// /,} --tokens 1,16,64,256 \
    --json "$log/peer_fp8block_dec.json" >"$log/peer_fp8block_dec.log" 2>&1
  PYTHONUNBUFFERED=1 timeout 100 python3 .carry/triton_peer.py --dtype fp8tensor \
    --shapes mixtral-8x7b,qwen3-30b-a3b --tokens 1,16,64,256 \
    --json "$log/peer_fp8tensor_dec.json" >"$log/peer_fp8tensor_dec.log" 2>&1
  for tile in ${FP8DECODE_TILES:-auto 64x64}; do
    python3 bench/compare_peer.py "$log/bench_fp8_block128_dec_$tile.json" \
      "$log/peer_fp8block_dec.json" --dtype fp8block >"$log/ratio_fp8block_dec_$tile.md" 2>&1
    python3 bench/compare_peer.py "$log/bench_fp8_per_tensor_dec_$tile.json" \
      "$log/peer_fp8tensor_dec.json" --dtype fp8tensor >"$log/ratio_fp8tensor_dec_$tile.md" 2>&1
    tail -n 16 "$log/ratio_fp8block_dec_$tile.md" "$log/ratio_fp8tensor_dec_$tile.md"
  done
  fi
  if [ "$part" = ncuswap ]; then
  for q in fp8_block128 fp8_per_tensor; do
    timeout 120 ncu --clock-control none -k regex:fp8_swapab --launch-skip 2 --launch-count 2 \
      --section SpeedOfLight --section Occupancy --section WarpStateStats \
      --section SchedulerStats --section MemoryWorkloadAnalysis \
      build/moekit bench --quant $q --models qwen3-30b-a3b --tokens 64 --reps 3 \
      >"$log/ncu_swap_$q.log" 2>&1
    echo "== ncu fp8_swapab $q qwen3-30b-a3b M=64"
    grep -E "Duration|Throughput|Issued Ipc|Eligible|Active Warps|No Eligible|Registers|DRAM|L2 Hit|Achieved Occ" \
      "$log/ncu_swap_$q.log" | head -40
  done
  fi
  if [ "$part" = ncufp8 ]; then
  for q in fp8_block128 fp8_per_channel; do
    for shape in "ws_tma mixtral-8x7b 4096" "single_role qwen3-30b-a3b 64"; do
      set -- $shape
      timeout 150 ncu --clock-control none -k regex:$1 --launch-skip 2 --launch-count 2 \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy \
        --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
        --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio" \
        build/moekit bench --quant $q --models $2 --tokens $3 --reps 3 \
        >"$log/ncu_${q}_$1.log" 2>&1
      echo "== ncu $q $1 $2 M=$3"
      grep -E "Duration|Throughput|Pipe|Issued Ipc|Eligible|Active Warps|No Eligible|Registers|DRAM|L2 Hit" \
        "$log/ncu_${q}_$1.log" | head -30
      grep -E "stalled" "$log/ncu_${q}_$1.log" | awk '$NF+0 > 0.05' | head -30
    done
  done
  fi
  if [ "$part" = ncusrc ]; then
  for shape in "ws_tma mixtral-8x7b 4096" "single_role qwen3-30b-a3b 64"; do
    set -- $shape
    timeout 150 ncu --clock-control none -k regex:$1 --launch-skip 2 --launch-count 1 \
      --section WarpStateStats --section SourceCounters --import-source yes -f -o "/tmp/src_$1" \
      build/moekit bench --quant fp8_block128 --models $2 --tokens $3 --reps 3 >"$log/ncusrc_$1.log" 2>&1
    for view in sass cuda; do
      ncu -i "/tmp/src_$1.ncu-rep" --page source --csv --print-source $view >"$log/src_$1_$view.csv" 2>&1
    done
    echo "== ncusrc $1: $(wc -l <"$log/src_$1_sass.csv") sass lines, $(wc -l <"$log/src_$1_cuda.csv") cuda lines"
    head -c 600 "$log/src_$1_sass.csv"; echo
  done
  fi
  if [ "$part" = bf16 ]; then
  timeout 60 build/moekit bench --models gpt-oss-120b --tokens $tokens --json "$log/bench_bf16.json" \
    >"$log/bench_bf16.log" 2>&1
  grep -E "^ +[0-9]+ " "$log/bench_bf16.log"
  fi
  if [ "$part" = ncu ]; then
  timeout 200 ncu --clock-control none -k regex:w4a16_swapab --launch-skip 3 --launch-count 2 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section SchedulerStats --section MemoryWorkloadAnalysis \
    build/moekit bench --quant mxfp4_w4a16 --models gpt-oss-120b --tokens 64 \
    >"$log/ncu_swapab.log" 2>&1
  grep -E "Duration|Throughput|Occupancy|Block Limit|Registers|Stall|Issued Ipc|Eligible|Active Warps|No Eligible|One or More|DRAM|L2 Hit|L1/TEX Hit" \
    "$log/ncu_swapab.log" | head -70
  fi
} 2>&1 | tee -a "$log/session.log"
done
rm -f "$out"/memory_invariance.txt "$out"/device.txt
pack_logs
