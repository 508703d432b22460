#!/usr/bin/env bash
# Device calls for decode: the CUDA-core rows with per-lane cp.async rings (1x64ring3 / 1x64ring6,
# 16-bit; measured and not kept: bench/results/2026-12-03-h200-decode-pdl), the warp-major task
# order of the CUDA-core rows, and programmatic dependent launch of every kernel of the forward.
# Parts (arguments, in order):
#   gemm       test_grouped_gemm (every row of every family, the ring rows included) and the
#              packed-W layer cases of test_gpu_quantized (their 1x64simt row's new task order)
#   sanitizer  memcheck and racecheck on grouped GEMM tests of the CUDA-core rows' families
#   tune       moekit tune bf16 at decode sizes (1, 4, 16 tokens) on the four presets, and MXFP4
#              W4A16 on gpt-oss-120b at 1 and 16 tokens
#   tests      every GPU test binary (bench/h200_session.sh tests)
#   bench      moekit bench (bf16) and the Triton peer, the ratio table; MXFP4 W4A16 on
#              gpt-oss-120b
#   ncu        kernel durations and DRAM traffic of the decode GEMMs (qwen3-30b-a3b, gpt-oss-120b
#              M = 1, several tiles)
#   ncuall     every kernel of a decode forward with its duration
#   pdl        the layer with and without programmatic dependent launch
#   pdlmix     mixtral-8x7b at M = 1 and 16 with and without it, alternating
#   pdlrel     the GEMMs releasing the next launch at their start or at their exit, and no PDL
#   prefetch   the layer at decode under each MOEKIT_L2_PREFETCH mode
# Everything is packed into $OUT/all*.tgz (pack_logs).
# shellcheck source=bench/device_prelude.sh
. bench/device_prelude.sh
for part in "$@"; do
  t0=$(date +%s)
  case $part in
    gemm)
      run_gtest test_grouped_gemm 150 build/tests/test_grouped_gemm
      run_gtest test_gpu_quantized_w4 150 build/tests/test_gpu_quantized '*mxfp4*:*nvfp4*:*Tile*'
      ;;
    sanitizer)
      sanitize_grouped_gemm 80 'GroupedGemm.AwkwardSchedule*:GroupedGemm.FewCtasManyItemsPerCta:GroupedGemmW4A16.RandomProblem*'
      ;;
    tune)
      timeout 200 build/moekit tune --models qwen3-30b-a3b gpt-oss-120b mixtral-8x7b deepseek-v3 \
        --tokens 1 4 16 --reps 5 --out "$log/h200_bf16_decode.json" >"$log/tune_bf16_decode.log" 2>&1
      grep -E "tune M=|wrote" "$log/tune_bf16_decode.log"
      timeout 100 build/moekit tune --quant mxfp4_w4a16 --models gpt-oss-120b --tokens 1 16 \
        --reps 5 --out "$log/h200_mxfp4_decode.json" >"$log/tune_mxfp4.log" 2>&1
      grep -E "tune M=|wrote" "$log/tune_mxfp4.log"
      ;;
    tests) all_gpu_tests ;;
    bench) bench_with_peer mxfp4_w4a16 ;;
    ncu)
      # Kernel durations and DRAM traffic of the decode GEMMs (no launch gaps in these figures).
      m="gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active"
      for c in "qwen3-30b-a3b 16x64" "qwen3-30b-a3b 1x64ring3" "qwen3-30b-a3b 1x64simt" \
        "gpt-oss-120b 1x64ring3" "gpt-oss-120b 16x64"; do
        set -- $c
        timeout 100 ncu --clock-control none -k regex:'simt|swapab' --launch-skip 8 -c 4 \
          --metrics "$m" build/moekit bench --models "$1" --tokens 1 --tile "$2" --reps 3 \
          >"$log/ncu_$1_$2.log" 2>&1
        echo "== $1 $2"
        grep -E "simt_kernel|swapab_kernel|gpu__time|dram__|warps_active" "$log/ncu_$1_$2.log" |
          sed -E 's/\(int, int, int\).*//' | cut -c1-120 | head -24
      done
      ;;
    ncuall)
      # Every kernel of the decode forwards: names and durations (the stages' share of a layer).
      for model in qwen3-30b-a3b gpt-oss-120b; do
        timeout 100 ncu --clock-control none --launch-skip 40 -c 24 \
          --metrics gpu__time_duration.sum build/moekit bench --models $model --tokens 1 --reps 3 \
          >"$log/ncuall_$model.log" 2>&1
        echo "== $model M=1"
        grep -E "^  [a-zA-Z_].*\(|gpu__time" "$log/ncuall_$model.log" |
          sed -E 's/^  (void )?([A-Za-z0-9_:]+).*/\2/; s/ +gpu__time_duration.sum +us +/ /' |
          paste -d' ' - - | head -24
      done
      ;;
    pdl)
      # The layer with and without programmatic dependent launch (MOEKIT_DISABLE_PDL=1), bf16 on
      # the four presets and MXFP4 W4A16 on gpt-oss-120b at decode sizes, one process each.
      for mode in on off; do
        env_pdl=""
        [ $mode = off ] && env_pdl="MOEKIT_DISABLE_PDL=1"
        env $env_pdl timeout 120 build/moekit bench --tokens 1 16 64 --reps 20 \
          --json "$log/bench_pdl_$mode.json" >"$log/bench_pdl_$mode.log" 2>&1
        env $env_pdl timeout 60 build/moekit bench --quant mxfp4_w4a16 --models gpt-oss-120b \
          --tokens 1 16 64 --reps 20 >"$log/bench_pdl_mxfp4_$mode.log" 2>&1
        echo "== PDL $mode"
        grep -E "^[a-z].*:|^ +[0-9]+ " "$log/bench_pdl_$mode.log" "$log/bench_pdl_mxfp4_$mode.log" |
          cut -c1-60
      done
      ;;
    prefetch)
      # The layer at decode under each MOEKIT_L2_PREFETCH mode (0 none, 1 translations, 2 + GEMM2's
      # whole weights when they fit a third of the L2, 3 as 2 with evict-last), one process each.
      for mode in 0 1 2 3; do
        MOEKIT_L2_PREFETCH=$mode timeout 60 build/moekit bench --models qwen3-30b-a3b gpt-oss-120b \
          mixtral-8x7b --tokens 1 16 --reps 20 >"$log/bench_prefetch_$mode.log" 2>&1
        MOEKIT_L2_PREFETCH=$mode timeout 60 build/moekit bench --quant mxfp4_w4a16 \
          --models gpt-oss-120b qwen3-30b-a3b --tokens 1 16 --reps 20 \
          >"$log/bench_prefetch_mxfp4_$mode.log" 2>&1
        echo "== MOEKIT_L2_PREFETCH=$mode"
        grep -hE "^[a-z].*:|^ +[0-9]+ " "$log/bench_prefetch_$mode.log" \
          "$log/bench_prefetch_mxfp4_$mode.log" | grep -v "weights:\|experts:" | cut -c1-150
      done
      ;;
    pdlmix)
      # mixtral-8x7b bf16 at M = 1 and 16 with and without PDL, alternating, two runs each.
      for run in 1 2; do
        for mode in on off; do
          env_pdl=""
          [ $mode = off ] && env_pdl="MOEKIT_DISABLE_PDL=1"
          env $env_pdl timeout 40 build/moekit bench --models mixtral-8x7b --tokens 1 16 --reps 30 \
            >"$log/bench_pdlmix_${mode}_$run.log" 2>&1
          echo "PDL $mode run $run: $(grep -E '^ +[0-9]+ ' "$log/bench_pdlmix_${mode}_$run.log" |
            awk '{printf "M=%s %s us  ", $1, $2}')"
        done
      done
      ;;
    pdlrel)
      # Where the grouped GEMMs release the next launch (MOEKIT_PDL_RELEASE=start / exit) against
      # no PDL, alternating, two runs each; bf16 on three presets and MXFP4 gpt-oss-120b.
      for run in 1 2; do
        for mode in start exit off; do
          env_pdl="MOEKIT_PDL_RELEASE=$mode"
          [ $mode = off ] && env_pdl="MOEKIT_DISABLE_PDL=1"
          env $env_pdl timeout 60 build/moekit bench --models mixtral-8x7b qwen3-30b-a3b \
            gpt-oss-120b --tokens 1 16 64 --reps 30 >"$log/bench_pdlrel_${mode}_$run.log" 2>&1
          env $env_pdl timeout 40 build/moekit bench --quant mxfp4_w4a16 --models gpt-oss-120b \
            --tokens 1 16 --reps 30 >"$log/bench_pdlrel_mxfp4_${mode}_$run.log" 2>&1
          echo "$mode run $run: $(cat "$log/bench_pdlrel_${mode}_$run.log" \
            "$log/bench_pdlrel_mxfp4_${mode}_$run.log" | grep -E '^ +[0-9]+ ' |
            awk '{printf "%s ", $2}')"
        done
      done
      ;;
    *) echo "unknown part $part" ;;
  esac
  echo "($part: $(($(date +%s) - t0)) s)"
done
pack_logs
