#!/usr/bin/env bash
# Runs on the H200 (the device tool), from the repository root, with .carry/ made here by
# scripts/pack-for-device.sh (binaries of a CUDA build + the Triton peer). Each step writes its log
# under $OUT (out/ when unset) and prints a short summary; steps run in the order given:
#   tests      every GPU test binary (gtest), then the python GPU tests of python/tests
#   sanitizer  compute-sanitizer memcheck / racecheck on the kernels' tests
#   bench      moekit bench (bf16, 4 models x 7 batch sizes; $BENCH_FLAGS added) -> bench.json
#   quant      moekit bench --quant for each scheme of $QUANT (comma list, default fp8_block128)
#              on $QUANT_MODELS at $QUANT_TOKENS (comma lists) -> bench_<scheme>.json
#   peer       the Triton peer (.carry/triton_peer.py) in bf16 -> peer.json; then the ratio table
#   peerq      the Triton peer in fp8: fp8block on $QUANT_MODELS, fp8tensor on $TENSOR_MODELS
#              (default mixtral-8x7b,qwen3-30b-a3b), at $QUANT_TOKENS -> peer_fp8*.json; ratio
#              tables against bench_fp8_block128.json / bench_fp8_per_tensor.json (run quant
#              first)
#   kernels    moekit bench-kernels (router + align, GEMM tiles)
#   soak       moekit soak for $SOAK_MINUTES minutes (default 9)
#   python     python/tests on the GPU (graph capture, torch.compile, overhead table)
set -uo pipefail
out=${OUT:-out}
mkdir -p "$out"
if [ ! -x build/moekit ]; then tar -xJf .carry/moekit-bins.tar.xz || exit 1; fi
export LD_LIBRARY_PATH=$PWD/build/runtime:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv \
  >"$out/device.txt" 2>&1
summary=()
for step in "$@"; do
  t0=$(date +%s)
  case $step in
    tests)
      for t in build/tests/test_sm90_kit build/tests/test_grouped_gemm \
               build/tests/test_moe_support_kernels build/tests/test_gpu_layer \
               build/tests/test_gpu_memory build/tests/test_gpu_determinism \
               build/tests/test_gpu_quantized build/tests/test_gpu_comm_nccl \
               build/tests/test_gpu_ep_peer; do
        name=$(basename "$t")
        "$t" --gtest_brief=1 >"$out/$name.log" 2>&1
        rc=$?
        summary+=("$name rc=$rc $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$out/$name.log" | tr '\n' ' ')")
      done
      grep -h "\[memory\]\|\[invariance\]" "$out"/test_gpu_*.log >"$out/memory_invariance.txt"
      ;;
    sanitizer)
      {
        compute-sanitizer --tool memcheck build/tests/test_sm90_kit --gtest_brief=1
        compute-sanitizer --tool memcheck build/tests/test_grouped_gemm --gtest_brief=1 \
          --gtest_filter='GroupedGemm.PreparedLaunchStateMatchesUnprepared:GroupedGemm.FewCtasManyItemsPerCta:GroupedGemmFused.BatchedFewCtasNoBias'
        for tool in memcheck racecheck; do
          compute-sanitizer --tool $tool build/tests/test_moe_support_kernels --gtest_brief=1 \
            --gtest_filter='RouterTest.NanAndInfLogits:RouterTest.GroupLayoutsOffTheFastPath:AlignTest.SmallPathBoundaries:AlignTest.RouterThenAlignChain'
        done
        compute-sanitizer --tool memcheck build/tests/test_gpu_layer --gtest_brief=1 \
          --gtest_filter='GpuLayer.RouterNanAndInfMatchCpu:GpuLayer.BatchedFormatMatchesReference:GpuLayer.CudaGraphReplayIsBitwiseEqual*'
        for tool in memcheck racecheck; do
          compute-sanitizer --tool $tool build/tests/test_gpu_quantized --gtest_brief=1 \
            --gtest_filter='*int8_w8a8_small_h320_M33*:*int8_per_tensor_small_M257*:*fp8_block128_small_h320_M33*'
        done
      } >"$out/sanitizer.log" 2>&1
      summary+=("sanitizer: $(grep -cE 'ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards' "$out/sanitizer.log") clean runs, $(grep -E 'ERROR SUMMARY: [1-9]|SUMMARY: [1-9]' "$out/sanitizer.log" | wc -l) with errors")
      ;;
    bench)
      # shellcheck disable=SC2086  # BENCH_FLAGS: e.g. --plain-topk (route like the peer)
      build/moekit bench ${BENCH_FLAGS:-} --json "$out/bench.json" >"$out/bench.log" 2>&1
      summary+=("bench rc=$? $(grep -c '^ ' "$out/bench.log") lines")
      ;;
    quant)
      IFS=, read -ra schemes <<<"${QUANT:-fp8_block128}"
      for q in "${schemes[@]}"; do
        models=${QUANT_MODELS:-deepseek-v3,qwen3-30b-a3b}
        # shellcheck disable=SC2086  # one argument per preset
        tokens=${QUANT_TOKENS:-1,16,64,256,1024,4096,16384}
        build/moekit bench --quant "$q" --models ${models//,/ } --tokens ${tokens//,/ } \
          --json "$out/bench_$q.json" >"$out/bench_$q.log" 2>&1
        summary+=("bench --quant $q rc=$?")
      done
      ;;
    peer)
      PYTHONUNBUFFERED=1 python3 .carry/triton_peer.py --json "$out/peer.json" >"$out/peer.log" 2>&1
      summary+=("peer rc=$?")
      python3 bench/compare_peer.py "$out/bench.json" "$out/peer.json" >"$out/ratio.md" 2>&1
      ;;
    peerq)
      PYTHONUNBUFFERED=1 python3 .carry/triton_peer.py --dtype fp8block \
        --shapes "${QUANT_MODELS:-deepseek-v3,qwen3-30b-a3b}" --json "$out/peer_fp8block.json" \
        --tokens "${QUANT_TOKENS:-1,16,64,256,1024,4096,16384}" >"$out/peer_fp8block.log" 2>&1
      summary+=("peer fp8block rc=$?")
      PYTHONUNBUFFERED=1 python3 .carry/triton_peer.py --dtype fp8tensor \
        --shapes "${TENSOR_MODELS:-mixtral-8x7b,qwen3-30b-a3b}" --json "$out/peer_fp8tensor.json" \
        --tokens "${QUANT_TOKENS:-1,16,64,256,1024,4096,16384}" >"$out/peer_fp8tensor.log" 2>&1
      summary+=("peer fp8tensor rc=$?")
      for pair in fp8_block128:fp8block fp8_per_tensor:fp8tensor; do
        b=$out/bench_${pair%%:*}.json p=$out/peer_${pair##*:}.json
        [ -f "$b" ] && [ -f "$p" ] && python3 bench/compare_peer.py "$b" "$p" --dtype "${pair##*:}" \
          >"$out/ratio_${pair##*:}.md" 2>&1
      done
      ;;
    kernels)
      build/moekit bench-kernels >"$out/bench_kernels.log" 2>&1
      summary+=("bench-kernels rc=$?")
      ;;
    soak)
      build/moekit soak --minutes "${SOAK_MINUTES:-9}" >"$out/soak.log" 2>&1
      summary+=("soak rc=$? $(tail -n 1 "$out/soak.log")")
      ;;
    python)
      PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=$PWD/python \
        MOEKIT_LIBRARY=$PWD/build/libmoekit_c.so MOEKIT_BENCH_LOG=$out/python-overhead.log \
        python3 -m pytest -v -rs -s -p no:cacheprovider python/tests >"$out/pytest-h200.log" 2>&1
      summary+=("python rc=$? $(tail -n 1 "$out/pytest-h200.log")")
      ;;
    *) summary+=("unknown step $step") ;;
  esac
  summary+=("  ($step: $(($(date +%s) - t0)) s)")
done
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
for r in "$out"/ratio*.md; do [ -f "$r" ] && tail -n 40 "$r"; done
exit 0
