#!/usr/bin/env bash
# The command line refuses bad and conflicting input with exit code 2 and a message that names the
# flag, the value and the requirement; it checks memory before work and previews absent devices.
# Usage: test_cli.sh path/to/moekit
set -uo pipefail
moekit=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

# expect RC PATTERN ARGS...: the command exits with RC and its output matches PATTERN (grep -E).
expect() {
  local rc=$1 pattern=$2
  shift 2
  local out got
  out=$("$moekit" "$@" 2>&1)
  got=$?
  if [ "$got" -ne "$rc" ] || ! grep -qE -- "$pattern" <<<"$out"; then
    echo "FAILED: moekit $* -> exit $got (want $rc), output:"
    echo "$out" | tail -5
    echo "  (wanted a match of: $pattern)"
    failures=$((failures + 1))
  else
    echo "ok: moekit $*"
  fi
}

"$moekit" make-fixture --scheme fp8_block128 --out "$tmp/fp8" >/dev/null || exit 1
"$moekit" make-fixture --scheme bf16 --out "$tmp/bf16" >/dev/null || exit 1

# Conflicting or meaningless flags.
expect 2 "--model excludes --config|--config excludes --model" run --model tiny --config "$tmp/bf16"
expect 2 "--layer requires --checkpoint" run --layer 1
expect 2 "--layer: Value -2 not in range" run --checkpoint "$tmp/bf16" --layer -2
expect 2 "excludes --model|--model excludes" run --checkpoint "$tmp/bf16" --model tiny
expect 2 "excludes --quant|--quant excludes" explain --quant nvfp4 --checkpoint "$tmp/fp8"
expect 2 "--routing skewed cannot be used with this checkpoint.*router \(gate\) weight" \
  run --checkpoint "$tmp/bf16" --routing skewed
expect 2 "The following argument was not expected: --bogus" run --bogus
expect 0 "Usage" run --help
# Shared experts: how they run, said by explain; a fold that cannot be is refused with the reason.
expect 0 "shared       folded into the routed experts: 4 extra expert" \
  explain --model qwen1.5-moe-a2.7b --device h200
expect 0 "shared       separate pass \(auto: 1 chunk" explain --model deepseek-v3 --device h200
expect 0 "-> OK" run --model small-qwen2-moe -m 12 --shared-experts folded
expect 2 "unknown --shared-experts 'bogus'" run --model small-deepseek -m 4 --shared-experts bogus
expect 2 "cannot fold into the routed experts.*expert parallelism" \
  run --model small-deepseek -m 4 --ep --tp 2 --shared-experts folded

# A checkpoint without a router weight needs --routing, then runs with synthetic logits.
python3 - "$tmp/bf16" "$tmp/nogate" <<'PY' || exit 1
import json, os, shutil, struct, sys
src, dst = sys.argv[1], sys.argv[2]
shutil.copytree(src, dst)
path = os.path.join(dst, "model.safetensors")
raw = open(path, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
data = raw[8 + n:]
keep = {k: v for k, v in header.items() if not k.endswith(".gate.weight")}
out, blobs, off = {}, [], 0
for k, v in keep.items():
    if k == "__metadata__":
        out[k] = v
        continue
    b, e = v["data_offsets"]
    blobs.append(data[b:e])
    out[k] = dict(v, data_offsets=[off, off + e - b])
    off += e - b
h = json.dumps(out).encode()
h += b" " * ((8 - len(h) % 8) % 8)
open(path, "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PY
expect 2 "has no router \(gate\) weight: pass --routing" run --checkpoint "$tmp/nogate" -m 5
expect 0 "synthetic balanced router logits.*|-> OK" run --checkpoint "$tmp/nogate" -m 5 --routing balanced

# Environment variables with unknown values, and a config.json that is not a file.
out=$(MOEKIT_LOG_LEVEL=garbage "$moekit" explain --model tiny 2>&1)
if [ $? -ne 2 ] || ! grep -q "MOEKIT_LOG_LEVEL='garbage' is not valid" <<<"$out"; then
  echo "FAILED: MOEKIT_LOG_LEVEL=garbage moekit explain: $out"
  failures=$((failures + 1))
else
  echo "ok: MOEKIT_LOG_LEVEL=garbage moekit explain"
fi
mkdir -p "$tmp/dirconfig/config.json"
expect 2 "config.json.*(directory|not a regular file)" explain --config "$tmp/dirconfig/config.json"
expect 2 "config.json.*(directory|not a regular file)" run --checkpoint "$tmp/dirconfig" --layer 0
expect 2 "--models excludes --config|--config excludes --models" \
  bench --config "$tmp/bf16" --models tiny

# Tile tuning and tables: `moekit tune` needs its output file and a GPU; a tile table that
# cannot be read is an error, never silently ignored.
expect 2 "--out is required" tune --models tiny
if ! nvidia-smi >/dev/null 2>&1; then
  expect 2 "moekit tune (needs a GPU|times the GPU path)" tune --models tiny --out "$tmp/t.json"
fi
out=$(MOEKIT_TILE_TABLES="$tmp/missing.json" "$moekit" explain --device h200 --model tiny 2>&1)
if [ $? -ne 2 ] || ! grep -q "MOEKIT_TILE_TABLES=.*missing.json" <<<"$out"; then
  echo "FAILED: MOEKIT_TILE_TABLES=missing.json moekit explain: $out"
  failures=$((failures + 1))
else
  echo "ok: MOEKIT_TILE_TABLES=missing.json moekit explain"
fi

# Memory is planned before work: a layer that cannot fit is refused at once, with the figures.
expect 2 "needs about [0-9.]+ GB of host memory .* GB is available" \
  run --model deepseek-v3 --device cpu -m 16 --max-tokens 1000000

# An absent GPU is previewed, not probed.
expect 0 "preview: NVIDIA H200.*not present here" explain --device h200 --model deepseek-v3
expect 0 "sm90_grouped +Sm90GroupedExperts +CHOSEN" explain --device h200 --model deepseek-v3
# NVFP4 on Hopper: the weight-only kernel, for a W4A4 scheme too (activations stay bf16).
expect 0 "sm90_nvfp4 +Sm90Nvfp4Experts +CHOSEN" explain --device h200 --model small --quant nvfp4
expect 0 "activations: unquantized \(sm90_nvfp4 is weight-only" \
  explain --device h200 --model small --quant nvfp4
expect 0 "sm90_nvfp4 +Sm90Nvfp4Experts +CHOSEN" \
  explain --device h200 --model small --quant nvfp4_w4a16
# MXFP4 weights with fp8 per-tensor activations (Quark w_mxfp4_a_fp8) on Hopper: the MXFP4
# kernels on the activations' e4m3 codes.
expect 0 "sm90_mxfp4 +Sm90Mxfp4Experts +CHOSEN" explain --device h200 --model small --quant mxfp4_a8
# MXFP6 weights with MXFP6 activations (Quark w_mxfp6_*_a_mxfp6_*) on Hopper: the W4A16 kernels on
# the repacked rows; a size that is not a multiple of 64 is padded up to the kernels' rows.
expect 0 "sm90_mxfp6 +Sm90Mxfp6Experts +CHOSEN" explain --device h200 --model small --quant mxfp6_e3m2
expect 0 "sm90_mxfp6 +Sm90Mxfp6Experts +CHOSEN" explain --device h200 --model small --quant mxfp6_e2m3
# MXFP6 weights with static fp8 activations (w_mxfp6_*_a_fp8, which the original has no fused
# config for): the same kernels on the activations' e4m3 codes, as mxfp4_a8.
expect 0 "sm90_mxfp6 +Sm90Mxfp6Experts +CHOSEN" \
  explain --device h200 --model small --quant mxfp6_e3m2_a8
# W4A8 on Hopper: int4 converted to e4m3 by the GEMMs' producer, the swap-AB row at decode.
expect 0 "sm90_w4a8 +Sm90W4A8Experts +CHOSEN" explain --device h200 --model small --quant w4a8_fp8
expect 0 "M=1 +gemm1 16x64tma +gemm2 16x64tma" \
  explain --device h200 --model qwen3-30b-a3b --quant w4a8_fp8
# ... and with int4 groups of 128 along K (the Quark method's int4 per_group 128 form), each K step
# promoted with its groups' scales; the prefill row is 128 wide.
expect 0 "sm90_w4a8 +Sm90W4A8Experts +CHOSEN" explain --device h200 --model small --quant w4a8_fp8_g128
expect 0 "M=16384 +gemm1 128x128 +gemm2 128x128 .*group scales" \
  explain --device h200 --model qwen3-30b-a3b --quant w4a8_fp8_g128
# Decode on the CUDA cores: one token per expert runs the simt rows (no tuned table for MXFP4).
expect 0 "M=1 +gemm1 1x64simt +gemm2 1x64simt .*CUDA-core" \
  explain --device h200 --model gpt-oss-120b --quant mxfp4_w4a16
expect 0 "naive_allgather +naive +CHOSEN" explain --model deepseek-v3 --ep --dp 2
expect 0 "all2all +nccl_all2all +CHOSEN" explain --model deepseek-v3 --ep --dp 2 --all2all nccl_all2all
# The megakernel deployment: the peer-memory experts on Hopper (through the pass-through
# prepare/finalize); no CPU experts class serves it.
expect 1 "cpu / CpuReferenceExperts: kernel does not support parallel config.*megakernel\).*Sm90EpPeerExperts on Hopper" \
  explain --model deepseek-v3 --ep --dp 2 --all2all megakernel
expect 0 "sm90_ep_peer +Sm90EpPeerExperts +CHOSEN" \
  explain --device h200 --model deepseek-v3 --ep --dp 2 --all2all megakernel
expect 0 "passthrough +megakernel +CHOSEN" \
  explain --device h200 --model deepseek-v3 --ep --dp 2 --all2all megakernel
# GPU ranks: the all-to-all on the grouped experts; the low-latency exchange's fp8 dispatch into
# the batched fp8 experts.
expect 0 "sm90_grouped +Sm90GroupedExperts +CHOSEN" \
  explain --device h200 --model deepseek-v3 --ep --dp 2 --all2all nccl_all2all
expect 0 "sm90_fp8_batched +Sm90BatchedFp8Experts +CHOSEN" \
  explain --device h200 --model small-deepseek --ep --dp 2 --all2all batched_low_latency \
  --quant fp8_block128
expect 2 "needs 2 ranks: launch it with .mpirun -np 2" run --model small-deepseek --ep --dp 2 -m 4

# Quantized checkpoints run through the same layer, with an expert map.
expect 0 "-> OK" run --checkpoint "$tmp/fp8" -m 9 --tp 2 --ep
# gpt-oss's checkpoint format (fused experts, router bias), MXFP4 and bf16; `all` includes it.
"$moekit" make-fixture --scheme hf_mxfp4 --model tiny-gpt-oss --out "$tmp/gptoss" >/dev/null ||
  exit 1
expect 0 "QuarkOCP_MX_MoEMethod.*" run --checkpoint "$tmp/gptoss" -m 9
expect 0 "-> OK" run --checkpoint "$tmp/gptoss" -m 9 --tp 2 --ep
# A tensor-parallel rank loads its slice of every expert; slices that split a block are refused.
expect 0 "-> OK" run --checkpoint "$tmp/gptoss" -m 9 --tp 2 --tp-rank 1
expect 2 "tp_rank=2 must be in \[0, tp_size=2\)" run --checkpoint "$tmp/gptoss" --tp 2 --tp-rank 2
expect 2 "intermediate_size_per_partition=64 to be a multiple of 128" \
  run --checkpoint "$tmp/fp8" --tp 2 --tp-rank 1
expect 0 "QuarkOCP_MX_MoEMethod" explain --checkpoint "$tmp/gptoss"
expect 2 "scheme hf_mxfp4 is gpt-oss's checkpoint format; use --model tiny-gpt-oss" \
  make-fixture --scheme hf_mxfp4 --out "$tmp/bad_gptoss"
expect 0 "wrote hf_mxfp4 checkpoint \(tiny-gpt-oss\)" make-fixture --scheme all --out "$tmp/all"
expect 0 "wrote hf_mxfp4 checkpoint \(tiny-gpt-oss\)" \
  make-fixture --scheme all --model tiny-gpt-oss --out "$tmp/all_gptoss"
if [ "$(ls "$tmp/all_gptoss")" != "$(printf 'bf16\nhf_mxfp4')" ]; then
  echo "FAILED: make-fixture --scheme all --model tiny-gpt-oss wrote: $(ls "$tmp/all_gptoss")"
  failures=$((failures + 1))
fi
# A compressed-tensors checkpoint (llm-compressor's FP8_DYNAMIC), on the CPU and previewed.
"$moekit" make-fixture --scheme ct_fp8_dynamic --out "$tmp/ct" >/dev/null || exit 1
expect 0 "QuarkW8A8Fp8MoEMethod.*|-> OK" run --checkpoint "$tmp/ct" -m 7
expect 0 "Sm90Fp8Experts" explain --checkpoint "$tmp/ct" --device h200
# An NVIDIA ModelOpt NVFP4 checkpoint: weight-only NVFP4 experts on an H200 (previewed).
"$moekit" make-fixture --scheme mo_nvfp4 --out "$tmp/mo" >/dev/null || exit 1
expect 0 "-> OK" run --checkpoint "$tmp/mo" -m 7
expect 0 "Sm90Nvfp4Experts" explain --checkpoint "$tmp/mo" --device h200
# A compressed-tensors NVFP4 checkpoint (llm-compressor's NVFP4: weight_packed, reciprocal global
# scales), run on the CPU, tensor-parallel rank 1, and previewed on an H200.
"$moekit" make-fixture --scheme ct_nvfp4 --model tiny-deepseek --out "$tmp/ctfp4" >/dev/null || exit 1
expect 0 "QuarkNvfp4MoEMethod.*|-> OK" run --checkpoint "$tmp/ctfp4" --layer 1 -m 7
expect 0 "-> OK" run --checkpoint "$tmp/ctfp4" --layer 1 -m 5 --tp 2 --tp-rank 1
expect 0 "Sm90Nvfp4Experts" explain --checkpoint "$tmp/ctfp4" --device h200
# compressed-tensors W4AFP8 (int4 groups of 128 as int32 words of offset codes): read through the
# Quark W4A8 method's group form; a tensor-parallel rank takes its columns of down's words (I =
# 128: one group per row, which both ranks' halves share).
"$moekit" make-fixture --scheme ct_w4afp8 --model tiny-deepseek --out "$tmp/ctw4" >/dev/null || exit 1
expect 0 "QuarkW4A8Fp8MoEMethod.*|-> OK" run --checkpoint "$tmp/ctw4" --layer 1 -m 7
expect 0 "-> OK" run --checkpoint "$tmp/ctw4" --layer 1 -m 5 --tp 2 --tp-rank 1
expect 0 "sm90_w4a8 +Sm90W4A8Experts +CHOSEN" explain --checkpoint "$tmp/ctw4" --device h200
# Llama 4's layout (language_model.*, text_config, fused experts, a shared expert), TP rank 1.
"$moekit" make-fixture --scheme bf16 --model tiny-llama4 --out "$tmp/llama4" >/dev/null || exit 1
expect 0 "-> OK" run --checkpoint "$tmp/llama4" --layer 1 -m 9 --tp 2 --tp-rank 1
expect 2 "fixture model tiny-llama4 stores fused experts, which load unquantized \(bf16\), not as nvfp4" \
  make-fixture --scheme nvfp4 --model tiny-llama4 --out "$tmp/bad_llama4"

if [ "$failures" -ne 0 ]; then
  echo "$failures CLI check(s) failed"
  exit 1
fi
echo "all CLI checks passed"
