#!/usr/bin/env bash
# Device call for issue 13 (expert parallelism on two GPUs of one host: nvidia-h200-x2 or
# nvidia-h100-x2), written before such a machine was lent (2026-12-06): not yet run.
# Pack first: bash scripts/pack-for-device.sh ../shared/peers/triton_peer.py
# Needs an MPI launcher there (mpirun / mpiexec; the carried OpenMPI libraries serve the
# binaries); the first part says whether one is found.
# Parts (arguments, in order):
#   tests     the expert-parallel tests on GPU ranks (MOEKIT_EP_TEST_DEVICE=cuda: NCCL, every
#             prepare/finalize, uneven counts with an idle rank, ids of -1, quantized dispatch,
#             fp8 into the batched fp8 experts), then the peer-memory experts' tests
#   run       `moekit run --ep --dp 2` per exchange on small-deepseek: OK on both ranks
#   memcheck  compute-sanitizer memcheck on rank 0 of the layer tests
#   bench     `moekit bench-ep` per exchange, with NCCL's all_to_all of the same bytes, for
#             deepseek-v3 and qwen3-30b-a3b at 1 .. 16384 tokens per rank
# shellcheck source=bench/device_prelude.sh
. bench/device_prelude.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=4
launcher=$(command -v mpirun || command -v mpiexec || true)
mpi2() {
  "$launcher" -np 2 -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x MOEKIT_EP_TEST_DEVICE -x OMP_NUM_THREADS "$@"
}
part_tests() {
  nvidia-smi --query-gpu=index,name --format=csv,noheader
  if [ -z "$launcher" ]; then echo "no mpirun / mpiexec on this machine"; return; fi
  MOEKIT_EP_TEST_DEVICE=cuda timeout 300 mpi2 build/tests/test_ep_mpi --gtest_brief=1 \
    >"$log/test_ep_mpi_gpu.log" 2>&1
  echo "test_ep_mpi (GPU ranks) rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$log/test_ep_mpi_gpu.log" | sort | uniq -c | tr '\n' ' ')"
  grep -E "FAILED|Failure" "$log/test_ep_mpi_gpu.log" | head -20
  run_gtest ep_peer 240 build/tests/test_gpu_ep_peer
}
part_run() {
  [ -n "$launcher" ] || return
  local a
  for a in naive allgather_reducescatter nccl_all2all batched_low_latency megakernel; do
    timeout 120 mpi2 build/moekit run --model small-deepseek --ep --dp 2 -m 8 \
      --all2all "$a" >"$log/run_$a.log" 2>&1
    echo "run $a rc=$? $(grep -cE '^rank [0-9]+/2: check .* -> OK$' "$log/run_$a.log") of 2 ranks OK"
  done
}
part_memcheck() {
  [ -n "$launcher" ] || return
  MOEKIT_EP_TEST_DEVICE=cuda timeout 300 mpi2 bash -c \
    'if [ "${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}" = 0 ]; then exec compute-sanitizer --tool memcheck "$@"; else exec "$@"; fi' \
    _ build/tests/test_ep_mpi --gtest_brief=1 --gtest_filter='EpLayer.*' >"$log/memcheck.log" 2>&1
  echo "memcheck rank 0 rc=$? $(grep -E 'ERROR SUMMARY' "$log/memcheck.log" | tr '\n' ' ')"
}
part_bench() {
  [ -n "$launcher" ] || return
  local model a
  for model in deepseek-v3 qwen3-30b-a3b; do
    for a in nccl_all2all batched_low_latency megakernel; do
      timeout 150 mpi2 build/moekit bench-ep --model "$model" --ep --dp 2 \
        --all2all "$a" --tokens 1 16 64 256 1024 4096 16384 >"$log/bench_ep_${model}_$a.log" 2>&1
      echo "bench-ep $model $a rc=$?"
      grep -E "^ +[0-9]" "$log/bench_ep_${model}_$a.log"
    done
  done
}
run_parts "$@"
