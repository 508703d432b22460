#!/usr/bin/env bash
# Device call for the shared experts folded into the routed experts: every GPU test (parts
# tests: with compute-sanitizer memcheck on the shared-expert layer tests; plaintests: without),
# then (part shared) moekit bench of the bf16 layers with shared experts (deepseek-v3,
# qwen1.5-moe-a2.7b, and deepseek-v3 with --tp 8) folded and as the separate pass
# (--shared-experts folded / separate) at M = 1 .. 16384, the Triton peer's deepseek-v3 routed
# experts beside them, and the fold's tables (bench/compare_fold.py); part gate: qwen1.5-moe-a2.7b
# alone, folded and separate (the gated shared slots); part hybrid: deepseek-v3 --tp 8 with auto
# (slots up to 256 tokens, the separate pass above) against separate; packed into $OUT/all.tgz.
# shellcheck source=bench/device_prelude.sh
. bench/device_prelude.sh
tokens="1 16 64 256 1024 4096 16384"
# bench_pair NAME MODE_A MODE_B BENCH_ARGS...: moekit bench under two --shared-experts modes and
# their table ($log/fold_NAME.md).
bench_pair() {
  local name=$1 a=$2 b=$3 mode
  shift 3
  for mode in "$a" "$b"; do
    timeout 150 build/moekit bench "$@" --tokens $tokens --shared-experts "$mode" \
      --json "$log/bench_${name}_$mode.json" >"$log/bench_${name}_$mode.log" 2>&1
    echo "== $name $mode"
    grep -E "^ +[0-9]+ " "$log/bench_${name}_$mode.log"
  done
  python3 bench/compare_fold.py "$log/bench_${name}_$a.json" "$log/bench_${name}_$b.json" \
    >"$log/fold_$name.md" 2>&1
  cat "$log/fold_$name.md"
}
for part in "$@"; do
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  if [ "$part" = tests ] || [ "$part" = plaintests ]; then
  timeout 170 bash bench/h200_session.sh tests
  mv "$out"/test_*.log "$out"/summary.txt "$log"/ 2>/dev/null
  cat "$log/summary.txt"
  fi
  if [ "$part" = tests ]; then
  timeout 90 compute-sanitizer --tool memcheck build/tests/test_gpu_layer --gtest_brief=1 \
    --gtest_filter='GpuLayer.CudaGraph*:Presets/GpuVsCpu.*qwen2*' \
    >"$log/sanitizer.log" 2>&1
  grep -h "SUMMARY\|PASSED\|FAILED" "$log/sanitizer.log"
  fi
  if [ "$part" = hybrid ]; then  # deepseek-v3 --tp 8: auto (slots up to 256 tokens) vs separate
  bench_pair hybrid auto separate --models deepseek-v3 --tp 8
  build/moekit explain --model deepseek-v3 --tp 8 | grep shared
  fi
  if [ "$part" = gate ]; then  # qwen1.5-moe-a2.7b alone: the gated shared slots' cost
  bench_pair gate folded separate --models qwen1.5-moe-a2.7b
  fi
  if [ "$part" = shared ]; then
  for run in "full:--models deepseek-v3 qwen1.5-moe-a2.7b" "tp8:--models deepseek-v3 --tp 8"; do
    name=${run%%:*}
    for mode in folded separate; do
      timeout 150 build/moekit bench ${run#*:} --tokens $tokens --shared-experts $mode \
        --json "$log/bench_${name}_$mode.json" >"$log/bench_${name}_$mode.log" 2>&1
      echo "== $name $mode"
      grep -E "^ +[0-9]+ |experts:" "$log/bench_${name}_$mode.log"
    done
  done
  PYTHONUNBUFFERED=1 timeout 100 python3 .carry/triton_peer.py --dtype bf16 --shapes deepseek-v3 \
    --tokens ${tokens// /,} --json "$log/peer_bf16.json" >"$log/peer_bf16.log" 2>&1
  python3 bench/compare_fold.py "$log/bench_full_folded.json" "$log/bench_full_separate.json" \
    "$log/peer_bf16.json" >"$log/fold.md" 2>&1
  python3 bench/compare_fold.py "$log/bench_tp8_folded.json" "$log/bench_tp8_separate.json" \
    >"$log/fold_tp8.md" 2>&1
  cat "$log/fold.md" "$log/fold_tp8.md"
  fi
} 2>&1 | tee -a "$log/session.log"
done
pack_logs
