// The host side every dtype of the grouped GEMM shares (sm90_grouped_gemm.h): argument checks,
// tile selection, dispatch to the operand family (sm90_bf16_grouped_gemm.cu,
// sm90_fp8_grouped_gemm.cu, sm90_int8_grouped_gemm.cu, sm90_w4a16_grouped_gemm.cu,
// sm90_w4a8_grouped_gemm.cu), the gate/up
// weight reorder of the fused epilogue.
#include "experts/cuda/sm90_grouped_gemm.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>

#include "core/elementwise.h"
#include "experts/cuda/sm90/host.h"

namespace moekit::cuda {
namespace {

std::string misaligned(const char* name, const void* ptr, int bytes) {
  if (reinterpret_cast<uintptr_t>(ptr) % bytes == 0) return "";
  return std::string(name) + " is not " + std::to_string(bytes) + "-byte aligned";
}

}  // namespace

namespace detail {

std::string check_grouped_gemm_args(const GroupedGemmArgs& args, const GroupedGemmParams& params) {
  using std::to_string;
  if (args.a == nullptr || args.w == nullptr || args.c == nullptr) return "a, w and c are required";
  if (args.num_experts < 1 || args.num_experts > kMaxExperts) {
    return "num_experts=" + to_string(args.num_experts) + " is not in [1, " +
           to_string(kMaxExperts) + "]";
  }
  if (args.n <= 0 || args.n % 8 != 0)
    return "n=" + to_string(args.n) + " is not a positive multiple of 8";
  if (args.k <= 0 || args.k % 8 != 0)
    return "k=" + to_string(args.k) + " is not a positive multiple of 8";
  if (args.lda < args.k || args.lda % 8 != 0) {
    return "lda=" + to_string(args.lda) +
           " is not a multiple of 8 that is >= k=" + to_string(args.k);
  }
  const bool fused = args.fused_act != FusedActivation::kNone;
  if (static_cast<int>(args.fused_act) < 0 ||
      static_cast<int>(args.fused_act) > static_cast<int>(FusedActivation::kRelu2Mul)) {
    return "fused_act is unknown";
  }
  if (fused && args.n % (2 * kFusedGateUpBlock) != 0) {
    return "n=" + to_string(args.n) +
           " is not a multiple of 64 (a fused activation needs whole 64-row gate/up blocks)";
  }
  if (fused) {
    const bool uses_limit = args.fused_act == FusedActivation::kSwigluOai ||
                            args.fused_act == FusedActivation::kSwigluStep ||
                            (args.fused_act == FusedActivation::kSiluMul && args.has_clamp_limit);
    if (uses_limit && !(args.clamp_limit > 0.0f)) return "clamp_limit must be > 0";
  }
  const int n_out = fused ? args.n / 2 : args.n;
  if (args.ldc < n_out || args.ldc % 2 != 0) {
    return "ldc=" + to_string(args.ldc) + " is not an even number >= " + (fused ? "n/2=" : "n=") +
           to_string(n_out);
  }
  if (auto why = misaligned("a", args.a, 16); !why.empty()) return why;
  if (auto why = misaligned("w", args.w, 16); !why.empty()) return why;
  if (auto why = misaligned("c", args.c, 4); !why.empty()) return why;
  if (args.bias != nullptr) {
    if (auto why = misaligned("bias", args.bias, args.bias_is_fp32 ? 8 : 2); !why.empty()) {
      return why;
    }
  }
  if (args.num_rows_upper_bound < 0 || args.num_rows_upper_bound > INT32_MAX) {
    return "num_rows_upper_bound=" + to_string(args.num_rows_upper_bound) + " is not in [0, 2^31)";
  }
  if (args.expert_counts != nullptr) {
    if (args.batched_stride <= 0 ||
        args.batched_stride * args.num_experts > static_cast<int64_t>(INT32_MAX)) {
      return "batched_stride=" + to_string(args.batched_stride) +
             " must be positive with num_experts * batched_stride < 2^31";
    }
  } else if (args.expert_offsets == nullptr) {
    return "expert_offsets (or expert_counts with batched_stride) is required";
  }
  if (params.max_ctas < 0) return "max_ctas=" + to_string(params.max_ctas) + " is negative";
  const sm90::TileFamily family = tile_family_of(args);
  if (params.tile < -1 || params.tile >= sm90::kNumTiles ||
      (params.tile >= 0 && sm90::kTileTable[params.tile].family != family)) {
    return "tile=" + to_string(params.tile) + " is not a row of the tile table for " +
           elem_type_name(args.dtype) + " (" + sm90::tile_names(family) + ") or -1";
  }
  if (params.tile >= 0) return tile_fits(args, params.tile);
  return "";
}

std::string tile_fits(const GroupedGemmArgs& args, int row) {
  using std::to_string;
  const sm90::TileConfig& t = sm90::kTileTable[row];
  if (t.kind == sm90::MainloopKind::kSwapAB && t.family == sm90::TileFamily::kW4A16) {
    if (args.k % 64 != 0) {
      return std::string("tile ") + t.name + ": k=" + to_string(args.k) +
             " is not a multiple of 64 (whole K steps of packed weights)";
    }
    // NOTE: the kernel reads each K step's codes (MXFP4: two, NVFP4: four) as their aligned
    // 4-byte word; n % 8 == 0 (check_grouped_gemm_args) and an even k / 32 keep the last word
    // inside the scales.
    if (reinterpret_cast<uintptr_t>(args.w_group_scale) % 4 != 0) {
      return std::string("tile ") + t.name + ": w_group_scale is not 4-byte aligned";
    }
  }
  return "";
}

std::string check_8bit_operands(const GroupedGemmArgs& args, const char* what) {
  using std::to_string;
  if (args.out_dtype != ElemType::kBF16 && args.out_dtype != ElemType::kF16) {
    return std::string("out_dtype ") + elem_type_name(args.out_dtype) + " is not bf16 or f16";
  }
  if (args.k % 16 != 0) {
    return "k=" + to_string(args.k) + " is not a multiple of 16 (" + what + " rows)";
  }
  if (args.lda % 16 != 0) return "lda=" + to_string(args.lda) + " is not a multiple of 16";
  if (args.a_scale_kind == AScale::kNone || args.a_scale == nullptr) {
    return std::string(what) + " A needs its scales (a_scale_kind and a_scale)";
  }
  if (args.w_scale_kind == WScale::kNone || args.w_scale == nullptr) {
    return std::string(what) + " W needs its scales (w_scale_kind and w_scale)";
  }
  if (reinterpret_cast<uintptr_t>(args.a_scale) % 4 != 0 ||
      reinterpret_cast<uintptr_t>(args.w_scale) % 4 != 0) {
    return "a_scale and w_scale must be 4-byte aligned";
  }
  return "";
}

}  // namespace detail

sm90::TileFamily tile_family_of(const GroupedGemmArgs& args) {
  if (args.w_packing == WPacking::kMxfp4 || args.w_packing == WPacking::kNvfp4 ||
      args.w_packing == WPacking::kMxfp6E2M3 || args.w_packing == WPacking::kMxfp6E3M2) {
    return sm90::TileFamily::kW4A16;
  }
  if (args.w_packing == WPacking::kInt4) {
    return args.w_scale_kind == WScale::kGroup128 ? sm90::TileFamily::kW4A8Group
                                                  : sm90::TileFamily::kW4A8;
  }
  if (args.w_packing == WPacking::kMxfp4Fp8) return sm90::TileFamily::kMxfp4A8;
  if (args.dtype == ElemType::kS8) return sm90::TileFamily::kInt8;
  if (elem_bytes(args.dtype) != 1) return sm90::TileFamily::k16Bit;
  const bool block_scales =
      args.a_scale_kind == AScale::kRowBlock128 || args.w_scale_kind == WScale::kBlock32x128;
  return block_scales ? sm90::TileFamily::kFp8 : sm90::TileFamily::kFp8Direct;
}

std::string can_implement(const GroupedGemmArgs& args, const GroupedGemmParams& params) {
  std::string why;
  switch (tile_family_of(args)) {
    case sm90::TileFamily::kFp8:
    case sm90::TileFamily::kFp8Direct:
      why = detail::can_implement_fp8(args);
      break;
    case sm90::TileFamily::kInt8:
      why = detail::can_implement_int8(args);
      break;
    case sm90::TileFamily::kW4A16:
      why = detail::can_implement_w4a16(args);
      break;
    case sm90::TileFamily::kW4A8:
    case sm90::TileFamily::kW4A8Group:
    case sm90::TileFamily::kMxfp4A8:
      why = detail::can_implement_w4a8(args);
      break;
    default:
      why = detail::can_implement_16bit(args);
      break;
  }
  if (!why.empty()) return why;
  return detail::check_grouped_gemm_args(args, params);
}

cudaError_t prepare_grouped_gemm_weights(const GroupedGemmArgs& args,
                                         sm90::WeightLaunchCache* cache) {
  *cache = sm90::WeightLaunchCache{};
  const sm90::TileFamily family = tile_family_of(args);
  const bool scaled = family == sm90::TileFamily::kFp8 || family == sm90::TileFamily::kFp8Direct ||
                      family == sm90::TileFamily::kInt8 || family == sm90::TileFamily::kW4A8 ||
                      family == sm90::TileFamily::kW4A8Group ||
                      family == sm90::TileFamily::kMxfp4A8;
  if (family == sm90::TileFamily::kW4A16 && args.dtype != ElemType::kBF16) {
    return cudaErrorInvalidValue;
  }
  if (scaled ? (args.dtype != ElemType::kE4M3 && args.dtype != ElemType::kS8) ||
                   (args.out_dtype != ElemType::kBF16 && args.out_dtype != ElemType::kF16)
             : args.dtype != ElemType::kBF16 && args.dtype != ElemType::kF16) {
    return cudaErrorInvalidValue;
  }
  sm90::WeightLaunchCache c;
  if (cudaError_t e = sm90::current_device_sms(&c.sms); e != cudaSuccess) return e;
  cudaError_t e = cudaSuccess;
  switch (family) {
    case sm90::TileFamily::kFp8:
    case sm90::TileFamily::kFp8Direct:
      e = detail::prepare_fp8(args, &c);
      break;
    case sm90::TileFamily::kInt8:
      e = detail::prepare_int8(args, &c);
      break;
    case sm90::TileFamily::kW4A16:
      e = detail::prepare_w4a16(args, &c);
      break;
    case sm90::TileFamily::kW4A8:
    case sm90::TileFamily::kW4A8Group:
    case sm90::TileFamily::kMxfp4A8:
      e = detail::prepare_w4a8(args, &c);
      break;
    default:
      e = detail::prepare_16bit(args, &c);
      break;
  }
  if (e != cudaSuccess) return e;
  c.w = args.w;
  c.n = args.n;
  c.k = args.k;
  c.num_experts = args.num_experts;
  c.dtype = args.dtype;
  c.out_dtype = scaled ? args.out_dtype : args.dtype;
  *cache = c;
  return cudaSuccess;
}

cudaError_t run_grouped_gemm(const GroupedGemmArgs& args, cudaStream_t stream,
                             const GroupedGemmParams& params, void* workspace) {
  if (!can_implement(args, params).empty()) return cudaErrorInvalidValue;
  const int row = params.tile >= 0 ? params.tile : select_grouped_gemm_tile(args);
  switch (tile_family_of(args)) {
    case sm90::TileFamily::kFp8:
    case sm90::TileFamily::kFp8Direct:
      return detail::run_fp8(args, row, params, stream, workspace);
    case sm90::TileFamily::kInt8:
      return detail::run_int8(args, row, params, stream);
    case sm90::TileFamily::kW4A16:
      return detail::run_w4a16(args, row, params, stream);
    case sm90::TileFamily::kW4A8:
    case sm90::TileFamily::kW4A8Group:
    case sm90::TileFamily::kMxfp4A8:
      return detail::run_w4a8(args, row, params, stream);
    default:
      return detail::run_16bit(args, row, params, stream, workspace);
  }
}

std::string can_run_grouped_gemm_pair(const GroupedGemmArgs& g1, const GroupedGemmArgs& g2,
                                      int row) {
  // W4A16's CUDA-core row ran slower as a pair than as two launches (gpt-oss-120b MXFP4 M = 1
  // 49.4 vs 45.2 us, bench/results/2026-12-03-h200-decode-pair): 16-bit only.
  if (tile_family_of(g1) != sm90::TileFamily::k16Bit) {
    return "the decode pair runs 16-bit problems only";
  }
  return detail::simt_pair_unsupported_reason(g1, g2, row);
}

std::string detail::simt_pair_unsupported_reason(const GroupedGemmArgs& g1,
                                                 const GroupedGemmArgs& g2, int row) {
  using std::to_string;
  const sm90::TileFamily family = tile_family_of(g1);
  if ((family != sm90::TileFamily::k16Bit && family != sm90::TileFamily::kW4A16) ||
      tile_family_of(g2) != family) {
    return "the pair's tasks run 16-bit or W4A16 problems of one family";
  }
  if (row < 0 || row >= sm90::kNumTiles || sm90::kTileTable[row].family != family ||
      sm90::kTileTable[row].kind != sm90::MainloopKind::kSimt) {
    return "row " + to_string(row) + " is not a CUDA-core row of the problems' family";
  }
  GroupedGemmParams params;
  params.tile = row;
  for (const GroupedGemmArgs* g : {&g1, &g2}) {
    if (std::string why = can_implement(*g, params); !why.empty()) {
      return std::string(g == &g1 ? "GEMM1: " : "GEMM2: ") + why;
    }
  }
  if (g1.fused_act == FusedActivation::kNone) return "GEMM1 has no fused activation";
  if (g2.fused_act != FusedActivation::kNone) return "GEMM2 has a fused activation";
  if (g2.a != g1.c || g2.lda != g1.ldc || g2.gather_rows != nullptr) {
    return "GEMM2 does not read GEMM1's output rows in place (a == GEMM1's c, lda == its ldc, no "
           "gather)";
  }
  if (g1.expert_counts != nullptr || g2.expert_counts != nullptr ||
      g1.expert_offsets != g2.expert_offsets || g1.num_experts != g2.num_experts) {
    return "GEMM1 and GEMM2 do not share one offsets schedule";
  }
  if (g2.k * 2 != g1.n) {
    return "GEMM2's k=" + to_string(g2.k) + " is not GEMM1's n / 2 = " + to_string(g1.n / 2);
  }
  return "";
}

cudaError_t run_grouped_gemm_pair(const GroupedGemmArgs& g1, const GroupedGemmArgs& g2, int row,
                                  int32_t* expert_done, cudaStream_t stream,
                                  const sm90::WeightLaunchCache* cache) {
  if (expert_done == nullptr || !can_run_grouped_gemm_pair(g1, g2, row).empty()) {
    return cudaErrorInvalidValue;
  }
  return detail::run_16bit_pair(g1, g2, row, expert_done, cache, stream);
}

size_t stream_k_workspace_bytes() {
  // Counters, then two partial-sum slots per CTA (16-byte aligned: the counters are 4-byte words).
  return stream_k_counter_words() * 4 + static_cast<size_t>(kStreamKMaxSms) *
                                            sm90::stream_k_max_blocks() * 2 *
                                            sm90::stream_k_slot_floats() * 4;
}

bool stream_k_pays(int64_t items, int sms) {
  if (items <= 0 || sms <= 0 || items > 4 * static_cast<int64_t>(sms)) return false;
  const int64_t busiest = (items + sms - 1) / sms;  // items of the busiest SM, round-robin
  return busiest * sms * 5 >= items * 6;            // >= 1.2x the mean
}

std::string stream_k_note(const GroupedGemmArgs& args, int row, int sms) {
  if (row < 0 || row >= sm90::kNumTiles) return "";
  const sm90::TileConfig& t = sm90::kTileTable[row];
  if (!sm90::stream_k_capable(t) || sms <= 0 || sms > kStreamKMaxSms) return "";
  const int64_t items = sm90::items_upper_bound(args, t, sm90::div_up(args.n, t.bn));
  if (!stream_k_pays(items, sms)) return "";
  char mean[32];
  std::snprintf(mean, sizeof(mean), "%.2f", static_cast<double>(items) / sms);
  return "stream-K: " + std::to_string(items) + " items over " + std::to_string(sms) +
         " SMs, round-robin " + std::to_string((items + sms - 1) / sms) + " on the busiest, " +
         mean + " on average";
}

size_t get_workspace_size(const GroupedGemmArgs& args, const GroupedGemmParams& params) {
  if (params.stream_k == StreamK::kOff || !can_implement(args, params).empty()) return 0;
  const int row = params.tile >= 0 ? params.tile : select_grouped_gemm_tile(args);
  return sm90::stream_k_capable(sm90::kTileTable[row]) ? stream_k_workspace_bytes() : 0;
}

int select_grouped_gemm_tile(const GroupedGemmArgs& args, std::string* why) {
  const int64_t experts = std::max(1, args.num_experts);
  const sm90::TileFamily family = tile_family_of(args);
  int row = sm90::select_tile((args.num_rows_upper_bound + experts - 1) / experts, why, family);
  // A row that cannot take the problem's shape gives way to the next row of its family (the last
  // row of a family takes every shape). So does a CUDA-core row where experts would often get two
  // rows (it reads an expert's weights once per row): it serves up to E / 16 rows (measured on
  // gpt-oss-120b MXFP4: 4 rows over 128 experts faster than swap-AB, 64 rows slower;
  // bench/results/2026-12-03-h200-simt).
  auto passed_by = [&](int r) {
    if (sm90::kTileTable[r].kind == sm90::MainloopKind::kSimt &&
        args.num_rows_upper_bound * 16 > experts) {
      return "tile " + std::string(sm90::kTileTable[r].name) + ": " +
             std::to_string(args.num_rows_upper_bound) + " rows over " + std::to_string(experts) +
             " experts (more than 1 / 16 per expert: many experts would read their weights twice)";
    }
    return detail::tile_fits(args, r);
  };
  for (std::string unfit = passed_by(row); !unfit.empty(); unfit = passed_by(row)) {
    int next = row + 1;
    while (sm90::kTileTable[next].family != family)
      ++next;
    if (why != nullptr) {
      *why += std::string("; ") + unfit + ", so " + sm90::kTileTable[next].name;
    }
    row = next;
  }
  return row;
}

void interleave_gate_up_rows(const void* src, void* dst, int64_t experts, int64_t n, int64_t k,
                             int elem_bytes, bool source_is_pairwise_interleaved) {
  static_assert(kFusedGateUpBlock == 32, "moekit::interleave_gate_up_blocks uses blocks of 32");
  if (src == nullptr || dst == nullptr || src == dst || experts < 0 || k <= 0 || elem_bytes <= 0 ||
      n <= 0 || n % (2 * kFusedGateUpBlock) != 0) {
    return;
  }
  // Rows as bytes: the library's one implementation of the layout does the reordering.
  const Shape shape = {experts, n, k * elem_bytes};
  const Tensor s = Tensor::from_blob(const_cast<void*>(src), shape, DType::kUInt8, Device::cpu());
  Tensor d = Tensor::from_blob(dst, shape, DType::kUInt8, Device::cpu());
  interleave_gate_up_blocks(d, s, source_is_pairwise_interleaved, Stream{});
}

void interleave_gate_up_bias(const void* src, void* dst, int64_t experts, int64_t n, int elem_bytes,
                             bool source_is_pairwise_interleaved) {
  interleave_gate_up_rows(src, dst, experts, n, 1, elem_bytes, source_is_pairwise_interleaved);
}

}  // namespace moekit::cuda
