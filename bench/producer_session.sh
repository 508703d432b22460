#!/usr/bin/env bash
# Device calls for the producers' A rows held in registers (gathered_a_sources / copy_a_stage in
# sm90/grouped_kernels.cuh: every producer and single-role loader resolves its rows' sources once
# per item; the warp-specialized rows had read each row's offset from shared memory every K step).
# Pack first (the commit before as .carry/moekit-old.tar.xz for part ab):
#   bash scripts/pack-for-device.sh ../shared/peers/triton_peer.py
# Parts (arguments, in order):
#   tests     every GPU test binary (bench/h200_session.sh tests)
#   core      the GPU tests of the kernels and the layer (grouped GEMMs, support kernels, layer,
#             determinism, the quantized layers against the emulation), without the EP binaries
#   memcheck  compute-sanitizer memcheck on the grouped kernels' few-CTA, fp8 float64, W4A8 and
#             swap-AB cases
#   ab        build_old/moekit against build/moekit, routed as the peer (--plain-topk): bf16, fp8
#             per tensor, fp8 block-128 and W4A8 layers, decode to prefill (PRODUCER_TOKENS); the
#             cases named in PRODUCER_AB (default: all four); old and new interleaved
#             PRODUCER_REPEATS times (default 2), each case at its fastest run
#   peer      the Triton peer's bf16 / fp8 per-tensor / fp8 block layers on the same shapes, the
#             ratio per case against part ab's build/moekit runs (the cases PRODUCER_AB names)
#   epi       build/moekit with the epilogue-warp row forced (128x256epi) against the auto rows, fp8
#             per tensor and bf16 prefill (PRODUCER_TOKENS)
#   decode    build_old/moekit against build/moekit at M = 1 / 64, bf16 and fp8 per tensor (the
#             swap-AB rows' loaders and activation)
#   tiles     build/moekit with each prefill row of PRODUCER_TILES forced (default 64x64 128x128
#             128x128pp 128x256mc) on deepseek-v3 (about 128 rows per expert at M = 4096: 1.48
#             m-tiles of 128) under each scheme of PRODUCER_TILE_QUANTS (default bf16), against
#             the auto rows of the same binary (run before and after them, the faster kept)
#   profile   bench/w4a8_profile.sh on the fp8 per-tensor 128x256 GEMM1 and GEMM2 at mixtral-8x7b
#             M = 16384 (warp states, per-instruction stall samples)
# shellcheck source=bench/device_prelude.sh
. bench/device_prelude.sh
tokens=${PRODUCER_TOKENS:-1 64 4096 16384}
# Whether PRODUCER_AB names the case (default: all four).
selected() { [[ " ${PRODUCER_AB:-bf16 fp8tensor fp8block w4a8} " == *" $1 "* ]]; }
part_tests() { all_gpu_tests; }
part_core() {
  run_gtest test_grouped_gemm 120 build/tests/test_grouped_gemm
  run_gtest test_moe_support_kernels 60 build/tests/test_moe_support_kernels
  run_gtest test_gpu_layer 90 build/tests/test_gpu_layer
  run_gtest test_gpu_determinism 60 build/tests/test_gpu_determinism
  run_gtest test_gpu_quantized 280 build/tests/test_gpu_quantized
}
part_memcheck() {
  timeout 280 compute-sanitizer --tool memcheck --error-exitcode 9 build/tests/test_grouped_gemm \
    --gtest_brief=1 \
    --gtest_filter='GroupedGemm.FewCtas*:GroupedGemmFp8.LongK*:GroupedGemmW4A8*:*SwapAB*' \
    >"$log/producer_memcheck.log" 2>&1
  echo "memcheck grouped rc=$? $(grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' "$log/producer_memcheck.log" | tr '\n' ' ')"
}
# The A/B cases: NAME, then the bench arguments.
ab_cases() {
  echo "bf16 --quant bf16 --models mixtral-8x7b qwen3-30b-a3b deepseek-v3"
  echo "fp8tensor --quant fp8_per_tensor --models mixtral-8x7b qwen3-30b-a3b"
  echo "fp8block --quant fp8_block128 --models qwen3-30b-a3b deepseek-v3"
  echo "w4a8 --quant w4a8_fp8 --models mixtral-8x7b qwen3-30b-a3b"
}
part_ab() {
  unpack_old_binary || return 1
  local name args r sfx olds news
  while read -r name args; do
    selected "$name" || continue
    olds="" news=""
    for ((r = 1; r <= ${PRODUCER_REPEATS:-2}; ++r)); do
      sfx=$([ "$r" -gt 1 ] && echo "$r")  # ab_NAME_new.json is the first run (parts peer, epi)
      # shellcheck disable=SC2086  # one argument per word
      ab_run "${name}_old$sfx" build_old/moekit --plain-topk $args --tokens $tokens
      # shellcheck disable=SC2086
      ab_run "${name}_new$sfx" build/moekit --plain-topk $args --tokens $tokens
      olds+=${olds:+,}$log/ab_${name}_old$sfx.json
      news+=${news:+,}$log/ab_${name}_new$sfx.json
    done
    python3 bench/compare_ab.py "$olds" "$news" 2>&1 | tee "$log/ab_${name}.md"
  done < <(ab_cases)
}
# The peer's shapes per A/B case (the case names are the peer's dtypes).
peer_shapes() {
  case $1 in
    bf16) echo mixtral-8x7b,qwen3-30b-a3b,deepseek-v3 ;;
    fp8tensor) echo mixtral-8x7b,qwen3-30b-a3b ;;
    fp8block) echo qwen3-30b-a3b,deepseek-v3 ;;
  esac
}
part_peer() {
  local d
  for d in bf16 fp8tensor fp8block; do
    selected "$d" || continue
    peer_ratio "$d" "$(peer_shapes "$d")" "$tokens" "$log/ab_${d}_new.json"
  done
}
part_epi() {  # against part ab's new runs of the same scheme
  local c name q
  for c in fp8tensor:fp8_per_tensor bf16:bf16; do
    name=${c%%:*}
    q=${c#*:}
    # shellcheck disable=SC2086
    ab_run "${q}_epi" build/moekit --plain-topk --quant "$q" --tile 128x256epi \
      --models mixtral-8x7b qwen3-30b-a3b --tokens $tokens
    python3 bench/compare_ab.py "$log/ab_${name}_new.json" "$log/ab_${q}_epi.json" 2>&1 |
      tee "$log/ab_${q}_epi.md"
  done
}
part_decode() {
  unpack_old_binary || return 1
  local q models
  for q in bf16 fp8_per_tensor; do
    models="qwen3-30b-a3b mixtral-8x7b"
    [ "$q" = bf16 ] && models="$models gpt-oss-120b"
    # shellcheck disable=SC2086  # one argument per model
    ab_run "decode_${q}_old" build_old/moekit --plain-topk --quant "$q" --models $models \
      --tokens 1 64
    # shellcheck disable=SC2086
    ab_run "decode_${q}_new" build/moekit --plain-topk --quant "$q" --models $models --tokens 1 64
    python3 bench/compare_ab.py "$log/ab_decode_${q}_old.json" "$log/ab_decode_${q}_new.json" \
      2>&1 | tee "$log/ab_decode_$q.md"
  done
}
part_tiles() {
  local q t auto
  for q in ${PRODUCER_TILE_QUANTS:-bf16}; do
    # shellcheck disable=SC2086  # one argument per size
    ab_run "deepseek_${q}_auto" build/moekit --plain-topk --quant "$q" --models deepseek-v3 \
      --tokens $tokens
    for t in ${PRODUCER_TILES:-64x64 128x128 128x128pp 128x256mc}; do
      # shellcheck disable=SC2086
      ab_run "deepseek_${q}_$t" build/moekit --plain-topk --quant "$q" --models deepseek-v3 \
        --tile "$t" --tokens $tokens
    done
    # shellcheck disable=SC2086  # the auto rows again, after the forced ones (clock drift)
    ab_run "deepseek_${q}_auto2" build/moekit --plain-topk --quant "$q" --models deepseek-v3 \
      --tokens $tokens
    auto=$log/ab_deepseek_${q}_auto.json,$log/ab_deepseek_${q}_auto2.json
    for t in ${PRODUCER_TILES:-64x64 128x128 128x128pp 128x256mc}; do
      python3 bench/compare_ab.py "$auto" "$log/ab_deepseek_${q}_$t.json" 2>&1 |
        tee "$log/ab_deepseek_${q}_$t.md"
    done
  done
}
part_profile() {
  OUT=$out/profile W4A8_PROFILE_QUANT=fp8_per_tensor \
    W4A8_PROFILE_CASES="ws_tma_kernel 16384 128x256 2;ws_tma_kernel 16384 128x256 3" \
    bash bench/w4a8_profile.sh
}
run_parts "$@"
