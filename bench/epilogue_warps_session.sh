#!/usr/bin/env bash
# Device calls for the epilogue warps of the 128x256epi rows (MainloopKind::kWarpSpecializedEpilogue:
# the consumers hand each finished tile through shared memory to two warps of the producer
# warpgroup, which store it while the consumers run the next item's mainloop; the ring has 3
# stages instead of 4).
# Parts (arguments, in order):
#   smoke    the bitwise test alone; the call stops when it fails or hangs
#   tests    test_grouped_gemm (every row incl. the bitwise test against 128x256), test_gpu_layer,
#            the 8-bit tile sweep of test_gpu_quantized (every fp8 / int8 row)
#   sanitize memcheck / racecheck on the bitwise test (the handoff tile's barriers)
#   ab       one binary, each GEMM forced to 128x256 and to 128x256epi (`--tile`), one process
#            each: bf16, fp8 per-tensor and int8 layers at prefill sizes
#   bench    build/moekit as tables choose (auto), bf16 and fp8 per-tensor, prefill sizes
#   peer     the Triton peer's bf16 on the same shapes, the ratio against the `bench` part (or
#            the forced 128x256epi run when `bench` did not run)
# Each part is a function part_NAME, run in order by run_parts (bench/device_prelude.sh), which
# packs everything into $OUT/all*.tgz.
# shellcheck source=bench/device_prelude.sh
. bench/device_prelude.sh
# One bench: ab_bench NAME ARGS...; prints NAME and, per size, the layer and its GEMMs.
ab_bench() {
  ab_run "$1" build/moekit "${@:2}"
  grep -E '^ +[0-9]+ ' "$log/ab_$1.log" |
    sed -E 's/^ +([0-9]+) +([0-9.]+) .*(gemm1 [0-9.]+).*(gemm2 [0-9.]+).*/M=\1 \2 us: \3 \4/' |
    head -16
}
# The bitwise test first, on its own: a kernel that hangs stops the call here, not at each part's
# time limit (a first build deadlocked on its register counts).
part_smoke() {
  run_gtest smoke 60 build/tests/test_grouped_gemm 'GroupedGemm.EpilogueWarpsBitwiseTheDirectEpilogue'
  grep -q '^\[  PASSED  \] 1 test' "$log/smoke.log" || { pack_logs; exit 1; }
}
part_tests() {
  run_gtest test_grouped_gemm 200 build/tests/test_grouped_gemm
  run_gtest test_gpu_layer 150 build/tests/test_gpu_layer
  run_gtest test_gpu_quantized_tiles 150 build/tests/test_gpu_quantized \
    'QuantizedGpu.Every8BitTileMatchesEmulation'
}
part_sanitize() { sanitize_grouped_gemm 90 'GroupedGemm.EpilogueWarpsBitwiseTheDirectEpilogue'; }
ab_cases() {
  echo "bf16 --models mixtral-8x7b qwen3-30b-a3b deepseek-v3 gpt-oss-120b --tokens 1024 4096 16384"
  echo "fp8tensor --quant fp8_per_tensor --models mixtral-8x7b qwen3-30b-a3b --tokens 4096 16384"
  echo "int8 --quant int8_w8a8 --models mixtral-8x7b qwen3-30b-a3b --tokens 16384"
}
part_ab() {
  local name args tile
  while read -r name args; do
    for tile in ${AB_TILES:-128x256 128x256epi}; do
      # shellcheck disable=SC2086
      ab_bench "${name}_$tile" --tile $tile $args
    done
  done < <(ab_cases | head -n "${AB_CASES:-3}" | narrowed)
}
# The cases with AB_MODELS / AB_TOKENS (when set) in place of their own models and sizes.
narrowed() {
  sed -E ${AB_MODELS:+-e "s/--models( [^ -][^ ]*)+/--models $AB_MODELS/"} \
    ${AB_TOKENS:+-e "s/--tokens( [0-9]+)+/--tokens $AB_TOKENS/"}
}
part_bench() {
  local name args
  while read -r name args; do
    # shellcheck disable=SC2086
    ab_bench "${name}_auto" $args
  done < <(ab_cases | head -n 2)
}
part_peer() {
  local ours=$log/ab_bf16_auto.json
  [ -f "$ours" ] || ours=$log/ab_bf16_128x256epi.json
  PYTHONUNBUFFERED=1 timeout 150 python3 .carry/triton_peer.py \
    --shapes mixtral-8x7b,qwen3-30b-a3b,deepseek-v3,gpt-oss-120b --tokens 1024,4096,16384 \
    --json "$log/peer_bf16.json" >"$log/peer_bf16.log" 2>&1
  python3 bench/compare_peer.py "$ours" "$log/peer_bf16.json" >"$log/ratio_bf16.md" 2>&1
  cat "$log/ratio_bf16.md"
}
# AB_CASES=N: the first N cases of ab_cases only (default all 3); AB_TILES: the tiles forced
# (default "128x256 128x256epi"); AB_MODELS / AB_TOKENS replace each case's models and sizes.
run_parts "$@"
