#!/usr/bin/env bash
# `moekit run` under mpirun (ctest label mpi): a DP + EP layer on CPU ranks, every all-to-all
# backend; each rank checks its rows against a single-process float64 recomputation and must print
# OK. And `moekit bench-ep` (and `moekit bench --ep`) prints its table. Usage: cli_ep.sh MPIEXEC MOEKIT
set -u
mpiexec=$1
moekit=$2
failures=0
run() {  # run NP BACKEND MODEL
  local np=$1 backend=$2 model=$3
  local out
  out=$("$mpiexec" -np "$np" --oversubscribe "$moekit" run --model "$model" --ep --dp "$np" \
    -m 8 --device cpu --all2all "$backend" 2>&1)
  local rc=$?
  local ok
  ok=$(grep -cE "^rank [0-9]+/$np: check .* -> OK$" <<<"$out")
  if [ "$rc" -ne 0 ] || [ "$ok" -ne "$np" ]; then
    echo "FAILED: $np ranks, --all2all $backend, $model (rc $rc, $ok of $np ranks OK)"
    echo "$out" | tail -n 30
    failures=$((failures + 1))
  else
    echo "ok: $np ranks, --all2all $backend, $model"
  fi
}
for backend in naive allgather_reducescatter nccl_all2all batched_low_latency; do
  run 2 "$backend" small-deepseek
done
run 4 nccl_all2all small-deepseek
run 4 batched_low_latency small
# The megakernel deployment needs Hopper GPU ranks: CPU ranks are refused by every rank, with
# the deployment named (no rank hangs waiting for another).
out=$("$mpiexec" -np 2 --oversubscribe "$moekit" run --model small-deepseek --ep --dp 2 -m 8 \
  --device cpu --all2all megakernel 2>&1)
rc=$?
if [ "$rc" -eq 0 ] || [ "$(grep -c "kernel does not support parallel config.*all2all=megakernel" <<<"$out")" -lt 2 ]; then
  echo "FAILED: --all2all megakernel on CPU ranks (rc $rc)"; echo "$out" | tail -n 10
  failures=$((failures + 1))
else
  echo "ok: --all2all megakernel refused on CPU ranks"
fi
# Tensor parallelism under mpirun (no EP): every rank holds its slice of every expert (the shared
# ones too), the ranks' outputs are summed as the engine's all-reduce would; random weights, and a
# checkpoint each rank slices at load (gpt-oss's MXFP4, fused experts).
tp_run() {  # tp_run WHAT ARGS...
  local what=$1 out rc ok
  shift
  out=$("$mpiexec" -np 2 --oversubscribe "$moekit" run --tp 2 -m 9 --device cpu "$@" 2>&1)
  rc=$?
  ok=$(grep -cE "^rank [01]/2: check .* summed over 2 tensor-parallel ranks .* -> OK$" <<<"$out")
  if [ "$rc" -ne 0 ] || [ "$ok" -ne 2 ]; then
    echo "FAILED: tensor parallelism, $what (rc $rc, $ok of 2 ranks OK)"; echo "$out" | tail -n 20
    failures=$((failures + 1))
  else
    echo "ok: tensor parallelism, $what"
  fi
}
tp_run "small-deepseek random weights" --model small-deepseek
fx=$(mktemp -d)
trap 'rm -rf "$fx"' EXIT
"$moekit" make-fixture --scheme hf_mxfp4 --model tiny-gpt-oss --out "$fx/gptoss" >/dev/null
tp_run "gpt-oss MXFP4 checkpoint" --checkpoint "$fx/gptoss" --layer 1
out=$("$mpiexec" -np 2 --oversubscribe "$moekit" run --model small --tp 4 -m 4 --device cpu 2>&1)
if [ $? -eq 0 ] || [ "$(grep -c -- "--tp 4 under mpirun needs 4 processes" <<<"$out")" -lt 2 ]; then
  echo "FAILED: --tp 4 with 2 processes"; echo "$out" | tail -n 10; failures=$((failures + 1))
else
  echo "ok: --tp 4 with 2 processes refused by every rank"
fi
# bench-ep: the stage table, one row per size, on rank 0 only.
out=$("$mpiexec" -np 2 --oversubscribe "$moekit" bench-ep --dp 2 --device cpu --all2all nccl_all2all \
  --tokens 0 3 --reps 2 2>&1)
rows=$(grep -cE "^ +[03] +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+$" <<<"$out")
if [ "$rows" -ne 2 ] || ! grep -q "all2all prepare/finalize" <<<"$out"; then
  echo "FAILED: bench-ep ($rows of 2 rows)"; echo "$out" | tail -n 20; failures=$((failures + 1))
else
  echo "ok: bench-ep"
fi
# bench --ep: the same bench (one --models preset); a single-GPU option is refused.
out=$("$mpiexec" -np 2 --oversubscribe "$moekit" bench --ep --dp 2 --device cpu --all2all naive \
  --models small-deepseek --tokens 2 --reps 2 2>&1)
rows=$(grep -cE "^ +2 +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+$" <<<"$out")
if [ "$rows" -ne 1 ] || ! grep -q "naive" <<<"$out"; then
  echo "FAILED: bench --ep ($rows of 1 row)"; echo "$out" | tail -n 20; failures=$((failures + 1))
else
  echo "ok: bench --ep"
fi
out=$("$mpiexec" -np 2 --oversubscribe "$moekit" bench --ep --dp 2 --device cpu \
  --models small-deepseek --tokens 2 --json x.json 2>&1)
if [ $? -eq 0 ] || ! grep -q -- "--json is for the single-GPU bench" <<<"$out"; then
  echo "FAILED: bench --ep --json not refused"; echo "$out" | tail -n 10; failures=$((failures + 1))
else
  echo "ok: bench --ep refuses --json"
fi
[ "$failures" -eq 0 ] || { echo "$failures run(s) failed"; exit 1; }
