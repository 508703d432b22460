// The launch sequences of the Hopper experts (experts/cuda/sm90_experts.h; the classes are in
// include/moekit/experts/sm90_experts.h). Every buffer comes from the workspaces; nothing here
// allocates or synchronizes.
#include "experts/cuda/sm90_experts.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <tuple>

#include "core/byte_regions.h"
#include "core/cuda/cuda_check.cuh"
#include "experts/cuda/ep_one_launch.h"
#include "experts/cuda/moe_activation.h"
#include "experts/cuda/moe_permute.h"
#include "experts/cuda/moe_unpermute.h"
#include "experts/cuda/sm90_grouped_gemm.h"
#include "moekit/core/checks.h"
#include "moekit/core/env.h"
#include "quant/cuda/moe_input_quant.h"
#include "quant/cuda/mx_qdq.h"
#include "quant/cuda/quantize_rows.h"

namespace moekit {
namespace {

constexpr size_t kAlign = 256;

// MOEKIT_STREAM_K=1: the layers' swap-AB GEMMs take stream-K where it evens out the SMs' work
// (cuda::StreamK::kBalance; measured slower so far, so off by default).
bool stream_k_enabled() {
  static const bool enabled = env::get_bool("MOEKIT_STREAM_K", false);
  return enabled;
}

// Byte layout of workspace2: the activation output, the GEMM2 output (expert-sorted rows), then
// the int32 routing tables of the align step.
// With a quantized a2 (fp8 / int8): its codes, its scales and the amax word of a dynamic
// per-tensor scale follow.
// Where the requantized activation of 8-bit experts lives in a workspace2: its codes, its scales
// and the amax word of a dynamic per-tensor scale.
struct A2Regions {
  size_t q = 0, scale = 0, amax = 0;
};

// Takes a2's regions for `rows` activation rows of d columns quantized per `a2`.
A2Regions take_a2_regions(ByteRegions& r, int64_t rows, int64_t d, const QuantDesc& a2) {
  const DeviceQuantShapes q = device_quant_shapes(rows, d, a2);
  A2Regions a;
  a.q = r.take(static_cast<size_t>(numel_of(q.data)));
  a.scale = r.take(static_cast<size_t>(numel_of(q.scale)) * 4);
  a.amax = r.take(4);
  return a;
}

struct Ws2Layout {
  size_t act = 0, gemm2 = 0, counts = 0, offsets = 0, permuted = 0, slot_to_row = 0, total = 0,
         token_rows = 0, align_ws = 0, align_ws_bytes = 0, a1_mx = 0, expert_done = 0, stream_k = 0,
         bytes = 0;
  A2Regions a2;
};

// The OCP MX element format of an activation descriptor with (1, 32) groups (MXFP4, MXFP6), if
// it is one: such activations are quantize-dequantized in bf16 on the GPU (mx_qdq.h).
std::optional<cuda::MxElement> mx_activation(const QuantDesc& a) {
  if (!(a.shape == GroupShape{1, 32})) return std::nullopt;
  switch (a.dtype) {
    case QuantDType::kFp4E2M1:
      return cuda::MxElement::kE2M1;
    case QuantDType::kFp6E3M2:
      return cuda::MxElement::kE3M2;
    case QuantDType::kFp6E2M3:
      return cuda::MxElement::kE2M3;
    default:
      return std::nullopt;
  }
}

// MXFP4 / MXFP6 weights with fp8 per-tensor activations (Quark w_mxfp4_a_fp8, w_mxfp6_*_a_fp8):
// the activations become e4m3 codes stored as their bf16 values (exact) for the bf16 kernels,
// and each GEMM's activation scale is applied in its epilogue (as a per-expert scale: the same
// for every expert).
bool fp8_codes_as_bf16(const QuantConfig& q) {
  const bool mx_weights = q.w1.dtype == QuantDType::kFp4E2M1 ||
                          q.w1.dtype == QuantDType::kFp6E3M2 || q.w1.dtype == QuantDType::kFp6E2M3;
  return mx_weights && q.w1.shape == GroupShape{1, 32} && q.a1.dtype == QuantDType::kFp8E4M3;
}

// The codes of x (rows < num_rows when given) under a static per-tensor e4m3 scale, as bf16
// values, into y (may be x).
void launch_fp8_codes_as_bf16(const void* x, void* y, int64_t rows, int64_t cols,
                              const QuantDesc& desc, const int32_t* num_rows, cudaStream_t stream) {
  MOEKIT_CHECK(desc.scale.defined() && desc.scale.numel() == 1,
               "fp8 activations of MXFP4 weights need one static per-tensor scale, got {}",
               desc.scale.defined() ? desc.scale.describe() : std::string("none (dynamic)"));
  cuda::QuantizeRowsArgs q;
  q.x = x;
  q.x_type = cuda::ElemType::kBF16;
  q.rows = rows;
  q.cols = q.x_ld = q.q_ld = cols;
  q.num_rows = num_rows;
  q.q = y;
  q.q_type = cuda::ElemType::kE4M3;
  q.kind = cuda::RowQuant::kTensorStatic;
  q.static_scale = desc.scale.data_as<const float>();
  q.codes_as_bf16 = true;
  if (const char* why = cuda::quantize_rows_unsupported_reason(q)) {
    MOEKIT_CHECK(false, "fp8 codes of MXFP4 activations: {}", why);
  }
  MOEKIT_CUDA_CHECK(cuda::launch_quantize_rows(q, stream));
}

// `bf16_codes`: the experts write x's codes into workspace2 (fp8_codes_as_bf16), the
// activation's in place.
Ws2Layout ws2_layout(int64_t M, int64_t N, int64_t K, int64_t topk, int64_t E, Activation act,
                     size_t es, const QuantDesc& a1, const QuantDesc& a2, bool bf16_codes) {
  const int64_t rows = M * topk;
  const int64_t d = activation_output_dim(act, N);
  const int64_t capacity =
      cuda::moe_align_capacity(M, static_cast<int>(topk), static_cast<int>(E), 1);
  Ws2Layout l;
  ByteRegions r(kAlign);
  l.act = r.take(static_cast<size_t>(rows * d) * es);
  l.gemm2 = r.take(static_cast<size_t>(rows * K) * es);
  l.counts = r.take(static_cast<size_t>(E) * 4);
  l.offsets = r.take(static_cast<size_t>(E + 1) * 4);
  l.permuted = r.take(static_cast<size_t>(capacity) * 4);
  l.slot_to_row = r.take(static_cast<size_t>(rows) * 4);
  l.total = r.take(4);
  l.token_rows = r.take(static_cast<size_t>(capacity) * 4);
  l.align_ws_bytes =
      cuda::moe_align_workspace_bytes(M, static_cast<int>(topk), static_cast<int>(E));
  l.align_ws = r.take(l.align_ws_bytes);
  l.expert_done = r.take(static_cast<size_t>(E) * 4);  // the decode pair's counters (align zeroes)
  // The grouped GEMMs' stream-K counters (align zeroes them) and partial sums.
  if (stream_k_enabled()) l.stream_k = r.take(cuda::stream_k_workspace_bytes());
  if (mx_activation(a1) || bf16_codes) {
    l.a1_mx = r.take(static_cast<size_t>(M * K) * es);  // x, MX-rounded or its fp8 codes
  }
  if (a2.dtype != QuantDType::kNone && !mx_activation(a2) && !bf16_codes) {
    l.a2 = take_a2_regions(r, rows, d, a2);
  }
  l.bytes = r.size();
  return l;
}

__global__ void set_single_expert_offsets(int32_t* offsets, int32_t rows) {
  offsets[0] = 0;
  offsets[1] = rows;
}

template <typename T>
T* at(const Tensor& base, size_t byte_offset) {
  return reinterpret_cast<T*>(static_cast<char*>(base.data()) + byte_offset);
}

cuda::ElemType gemm_dtype_of(DType dtype) {
  MOEKIT_CHECK(dtype == DType::kBF16 || dtype == DType::kF16,
               "the Hopper GEMM takes bf16 or f16, got {}", dtype_name(dtype));
  return cuda::elem_type_of(dtype);
}

// Sets GEMM1's fused gated activation (the weights are then in blocks-of-32 gate/up order).
void set_fused_activation(cuda::GroupedGemmArgs& g, Activation act,
                          const ActivationParams& params) {
  switch (act) {
    case Activation::kSilu:
      g.fused_act = cuda::FusedActivation::kSiluMul;
      break;
    case Activation::kGelu:
      g.fused_act = cuda::FusedActivation::kGeluMul;
      break;
    case Activation::kGeluTanh:
      g.fused_act = cuda::FusedActivation::kGeluTanhMul;
      break;
    case Activation::kSwigluOai:
      g.fused_act = cuda::FusedActivation::kSwigluOai;
      break;
    case Activation::kSwigluStep:
      g.fused_act = cuda::FusedActivation::kSwigluStep;
      break;
    case Activation::kRelu2:
      g.fused_act = cuda::FusedActivation::kRelu2Mul;
      break;
    default:
      MOEKIT_CHECK(false, "activation {} has no fused GEMM1 epilogue", activation_name(act));
  }
  g.has_clamp_limit = params.clamp_limit.has_value();
  if (params.clamp_limit) g.clamp_limit = *params.clamp_limit;
  g.alpha = params.alpha;
}

// The GEMM's scale kinds for these group shapes: activations per tensor, per token or in 1x128
// groups; weights per expert tensor, per channel, per channel and 128 of K (int4 groups) or in
// 128x128 blocks.
cuda::AScale activation_scale_kind(const GroupShape& g) {
  return g.is_per_tensor()  ? cuda::AScale::kTensor
         : g.is_per_token() ? cuda::AScale::kRow
                            : cuda::AScale::kRowBlock128;
}
cuda::WScale weight_scale_kind(const GroupShape& g) {
  return g.is_per_tensor()         ? cuda::WScale::kExpert
         : g.is_per_channel()      ? cuda::WScale::kChannel
         : g == GroupShape{1, 128} ? cuda::WScale::kGroup128
                                   : cuda::WScale::kBlock32x128;
}

// The 8-bit operands of a GEMM: `codes` (e4m3 or int8) A and W, out in `out`, A's scales
// (a_scale, laid out per the activation descriptor `a`) and W's (the kernel-layout scales of
// LaunchState).
void set_scaled_operands(cuda::GroupedGemmArgs& g, const sm90::LaunchState& state, DType codes,
                         const Tensor& w_scale, const QuantDesc& a, const Tensor& a_scale,
                         DType out) {
  g.dtype = cuda::elem_type_of(codes);
  g.out_dtype = gemm_dtype_of(out);
  MOEKIT_CHECK(a_scale.defined(),
               "{} experts: the activation scales (a1q_scale / a2 scale) are "
               "missing; the prepare must quantize a1",
               dtype_name(codes));
  g.a_scale = a_scale.data_as<const float>();
  g.a_scale_kind = activation_scale_kind(a.shape);
  if (g.a_scale_kind == cuda::AScale::kRowBlock128) {
    MOEKIT_CHECK(a.shape.col == 128, "{} experts: activation groups of {} (the GEMM takes 128)",
                 dtype_name(codes), a.shape.col);
    g.a_scale_ld = a_scale.size(a_scale.dim() - 1);
  }
  if (state.scales == sm90::LaunchState::WeightScales::kMxfp4Words) {  // e8m0 words, no w_scale
    g.w_scale = nullptr;
    g.w_scale_kind = cuda::WScale::kNone;
    g.w_group_scale = static_cast<const uint8_t*>(w_scale.data());
    return;
  }
  g.w_scale = w_scale.data_as<const float>();
  switch (state.scales) {
    case sm90::LaunchState::WeightScales::kTensor:
      g.w_scale_kind = cuda::WScale::kExpert;
      break;
    case sm90::LaunchState::WeightScales::kChannel:
      g.w_scale_kind = cuda::WScale::kChannel;
      break;
    case sm90::LaunchState::WeightScales::kGroup:
      g.w_scale_kind = cuda::WScale::kGroup128;
      break;
    default:
      g.w_scale_kind = cuda::WScale::kBlock32x128;
      break;
  }
}

// Launches one grouped GEMM with the experts' tile (-1: by rows per expert) and W's prepared
// launch state (used when it describes args.w); throws with can_implement's reason.
// stream_k: the workspace of stream-K launches (its counters zeroed by the align launch), or null.
void run_gemm(const cuda::GroupedGemmArgs& args, int tile,
              const cuda::sm90::WeightLaunchCache& cache, Stream stream, const char* what,
              void* stream_k = nullptr) {
  cuda::GroupedGemmParams params;
  params.tile = tile;
  params.cache = &cache;
  if (stream_k != nullptr) params.stream_k = cuda::StreamK::kBalance;
  const std::string why = cuda::can_implement(args, params);
  MOEKIT_CHECK(why.empty(), "{}: the grouped GEMM cannot run this problem: {}", what, why);
  MOEKIT_CUDA_CHECK(cuda::run_grouped_gemm(args, to_cuda(stream), params, stream_k));
}

// The row GEMM `gemm` of grouped_apply launches with at M tokens (sm90::tile_for); a tuned row
// that the problem's shape does not fit (a hand-written table) gives way to the heuristic.
int launch_tile(const sm90::LaunchState& state, int gemm, int64_t M,
                const cuda::GroupedGemmArgs& args) {
  const int row = sm90::tile_for(state, gemm, M);
  if (state.tile < 0 && row >= 0 && !cuda::detail::tile_fits(args, row).empty()) return -1;
  return row;
}

// The CUDA-core row both GEMMs land on (the heuristic's when the tuned / forced row is -1), when
// the layer may run them as the decode pair (cuda::run_grouped_gemm_pair; not in tune's per-GEMM
// timing, nor with MOEKIT_DISABLE_DECODE_PAIR set); else -1.
int decode_pair_row(const sm90::LaunchState& state, const cuda::GroupedGemmArgs& g1,
                    const cuda::GroupedGemmArgs& g2, int row1, int row2) {
  static const bool disabled = env::get_bool("MOEKIT_DISABLE_DECODE_PAIR", false);
  if (!state.decode_pair || disabled) return -1;
  const int r1 = row1 >= 0 ? row1 : cuda::select_grouped_gemm_tile(g1);
  const int r2 = row2 >= 0 ? row2 : cuda::select_grouped_gemm_tile(g2);
  if (r1 != r2 || cuda::sm90::kTileTable[r1].kind != cuda::sm90::MainloopKind::kSimt) return -1;
  return cuda::can_run_grouped_gemm_pair(g1, g2, r1).empty() ? r1 : -1;
}

bool is_8bit_codes(DType d) {
  return d == DType::kFp8E4M3 || d == DType::kInt8;
}

bool is_packed_fp4(DType d) {
  return d == DType::kUInt8 || d == DType::kFp4E2M1x2;
}

// The bf16-activation packings (MXFP4, NVFP4, MXFP6): W4A16's kernels.
bool is_w4a16_packing(cuda::WPacking p) {
  return p == cuda::WPacking::kMxfp4 || p == cuda::WPacking::kNvfp4 ||
         p == cuda::WPacking::kMxfp6E2M3 || p == cuda::WPacking::kMxfp6E3M2;
}

// The packings whose codes the GEMMs' producer converts to e4m3 (int4, MXFP4 with fp8 A).
bool is_e4m3_packing(cuda::WPacking p) {
  return p == cuda::WPacking::kInt4 || p == cuda::WPacking::kMxfp4Fp8;
}

// Elements of K in `bytes` bytes of a packed row (6-bit codes: 4 per 3 bytes; 4-bit: 2 per byte).
int64_t packed_row_elements(cuda::WPacking p, int64_t bytes) {
  if (p == cuda::WPacking::kMxfp6E2M3 || p == cuda::WPacking::kMxfp6E3M2) return bytes * 4 / 3;
  return p == cuda::WPacking::kNone ? bytes : 2 * bytes;
}

// W (experts, n, k) as the GEMM sees it, for prepare_grouped_gemm_weights; fp8 / int8 codes with
// output `out`; packed e2m1 / fp6 rows with bf16 A and C for the W4A16 packings; uint4b8 pairs
// with e4m3 A and C of `out` for kInt4.
cuda::GroupedGemmArgs weight_shape(const Tensor& w, DType out, cuda::WPacking packing) {
  cuda::GroupedGemmArgs g;
  g.w = w.data();
  g.num_experts = static_cast<int>(w.dim() == 3 ? w.size(0) : 1);
  g.n = static_cast<int>(w.size(w.dim() - 2));
  g.k = static_cast<int>(packed_row_elements(packing, w.size(w.dim() - 1)));
  if (is_w4a16_packing(packing)) {
    g.dtype = gemm_dtype_of(out);
    g.w_packing = packing;
  } else if (is_e4m3_packing(packing)) {
    g.dtype = cuda::ElemType::kE4M3;
    g.out_dtype = gemm_dtype_of(out);
    g.w_packing = packing;
  } else if (is_8bit_codes(w.dtype())) {
    g.dtype = cuda::elem_type_of(w.dtype());
    g.out_dtype = gemm_dtype_of(out);
  } else {
    g.dtype = gemm_dtype_of(w.dtype());
  }
  return g;
}

// W's launch state; empty (every launch prepares itself) for a tensor the GEMM cannot take.
cuda::sm90::WeightLaunchCache prepare(const Tensor& w, DType out, cuda::WPacking packing) {
  cuda::sm90::WeightLaunchCache cache;
  const bool takes =
      is_w4a16_packing(packing) ? is_packed_fp4(w.dtype())
      : is_e4m3_packing(packing)
          ? w.dtype() == DType::kUInt8
          : w.dtype() == DType::kBF16 || w.dtype() == DType::kF16 || is_8bit_codes(w.dtype());
  if (!w.defined() || !w.device().is_cuda() || (w.dim() != 2 && w.dim() != 3) || !takes) {
    return cache;
  }
  MOEKIT_CUDA_CHECK(cuda::prepare_grouped_gemm_weights(weight_shape(w, out, packing), &cache));
  return cache;
}

}  // namespace

namespace sm90 {

WorkspaceShapes grouped_workspace_shapes(const MoEConfig& moe, const QuantConfig& quant,
                                         cuda::WPacking packing, int64_t M, int64_t N, int64_t K,
                                         int64_t topk, int64_t local_num_experts,
                                         Activation activation) {
  const size_t es = element_size(moe.in_dtype);
  // As grouped_apply: the bf16 codes only where the W4A16 kernels take them.
  const Ws2Layout l = ws2_layout(M, N, K, topk, local_num_experts, activation, es, quant.a1,
                                 quant.a2, is_w4a16_packing(packing) && fp8_codes_as_bf16(quant));
  return {{M * topk, N}, {static_cast<int64_t>((l.bytes + es - 1) / es)}, {M, K}};
}

void grouped_apply(const ExpertsModular& experts, const LaunchState& state,
                   const ExpertsApplyArgs& args, RunContext ctx) {
  MOEKIT_CHECK(ctx.stream.handle != nullptr,
               "Sm90GroupedExperts needs a CUDA stream in RunContext");
  const Tensor& x = args.hidden_states;
  expect_dim(x, "hidden_states", 2);
  expect_contiguous(x, "hidden_states");
  expect_contiguous(args.w1, "w1");
  expect_contiguous(args.w2, "w2");
  expect_contiguous(args.topk_ids, "topk_ids");
  expect_contiguous(args.topk_weights, "topk_weights");
  const int64_t M = x.size(0), K = x.size(1), topk = args.topk_ids.size(1);
  const int64_t E = args.w1.size(0), N = args.w1.size(1);
  const int64_t d = activation_output_dim(args.activation, N);
  // MXFP4 / NVFP4 / MXFP6: bf16 activations, W packed (2 elements per byte, or 4 per 3 bytes)
  // with group scale codes.
  const bool nvfp4 = state.packing == cuda::WPacking::kNvfp4;
  const bool packed_fp4 = is_w4a16_packing(state.packing);
  const bool packed_int4 = is_e4m3_packing(state.packing);  // int4 or MXFP4 with e4m3 A
  const int64_t w1_k = packed_row_elements(state.packing, args.w1.size(2));
  const int64_t w2_k = packed_row_elements(state.packing, args.w2.size(2));
  MOEKIT_CHECK(w2_k == d, "w2 {} has I={} but the activation of w1 (N={}) gives {}",
               args.w2.describe(), w2_k, N, d);
  MOEKIT_CHECK(w1_k == K, "w1 {} holds K={} elements per row, x has {}", args.w1.describe(), w1_k,
               K);
  const QuantConfig& quant = experts.quant_config();
  const bool scaled = state.scales != LaunchState::WeightScales::kNone && !packed_fp4;
  // The activations' dtype (GEMM outputs, the activation, the output): x's, or for 8-bit codes
  // the output's; `codes` is the operands' dtype (the weights': e4m3 or int8).
  const DType dtype = scaled ? args.output.dtype() : x.dtype();
  const DType codes = packed_int4 ? DType::kFp8E4M3 : scaled ? args.w1.dtype() : dtype;
  MOEKIT_CHECK(!scaled || is_8bit_codes(codes), "w1 holds {}, the experts take e4m3 or int8 codes",
               args.w1.describe());
  expect_dtype(x, "hidden_states", {codes});
  if (packed_fp4) {
    expect_dtype(args.w1, "w1", {DType::kUInt8, DType::kFp4E2M1x2});
    expect_dtype(args.w2, "w2", {DType::kUInt8, DType::kFp4E2M1x2});
  } else if (packed_int4) {
    expect_dtype(args.w1, "w1", {DType::kUInt8});
    expect_dtype(args.w2, "w2", {DType::kUInt8});
  } else {
    expect_dtype(args.w1, "w1", {codes});
    expect_dtype(args.w2, "w2", {codes});
  }
  const size_t es = element_size(dtype);
  const bool bf16_codes = packed_fp4 && !nvfp4 && fp8_codes_as_bf16(quant);
  const Ws2Layout l =
      ws2_layout(M, N, K, topk, E, args.activation, es, quant.a1, quant.a2, bf16_codes);
  MOEKIT_CHECK(args.workspace2.nbytes() >= l.bytes, "workspace2 holds {} bytes, needs {}",
               args.workspace2.nbytes(), l.bytes);
  const Tensor& ws2 = args.workspace2;
  int32_t* counts = at<int32_t>(ws2, l.counts);
  int32_t* offsets = at<int32_t>(ws2, l.offsets);
  int32_t* permuted = at<int32_t>(ws2, l.permuted);
  int32_t* slot_to_row = at<int32_t>(ws2, l.slot_to_row);
  int32_t* total = at<int32_t>(ws2, l.total);
  int32_t* token_rows = at<int32_t>(ws2, l.token_rows);
  const cudaStream_t stream = to_cuda(ctx.stream);

  // 1. align: sort the slots by local expert.
  cuda::MoeAlignParams align;
  align.topk_ids = args.topk_ids.data_as<const int32_t>();
  align.num_tokens = M;
  align.top_k = static_cast<int>(topk);
  align.expert_map = args.expert_map.defined() ? args.expert_map.data_as<const int32_t>() : nullptr;
  align.num_global_experts = static_cast<int>(args.global_num_experts);
  align.num_local_experts = static_cast<int>(E);
  align.row_align = 1;
  align.expert_counts = counts;
  align.expert_offsets = offsets;
  align.permuted_rows = permuted;
  align.slot_to_row = slot_to_row;
  align.total_rows = total;
  align.token_rows = token_rows;  // GEMM1's gather index, with the permutation (no extra launch)
  align.workspace = at<void>(ws2, l.align_ws);
  align.workspace_bytes = l.align_ws_bytes;
  align.expert_done = at<int32_t>(ws2, l.expert_done);
  // Stream-K splits the K sums by the batch's work items: never in batch-invariant layers.
  void* const stream_k = stream_k_enabled() && !experts.moe_config().batch_invariant
                             ? at<void>(ws2, l.stream_k)
                             : nullptr;
  if (stream_k != nullptr) {
    align.zero = static_cast<int32_t*>(stream_k);
    align.zero_words = static_cast<int>(cuda::stream_k_counter_words());
  }
  if (const char* why = cuda::moe_align_unsupported_reason(align)) {
    MOEKIT_CHECK(false, "moe align: {}", why);
  }
  MOEKIT_CUDA_CHECK(cuda::launch_moe_align(align, stream));
  const int64_t capacity = M * topk;
  const int64_t tile_M = args.tile_tokens > 0 ? args.tile_tokens : M;  // what picks the tiles
  ctx.stage_done("align");

  // 2. GEMM1 with the token gather: (rows, N) into workspace13.
  const Tensor& b1 = experts.quant_config().w1_bias();
  const Tensor& b2 = experts.quant_config().w2_bias();
  cuda::GroupedGemmArgs g1;
  g1.a = x.data();
  g1.lda = K;
  // MXFP4 / MXFP6 activations (the bf16 kernels of MXFP4 weights): x rounded to its MX values,
  // exact in bf16, into workspace2 (x itself is the caller's).
  const std::optional<cuda::MxElement> mx_a1 = packed_fp4 ? mx_activation(quant.a1) : std::nullopt;
  if (mx_a1) {
    cuda::MxQdqArgs q;
    q.x = x.data();
    q.y = at<void>(ws2, l.a1_mx);
    q.rows = M;
    q.cols = q.x_ld = q.y_ld = K;
    q.element = *mx_a1;
    const char* why = cuda::mx_qdq_unsupported_reason(q);
    MOEKIT_CHECK(why == nullptr, "MX activations: {}", why == nullptr ? "" : why);
    MOEKIT_CUDA_CHECK(cuda::launch_mx_qdq(q, stream));
    ctx.stage_done("quantize a1");
    g1.a = q.y;
  }
  if (bf16_codes) {
    launch_fp8_codes_as_bf16(x.data(), at<void>(ws2, l.a1_mx), M, K, quant.a1, nullptr, stream);
    ctx.stage_done("quantize a1");
    g1.a = at<void>(ws2, l.a1_mx);
  }
  g1.gather_rows = token_rows;
  g1.w = args.w1.data();
  g1.bias = b1.defined() ? b1.data() : nullptr;
  g1.bias_is_fp32 = b1.defined() && b1.dtype() == DType::kF32;
  g1.c = args.workspace13.data();
  g1.ldc = N;
  g1.expert_offsets = offsets;
  g1.num_experts = static_cast<int>(E);
  g1.num_rows_upper_bound = capacity;
  g1.n = static_cast<int>(N);
  g1.k = static_cast<int>(K);
  g1.dtype = gemm_dtype_of(dtype);
  if (scaled) {
    set_scaled_operands(g1, state, codes, state.w1_scale, quant.a1, args.a1q_scale, dtype);
  }
  if (packed_int4) g1.w_packing = state.packing;
  if (packed_fp4) {
    g1.w_packing = state.packing;
    g1.w_group_scale = state.w1_scale.data_as<const uint8_t>();
    if (nvfp4 || bf16_codes) {  // NVFP4's global scales, or fp8 activations' scale
      g1.w_scale_kind = cuda::WScale::kExpert;
      g1.w_scale = state.w1_global.data_as<const float>();
    }
  }
  void* act = at<void>(ws2, l.act);
  const bool fused = sm90_fuses_activation(experts.moe_config());
  if (fused) {  // GEMM1 with the gated activation in its epilogue: (rows, N/2) straight into ws2
    set_fused_activation(g1, args.activation, experts.moe_config().activation_params());
    g1.c = act;
    g1.ldc = d;
  }
  // GEMM2: (rows, K) into workspace2's second region, reading the activation (8-bit codes: its
  // requantized codes, set below once GEMM1 has run).
  cuda::GroupedGemmArgs g2 = g1;
  g2.fused_act = cuda::FusedActivation::kNone;
  g2.a = act;
  g2.lda = d;
  if (packed_fp4) g2.w_group_scale = state.w2_scale.data_as<const uint8_t>();
  if (nvfp4 || bf16_codes) g2.w_scale = state.w2_global.data_as<const float>();
  g2.gather_rows = nullptr;
  g2.w = args.w2.data();
  g2.bias = b2.defined() ? b2.data() : nullptr;
  g2.bias_is_fp32 = b2.defined() && b2.dtype() == DType::kF32;
  g2.c = at<void>(ws2, l.gemm2);
  g2.ldc = K;
  g2.n = static_cast<int>(K);
  g2.k = static_cast<int>(d);
  const std::optional<cuda::MxElement> mx_a2 = packed_fp4 ? mx_activation(quant.a2) : std::nullopt;

  const int row1 = launch_tile(state, 0, tile_M, g1);
  // The pair only for 16-bit operands and the fused activation (checked first: no tile selection
  // for the other layers' forwards).
  const bool may_pair = fused && !scaled && !mx_a2 && !bf16_codes;
  if (const int row =
          may_pair ? decode_pair_row(state, g1, g2, row1, launch_tile(state, 1, tile_M, g2)) : -1;
      row >= 0) {
    // 2-4. GEMM1 + activation and GEMM2 as the decode pair: one launch.
    MOEKIT_CUDA_CHECK(
        cuda::run_grouped_gemm_pair(g1, g2, row, align.expert_done, stream, &state.w1));
    ctx.stage_done("gemm1+gemm2");
  } else {
    if (fused) {  // 2+3.
      run_gemm(g1, row1, state.w1, ctx.stream, "GEMM1 + activation", stream_k);
      ctx.stage_done("gemm1");
    } else {
      run_gemm(g1, row1, state.w1, ctx.stream, "GEMM1", stream_k);
      ctx.stage_done("gemm1");
      // 3. activation on the valid rows.
      cuda::run_activation(args.activation, experts.moe_config().activation_params(),
                           args.workspace13.data(), act, dtype, capacity, N, total, permuted,
                           ctx.stream);
      ctx.stage_done("activation");
    }
    // 4. GEMM2; 8-bit codes first requantize the activation of the rows that exist (total) per
    // the a2 scheme.
    if (scaled) {
      const DeviceQuantShapes qs = device_quant_shapes(capacity, d, quant.a2);
      Tensor a2q = Tensor::from_blob(at<void>(ws2, l.a2.q), qs.data, qs.data_dtype, x.device());
      Tensor a2_scale =
          Tensor::from_blob(at<void>(ws2, l.a2.scale), qs.scale, DType::kF32, x.device());
      const Tensor act_rows = Tensor::from_blob(act, {capacity, d}, dtype, x.device());
      quantize_on_device(act_rows, quant.a2, a2q, a2_scale, at<void>(ws2, l.a2.amax), {total},
                         ctx.stream);
      ctx.stage_done("quantize a2");
      set_scaled_operands(g2, state, codes, state.w2_scale, quant.a2, a2_scale, dtype);
      g2.a = a2q.data();
    }
    if (mx_a2) {  // the activation rounded to its MX values in place, the rows that exist (total)
      cuda::MxQdqArgs q;
      q.x = act;
      q.y = act;
      q.rows = capacity;
      q.cols = q.x_ld = q.y_ld = d;
      q.num_rows = total;
      q.element = *mx_a2;
      const char* why = cuda::mx_qdq_unsupported_reason(q);
      MOEKIT_CHECK(why == nullptr, "MX activations: {}", why == nullptr ? "" : why);
      MOEKIT_CUDA_CHECK(cuda::launch_mx_qdq(q, stream));
      ctx.stage_done("quantize a2");
    }
    if (bf16_codes) {  // the activation's codes in place, the rows that exist (total)
      launch_fp8_codes_as_bf16(act, act, capacity, d, quant.a2, total, stream);
      ctx.stage_done("quantize a2");
    }
    run_gemm(g2, launch_tile(state, 1, tile_M, g2), state.w2, ctx.stream, "GEMM2", stream_k);
    ctx.stage_done("gemm2");
  }

  // 5. weighted unpermute + reduce into the (M, K) output (workspace13 is dead by now).
  cuda::MoeUnpermuteParams u;
  u.layout = cuda::UnpermuteLayout::kStandard;
  u.y = g2.c;
  u.y_type = cuda::float_storage_of(dtype);
  u.y_row_stride = K;
  u.slot_to_row = slot_to_row;
  u.topk_weights = args.topk_weights.data_as<const float>();
  u.apply_router_weight_on_input = args.apply_router_weight_on_input;
  u.num_tokens = M;
  u.top_k = static_cast<int>(topk);
  u.hidden = K;
  expect_shape(args.output, "experts output", {M, K});
  u.out = args.output.data();
  u.out_type = cuda::float_storage_of(args.output.dtype());
  u.out_row_stride = K;
  u.skip_empty_rows = args.skip_unrouted_rows;
  if (const char* why = cuda::moe_unpermute_unsupported_reason(u)) {
    MOEKIT_CHECK(false, "unpermute: {}", why);
  }
  MOEKIT_CUDA_CHECK(cuda::launch_moe_unpermute(u, stream));
  ctx.stage_done("reduce");
}

// Byte layout of the batched launches' workspace2: the activation (rows, d) in the layer dtype,
// then for 8-bit experts a2's codes, its scales and the amax word of a dynamic per-tensor scale.
// Not workspace13: the modular kernel reuses it for the experts' output, which GEMM2 writes while
// it reads a2's codes.
struct BatchedWs2Layout {
  A2Regions a2;
  size_t bytes = 0;
};

BatchedWs2Layout batched_ws2_layout(int64_t rows, int64_t d, size_t es, const QuantDesc& a2) {
  BatchedWs2Layout l;
  ByteRegions r(kAlign);
  r.take(static_cast<size_t>(rows * d) * es);  // the activation, at 0
  if (a2.dtype != QuantDType::kNone) l.a2 = take_a2_regions(r, rows, d, a2);
  l.bytes = r.size();
  return l;
}

WorkspaceShapes batched_workspace_shapes(const MoEConfig& moe, const QuantConfig& quant, int64_t T,
                                         int64_t N, int64_t K, int64_t local_num_experts,
                                         Activation activation) {
  const int64_t rows = local_num_experts * T;
  const int64_t d = activation_output_dim(activation, N);
  const size_t es = element_size(moe.in_dtype);
  const size_t ws2 = batched_ws2_layout(rows, d, es, quant.a2).bytes;
  return {{rows, N}, {static_cast<int64_t>((ws2 + es - 1) / es)}, {local_num_experts, T, K}};
}

// The GEMMs of the one-launch expert-parallel forward: w1 / w2 (16-bit, or packed W4A16 with
// their group scales and NVFP4's global scales from the launch state), their biases and the fused
// activation; A, C and the schedule are the launch's.
cuda::ep::OneLaunchArgs one_launch_args(const ExpertsModular& experts,
                                        const sm90::LaunchState& state,
                                        const ExpertsApplyArgs& args) {
  const MoEConfig& moe = experts.moe_config();
  const Tensor& b1 = experts.quant_config().w1_bias();
  const Tensor& b2 = experts.quant_config().w2_bias();
  const int64_t K = args.hidden_states.size(1);
  const int64_t N = args.w1.size(1);
  cuda::ep::OneLaunchArgs o;
  cuda::GroupedGemmArgs& g1 = o.g1;
  g1.w = args.w1.data();
  g1.bias = b1.defined() ? b1.data() : nullptr;
  g1.bias_is_fp32 = b1.defined() && b1.dtype() == DType::kF32;
  g1.n = static_cast<int>(N);
  g1.k = static_cast<int>(K);
  g1.dtype = gemm_dtype_of(moe.in_dtype);
  set_fused_activation(g1, args.activation, moe.activation_params());
  cuda::GroupedGemmArgs& g2 = o.g2;
  g2.w = args.w2.data();
  g2.bias = b2.defined() ? b2.data() : nullptr;
  g2.bias_is_fp32 = b2.defined() && b2.dtype() == DType::kF32;
  g2.n = static_cast<int>(K);
  g2.k = static_cast<int>(activation_output_dim(args.activation, N));
  g2.dtype = g1.dtype;
  if (is_w4a16_packing(state.packing)) {
    g1.w_packing = g2.w_packing = state.packing;
    g1.w_group_scale = state.w1_scale.data_as<const uint8_t>();
    g2.w_group_scale = state.w2_scale.data_as<const uint8_t>();
    if (state.packing == cuda::WPacking::kNvfp4) {
      g1.w_scale_kind = g2.w_scale_kind = cuda::WScale::kExpert;
      g1.w_scale = state.w1_global.data_as<const float>();
      g2.w_scale = state.w2_global.data_as<const float>();
    }
  }
  o.workspace = args.workspace2.data();
  return o;
}

void batched_apply(const ExpertsModular& experts, const LaunchState& state,
                   const ExpertsApplyArgs& args, RunContext ctx) {
  MOEKIT_CHECK(ctx.stream.handle != nullptr, "{} needs a CUDA stream in RunContext",
               experts.name());
  const Tensor& x = args.hidden_states;
  expect_dim(x, "hidden_states", 3);
  expect_contiguous(x, "hidden_states");
  expect_contiguous(args.w1, "w1");
  expect_contiguous(args.w2, "w2");
  MOEKIT_CHECK(
      args.expert_tokens_meta != nullptr && args.expert_tokens_meta->expert_num_tokens.defined(),
      "{} needs per-expert token counts (ExpertTokensMetadata)", experts.name());
  const Tensor& counts = args.expert_tokens_meta->expert_num_tokens;
  expect_dtype(counts, "expert_num_tokens", {DType::kInt32});
  expect_device(counts, "expert_num_tokens", x.device());
  const int64_t E = x.size(0), T = x.size(1), K = x.size(2);
  const int64_t N = args.w1.size(1);
  const int64_t d = activation_output_dim(args.activation, N);
  MOEKIT_CHECK(args.w1.size(0) == E && args.w2.size(2) == d,
               "{}: w1 {} / w2 {} do not fit hidden_states {}", experts.name(), args.w1.describe(),
               args.w2.describe(), x.describe());
  const QuantConfig& quant = experts.quant_config();
  const bool scaled = state.scales != LaunchState::WeightScales::kNone;
  // The activations' dtype (GEMM outputs, the activation, the output): x's, or for 8-bit codes
  // the output's; `codes` the operands' dtype.
  const DType dtype = scaled ? args.output.dtype() : x.dtype();
  const DType codes = scaled ? args.w1.dtype() : dtype;
  MOEKIT_CHECK(!scaled || is_8bit_codes(codes), "w1 holds {}, the experts take e4m3 or int8 codes",
               args.w1.describe());
  expect_dtype(x, "hidden_states", {codes});
  expect_dtype(args.w1, "w1", {codes});
  expect_dtype(args.w2, "w2", {codes});
  const Tensor& b1 = quant.w1_bias();
  const Tensor& b2 = quant.w2_bias();

  cuda::GroupedGemmArgs g1;
  g1.a = x.data();
  g1.lda = K;
  g1.w = args.w1.data();
  g1.bias = b1.defined() ? b1.data() : nullptr;
  g1.bias_is_fp32 = b1.defined() && b1.dtype() == DType::kF32;
  g1.c = args.workspace13.data();
  g1.ldc = N;
  g1.expert_counts = counts.data_as<const int32_t>();
  g1.batched_stride = T;
  g1.num_experts = static_cast<int>(E);
  // At most T rows per expert, and at most top_k per token of the T: the tighter bound sizes the
  // grid and picks the tiles by rows per expert (T * top_k / E at decode: the swap-AB rows, not
  // the tile for T rows per expert).
  const int64_t topk = std::max<int64_t>(experts.moe_config().experts_per_token,
                                         args.topk_ids.defined() ? args.topk_ids.size(1) : 1);
  g1.num_rows_upper_bound = std::min(E * T, T * topk);
  g1.n = static_cast<int>(N);
  g1.k = static_cast<int>(K);
  g1.dtype = gemm_dtype_of(dtype);
  if (scaled) {
    set_scaled_operands(g1, state, codes, state.w1_scale, quant.a1, args.a1q_scale, dtype);
  }
  const BatchedWs2Layout l = batched_ws2_layout(E * T, d, element_size(dtype), quant.a2);
  MOEKIT_CHECK(args.workspace2.nbytes() >= l.bytes, "workspace2 holds {} bytes, needs {}",
               args.workspace2.nbytes(), l.bytes);
  void* act = args.workspace2.data();
  if (sm90_fuses_activation(experts.moe_config())) {
    set_fused_activation(g1, args.activation, experts.moe_config().activation_params());
    g1.c = act;
    g1.ldc = d;
    run_gemm(g1, state.tile, state.w1, ctx.stream, "batched GEMM1 + activation");
    ctx.stage_done("gemm1");
  } else {
    run_gemm(g1, state.tile, state.w1, ctx.stream, "batched GEMM1");
    ctx.stage_done("gemm1");
    // Rows past each expert's count hold stale values; their activations are never read.
    cuda::run_activation(args.activation, experts.moe_config().activation_params(),
                         args.workspace13.data(), act, dtype, E * T, N, nullptr, nullptr,
                         ctx.stream);
    ctx.stage_done("activation");
  }
  cuda::GroupedGemmArgs g2 = g1;
  g2.fused_act = cuda::FusedActivation::kNone;
  g2.a = act;
  g2.lda = d;
  g2.w = args.w2.data();
  g2.bias = b2.defined() ? b2.data() : nullptr;
  g2.bias_is_fp32 = b2.defined() && b2.dtype() == DType::kF32;
  if (scaled) {
    // 8-bit codes: the activation requantized per the a2 scheme, the rows that exist only, into
    // workspace2 after the activation (batched_ws2_layout).
    const Tensor& ws2 = args.workspace2;
    const DeviceQuantShapes qs = device_quant_shapes(E * T, d, quant.a2);
    Tensor a2q = Tensor::from_blob(at<void>(ws2, l.a2.q), qs.data, qs.data_dtype, x.device());
    Tensor a2_scale =
        Tensor::from_blob(at<void>(ws2, l.a2.scale), qs.scale, DType::kF32, x.device());
    const Tensor act_rows = Tensor::from_blob(act, {E * T, d}, dtype, x.device());
    quantize_on_device(act_rows, quant.a2, a2q, a2_scale, at<void>(ws2, l.a2.amax),
                       {nullptr, counts.data_as<const int32_t>(), T}, ctx.stream);
    ctx.stage_done("quantize a2");
    set_scaled_operands(g2, state, codes, state.w2_scale, quant.a2, a2_scale, dtype);
    g2.a = a2q.data();
  }
  expect_shape(args.output, "experts output", {E, T, K});
  g2.c = args.output.data();
  g2.ldc = K;
  g2.n = static_cast<int>(K);
  g2.k = static_cast<int>(d);
  run_gemm(g2, state.tile, state.w2, ctx.stream, "batched GEMM2");
  ctx.stage_done("gemm2");
}

void bind_weights(LaunchState& state, const Tensor& w1, const Tensor& w2, DType act_dtype) {
  state.w1 = prepare(w1, act_dtype, state.packing);
  state.w2 = prepare(w2, act_dtype, state.packing);
}

cuda::sm90::TileFamily fp8_tile_family(const GroupShape& weight, const GroupShape& activation) {
  cuda::GroupedGemmArgs g;
  g.dtype = cuda::ElemType::kE4M3;
  g.w_scale_kind = weight_scale_kind(weight);
  g.a_scale_kind = activation_scale_kind(activation);
  return cuda::tile_family_of(g);
}

std::string describe_grouped_tiles(const MoEConfig& moe, const std::optional<QuantKey>& weight,
                                   const std::optional<QuantKey>& activation, bool mxfp4_fp8) {
  const int64_t H = moe.hidden_dim, I = moe.intermediate_size_per_partition();
  const int64_t N = moe.is_act_and_mul() ? 2 * I : I;
  cuda::GroupedGemmArgs g;
  g.num_experts = static_cast<int>(moe.num_local_experts);
  g.dtype = gemm_dtype_of(moe.in_dtype);
  const QuantDType wd = weight ? weight->dtype : QuantDType::kNone;
  if (wd == QuantDType::kFp4E2M1 && mxfp4_fp8) {  // the e4m3 rows (Sm90Mxfp4Fp8Experts)
    g.dtype = cuda::ElemType::kE4M3;
    g.w_packing = cuda::WPacking::kMxfp4Fp8;
    g.out_dtype = gemm_dtype_of(moe.in_dtype);
    g.a_scale_kind = cuda::AScale::kTensor;
  } else if (wd == QuantDType::kFp4E2M1) {  // MXFP4 or NVFP4: the same rows, the same fits
    g.w_packing = cuda::WPacking::kMxfp4;
  } else if (wd == QuantDType::kFp6E2M3 || wd == QuantDType::kFp6E3M2) {
    g.w_packing =
        wd == QuantDType::kFp6E2M3 ? cuda::WPacking::kMxfp6E2M3 : cuda::WPacking::kMxfp6E3M2;
  } else if (wd == QuantDType::kFp8E4M3 || wd == QuantDType::kInt8 || wd == QuantDType::kInt4) {
    g.dtype = wd == QuantDType::kInt8 ? cuda::ElemType::kS8 : cuda::ElemType::kE4M3;
    if (wd == QuantDType::kInt4) g.w_packing = cuda::WPacking::kInt4;
    g.out_dtype = gemm_dtype_of(moe.in_dtype);
    g.w_scale_kind = weight_scale_kind(weight->scale.group_shape);
    g.a_scale_kind = activation_scale_kind(activation ? activation->scale.group_shape
                                                      : GroupShape::per_tensor());
  }
  cuda::GroupedGemmArgs g1 = g, g2 = g;
  g1.n = static_cast<int>(N);
  g1.k = static_cast<int>(H);
  g2.n = static_cast<int>(H);
  g2.k = static_cast<int>(I);
  const cuda::sm90::TileFamily family = cuda::tile_family_of(g1);
  if (moe.tile_config != "auto") {
    return "  every GEMM: tile " + moe.tile_config +
           " (MoEConfig::tile_config; this scheme's rows: " + cuda::sm90::tile_names(family) +
           ")\n";
  }
  auto padded = [](std::string v, size_t width) {
    v.resize(std::max(width, v.size()), ' ');
    return v;
  };
  // A tuned table's entry for GEMM `gemm` at M: its row (else -1) and, in *why, the entry.
  const std::shared_ptr<const cuda::sm90::TileTables> tables = cuda::sm90::TileTables::active();
  const auto keys = gemm_shape_keys(moe, family);
  auto tuned = [&](int gemm, int64_t M, const cuda::GroupedGemmArgs& args, std::string* why) {
    const cuda::sm90::TunedTile* e = tables->find(moe.device.name, keys[gemm], M);
    if (e == nullptr) return -1;
    const int row = cuda::sm90::find_tile(e->tile, family);
    const std::string unfit = cuda::detail::tile_fits(args, row);
    if (!unfit.empty()) {
      *why = "tuned " + e->tile + " (" + e->source + ") does not fit: " + unfit + "; ";
      return -1;
    }
    char us[32];
    std::snprintf(us, sizeof(us), "%.1f", e->us);
    *why =
        "tuned on " + e->device + " at M=" + std::to_string(e->m) + ": " + us + " us (" + e->source;
    for (const auto& [name, t] : e->candidates) {
      if (name == e->tile) continue;
      std::snprintf(us, sizeof(us), "%.1f", t);
      *why += std::string("; ") + name + " " + us;
    }
    *why += ")";
    return row;
  };
  std::string out;
  for (const int64_t M : {1, 16, 64, 256, 1024, 4096, 16384}) {
    g1.num_rows_upper_bound = g2.num_rows_upper_bound = M * moe.experts_per_token;
    std::string why1, why2, heuristic;
    int t1 = tuned(0, M, g1, &why1);
    int t2 = tuned(1, M, g2, &why2);
    if (t1 < 0) {
      t1 = cuda::select_grouped_gemm_tile(g1, &heuristic);
      why1 += heuristic;
    }
    if (t2 < 0) {
      t2 = cuda::select_grouped_gemm_tile(g2, &heuristic);
      why2 += heuristic;
    }
    // Stream-K where the layer would take it (MOEKIT_STREAM_K=1, not batch-invariant).
    if (stream_k_enabled() && !moe.batch_invariant) {
      for (auto [row, args, why] : {std::tuple{t1, &g1, &why1}, std::tuple{t2, &g2, &why2}}) {
        const std::string sk = cuda::stream_k_note(*args, row, moe.device.num_sms);
        if (!sk.empty()) *why += "; " + sk;
      }
    }
    // 16-bit, both on one CUDA-core row, the activation fused: one launch.
    const bool pair = family == cuda::sm90::TileFamily::k16Bit && t1 == t2 &&
                      cuda::sm90::kTileTable[t1].kind == cuda::sm90::MainloopKind::kSimt &&
                      sm90_fuses_activation(moe);
    out += "  " + padded("M=" + std::to_string(M), 8) + " gemm1 " +
           padded(cuda::sm90::kTileTable[t1].name, 8) + " gemm2 " +
           padded(cuda::sm90::kTileTable[t2].name, 8) + " " + why1 +
           (why2 == why1 ? std::string() : "; gemm2: " + why2) +
           (pair ? "; both GEMMs as one launch (the decode pair)" : "") + "\n";
  }
  return out;
}

void reorder_mxfp4_codes(Tensor& w, bool to_kernel, Stream stream) {
  MOEKIT_CHECK(w.device().is_cuda() && w.is_contiguous() && element_size(w.dtype()) == 1 &&
                   w.numel() % cuda::sm90::kMxfp4GroupBytes == 0,
               "reorder_mxfp4_codes: {} is not a contiguous CUDA tensor of whole 16-byte groups",
               w.describe());
  MOEKIT_CUDA_CHECK(cuda::reorder_mxfp4_groups(w.data(), w.numel() / cuda::sm90::kMxfp4GroupBytes,
                                               to_kernel, to_cuda(stream)));
}

void split_int4_codes(Tensor& w, Stream stream) {
  MOEKIT_CHECK(w.device().is_cuda() && w.is_contiguous() && element_size(w.dtype()) == 1 &&
                   w.numel() % 16 == 0,
               "split_int4_codes: {} is not a contiguous CUDA tensor of whole 16-byte chunks",
               w.describe());
  MOEKIT_CUDA_CHECK(cuda::split_int4_codes(w.data(), w.numel(), to_cuda(stream)));
}

void repack_mxfp6_codes(Tensor& w, bool to_kernel, Stream stream) {
  const int64_t row_bytes = w.dim() > 0 ? w.size(w.dim() - 1) : 0;
  MOEKIT_CHECK(w.device().is_cuda() && w.is_contiguous() && element_size(w.dtype()) == 1 &&
                   row_bytes > 0 && row_bytes % 48 == 0,
               "repack_mxfp6_codes: {} is not a contiguous CUDA tensor of MXFP6 rows (3k / 4 "
               "bytes, k a multiple of 64)",
               w.describe());
  MOEKIT_CUDA_CHECK(cuda::repack_mxfp6_rows(w.data(), w.numel() / row_bytes, row_bytes * 4 / 3,
                                            to_kernel, to_cuda(stream)));
}

void prepare_shared(SharedMlp& mlp) {
  mlp.w13_cache = prepare(mlp.w13, mlp.w13.dtype(), cuda::WPacking::kNone);
  mlp.w2_cache = prepare(mlp.w2, mlp.w2.dtype(), cuda::WPacking::kNone);
}

Tensor shared_forward(const SharedMlp& mlp, const Tensor& x, RunContext ctx) {
  MOEKIT_CHECK(ctx.stream.handle != nullptr, "Sm90SharedExperts needs a CUDA stream in RunContext");
  expect_dim(x, "shared_experts_input", 2);
  expect_contiguous(x, "shared_experts_input");
  const int64_t M = x.size(0), H = x.size(1), N = mlp.w13.size(0), I = mlp.w2.size(1);
  MOEKIT_CHECK(M <= mlp.hidden.size(0), "shared experts: M={} > max_num_tokens={}", M,
               mlp.hidden.size(0));
  MOEKIT_CHECK(H == mlp.w13.size(1) && x.dtype() == mlp.w13.dtype(),
               "shared experts: input {} does not match shared_w13 {}", x.describe(),
               mlp.w13.describe());
  Tensor out = mlp.out.slice(0, 0, M);
  if (M == 0) return out;
  // One "expert" holding every token: offsets {0, M} live in a tiny device constant table.
  int32_t* offsets = mlp.offsets.data_as<int32_t>();
  set_single_expert_offsets<<<1, 1, 0, to_cuda(ctx.stream)>>>(offsets, static_cast<int32_t>(M));
  MOEKIT_CUDA_CHECK(cudaGetLastError());
  cuda::GroupedGemmArgs g1;
  g1.a = x.data();
  g1.lda = H;
  g1.w = mlp.w13.data();
  g1.c = mlp.hidden.data();
  g1.ldc = N;
  g1.expert_offsets = offsets;
  g1.num_experts = 1;
  g1.num_rows_upper_bound = M;
  g1.n = static_cast<int>(N);
  g1.k = static_cast<int>(H);
  g1.dtype = gemm_dtype_of(x.dtype());
  run_gemm(g1, -1, mlp.w13_cache, ctx.stream, "shared GEMM1");
  cuda::run_activation(mlp.activation, mlp.params, mlp.hidden.data(), mlp.act.data(), x.dtype(), M,
                       N, nullptr, nullptr, ctx.stream);
  cuda::GroupedGemmArgs g2 = g1;
  g2.a = mlp.act.data();
  g2.lda = I;
  g2.w = mlp.w2.data();
  g2.c = mlp.out.data();
  g2.ldc = H;
  g2.n = static_cast<int>(H);
  g2.k = static_cast<int>(I);
  run_gemm(g2, -1, mlp.w2_cache, ctx.stream, "shared GEMM2");
  return out;
}

size_t ep_one_launch_workspace_bytes(const cuda::ep::PeerLayout& layout, int64_t local_experts,
                                     int64_t N, Activation activation) {
  return cuda::ep::one_launch_workspace(layout, local_experts, activation_output_dim(activation, N))
      .bytes;
}

std::string ep_one_launch_unsupported_reason(const ExpertsModular& experts,
                                             const LaunchState& state,
                                             const cuda::ep::ForwardArgs& f,
                                             const ExpertsApplyArgs& args) {
  const MoEConfig& moe = experts.moe_config();
  const QuantConfig& quant = experts.quant_config();
  if (quant.a1.dtype != QuantDType::kNone || quant.a2.dtype != QuantDType::kNone) {
    return "the activations are quantized (" + quant.describe() + ")";
  }
  if (state.scales != LaunchState::WeightScales::kNone && !is_w4a16_packing(state.packing)) {
    return "the weights are neither 16-bit nor packed W4A16 (" + quant.describe() + ")";
  }
  if (moe.in_dtype != DType::kBF16 && moe.in_dtype != DType::kF16) {
    return "activations are " + std::string(dtype_name(moe.in_dtype)) + ", not bf16 / f16";
  }
  if (!sm90_fuses_activation(moe)) {
    return "GEMM1 does not fuse this layer's activation (gated, I a multiple of 32)";
  }
  if (args.apply_router_weight_on_input) return "the router weights apply on the input";
  if (args.w1.dim() != 3 || args.w2.dim() != 3) return "w1 / w2 are not (E, n, k)";
  const size_t need =
      ep_one_launch_workspace_bytes(f.layout, f.local_experts, args.w1.size(1), args.activation);
  if (args.workspace2.nbytes() < need) {
    return "workspace2 holds " + std::to_string(args.workspace2.nbytes()) + " bytes, needs " +
           std::to_string(need);
  }
  return cuda::ep::one_launch_unsupported_reason(f, one_launch_args(experts, state, args));
}

void ep_one_launch_apply(const ExpertsModular& experts, const LaunchState& state,
                         const cuda::ep::ForwardArgs& f, const ExpertsApplyArgs& args) {
  // The caller asked ep_one_launch_unsupported_reason first (the launch checks the GEMMs again
  // and fails with cudaErrorInvalidValue rather than run what it cannot).
  MOEKIT_CUDA_CHECK(static_cast<cudaError_t>(
      cuda::ep::launch_one_forward(f, one_launch_args(experts, state, args))));
}

}  // namespace sm90
}  // namespace moekit
