#!/usr/bin/env bash
# Device calls for the vectorized device quantizer (quant/cuda/quantize_rows.cu: 16 or 8 elements
# per thread and chunk; a warp per row, or the block for long rows; 8 or 32 lanes per group).
# Parts (arguments, in order):
#   tests  test_gpu_quantized (the device quantizer bit for bit against the host reference, every
#          8-bit tile and scheme against the emulation)
#   ab     build_old/moekit (the commit before, from .carry/moekit-old.tar.xz) and build/moekit:
#          fp8 per-tensor, block-128 (routed like the peer), per-channel and int8 layers from
#          decode to prefill, the layer and its dispatch / quantize stages printed
#   peer   the Triton peer's fp8tensor / fp8block on the same shapes, the ratio tables against
#          build/moekit's runs of part ab
# Each part is a function part_NAME, run in order by run_parts (bench/device_prelude.sh), which
# packs everything into $OUT/all*.tgz.
# The first call of this script (bench/results/2026-12-04-h200-requant/call1) also timed GEMM1
# writing GEMM2's codes in its epilogue (since removed: slower; bench/grouped_gemm_notes.md).
# shellcheck source=bench/device_prelude.sh
. bench/device_prelude.sh
unpack_old_binary || exit 1
# One bench: ab_bench NAME BINARY ARGS...; prints NAME and, per size, the layer and the stages
# from dispatch on.
ab_bench() {
  ab_run "$@"
  grep -E '^ +[0-9]+ ' "$log/ab_$1.log" |
    sed -E 's/^ +([0-9]+) +([0-9.]+) .*(dispatch [0-9.]+)/M=\1 \2 us: \3/; s/  +/ /g' | head -12
}
part_tests() { run_gtest test_gpu_quantized 240 build/tests/test_gpu_quantized; }
# The cases of part ab: NAME and bench arguments.
ab_cases() {
  echo "fp8tensor --quant fp8_per_tensor --models mixtral-8x7b qwen3-30b-a3b --tokens 1 64 1024 4096 16384"
  echo "fp8block --quant fp8_block128 --plain-topk --models qwen3-30b-a3b deepseek-v3 --tokens 1 64 1024 16384"
  echo "fp8channel --quant fp8_per_channel --models qwen3-30b-a3b --tokens 1 64 4096 16384"
  echo "int8 --quant int8_w8a8 --models mixtral-8x7b --tokens 1 4096 16384"
}
part_ab() {
  local name args
  while read -r name args; do
    # shellcheck disable=SC2086
    ab_bench "${name}_old" build_old/moekit $args
    # shellcheck disable=SC2086
    ab_bench "${name}_new" build/moekit $args
  done < <(ab_cases)
}
part_peer() {
  PYTHONUNBUFFERED=1 timeout 150 python3 .carry/triton_peer.py --dtype fp8tensor \
    --shapes mixtral-8x7b,qwen3-30b-a3b --tokens 1,64,1024,4096,16384 \
    --json "$log/peer_fp8tensor.json" >"$log/peer_fp8tensor.log" 2>&1
  python3 bench/compare_peer.py "$log/ab_fp8tensor_new.json" "$log/peer_fp8tensor.json" \
    --dtype fp8tensor >"$log/ratio_fp8tensor.md" 2>&1
  cat "$log/ratio_fp8tensor.md"
  PYTHONUNBUFFERED=1 timeout 150 python3 .carry/triton_peer.py --dtype fp8block \
    --shapes qwen3-30b-a3b,deepseek-v3 --tokens 1,64,1024,16384 \
    --json "$log/peer_fp8block.json" >"$log/peer_fp8block.log" 2>&1
  python3 bench/compare_peer.py "$log/ab_fp8block_new.json" "$log/peer_fp8block.json" \
    --dtype fp8block >"$log/ratio_fp8block.md" 2>&1
  cat "$log/ratio_fp8block.md"
}
run_parts "$@"
