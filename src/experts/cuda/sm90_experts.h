// Device entry points of the Hopper experts (experts/cuda/sm90_experts.cu): the launch sequences
// behind Sm90GroupedExperts, Sm90BatchedExperts and Sm90SharedExperts
// (include/moekit/experts/sm90_experts.h), and the launch state those objects keep. Only moekit
// types and the kit's plain data (sm90/tiles.h, sm90/launch_cache.h): host code reaches the entry
// points through the seam of core/cuda_seam.h.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "experts/cuda/ep_peer.h"
#include "experts/cuda/sm90/launch_cache.h"
#include "experts/cuda/sm90/tile_tables.h"
#include "experts/cuda/sm90/tiles.h"
#include "experts/cuda/w_packing.h"

#include "moekit/config/quant_key.h"
#include "moekit/experts/sm90_experts.h"

namespace moekit::sm90 {

// What an sm90 experts object prepares once instead of at every launch.
struct LaunchState {
  int tile = -1;  // row of cuda::sm90::kTileTable forced by MoEConfig::tile_config; -1: auto
  // Auto (tile -1) on a device with tuned tile tables (sm90/tile_tables.h): the rows they name for
  // GEMM1 / GEMM2 of this layer, by the tuned M (increasing); empty: the heuristic chooses. The
  // Standard-format launches use them (grouped_apply); the batched launches do not.
  struct TunedRows {
    std::vector<int64_t> m;
    std::vector<int> row;
  };
  TunedRows tuned[2];
  cuda::sm90::TileFamily family = cuda::sm90::TileFamily::k16Bit;  // of every row above
  // Whether GEMM1 and GEMM2 may run as the decode pair when both land on one CUDA-core row
  // (cuda::run_grouped_gemm_pair); `moekit tune` turns it off to time the GEMMs apart.
  bool decode_pair = true;
  // Launch state of the bound GEMM1 / GEMM2 weights (bind_weights); empty until then, and unused
  // by a launch given other weights (that launch prepares itself).
  cuda::sm90::WeightLaunchCache w1, w2;
  // fp8 / int8 experts: how W is scaled and its scales in the kernel's layout (f32 on the device;
  // see cuda::WScale: (E,), (E, N) in w13's kernel row order, or (E, ceil(N / 32), ceil(K / 128)));
  // kNone for 16-bit weights. The codes' dtype is the weights' (kFp8E4M3 or kInt8).
  // kMxfp4: W packed as e2m1 pairs or MXFP6 rows (bf16 activations); the scales are the e8m0
  // codes (E, N, K / 32) in the kernel row order (cuda::WPacking::kMxfp4, kMxfp6E2M3, kMxfp6E3M2).
  // kNvfp4: e2m1 pairs with the kernel scale codes (E, N, K / 16) of the ue4m3 scales and
  // w1_global / w2_global (E,) f32, each expert's global scale x 2^8 (cuda::WPacking::kNvfp4).
  // kGroup: per channel and 128 of K (int4 W4A8 groups, cuda::WScale::kGroup128).
  // kMxfp4Words: MXFP4 with e4m3 activations (cuda::WPacking::kMxfp4Fp8): (E, ceil(K / 128), N)
  // int32 words of each row's four e8m0 codes per 128 of K, w13's rows in the kernel order.
  enum class WeightScales : uint8_t {
    kNone,
    kTensor,
    kChannel,
    kBlock,
    kGroup,
    kMxfp4,
    kNvfp4,
    kMxfp4Words
  };
  WeightScales scales = WeightScales::kNone;
  // How W's codes are packed (kNone: one code per element, in its dtype). kInt4 (W4A8): uint4b8
  // pairs (K / 2 bytes per row) with kTensor / kChannel scales; the activations are e4m3 codes.
  // kMxfp4 / kNvfp4 / kMxfp6*: with bf16 activations and the scales above.
  cuda::WPacking packing = cuda::WPacking::kNone;
  Tensor w1_scale, w2_scale;
  Tensor w1_global, w2_global;
};

// The table row MoEConfig::tile_config names ("auto": -1); throws moekit::Error listing the valid
// names for an unknown one.
int tile_from_config(const MoEConfig& moe, const char* who,
                     cuda::sm90::TileFamily family = cuda::sm90::TileFamily::k16Bit);

// GEMM1 (w13: n = 2I or I, k = H) and GEMM2 (w2: n = H, k = I) of this layer as the tuned tables
// key them.
std::array<cuda::sm90::GemmShapeKey, 2> gemm_shape_keys(const MoEConfig& moe,
                                                        cuda::sm90::TileFamily family);

// state.tile from MoEConfig::tile_config (tile_from_config) and, when auto, state.tuned from the
// active tile tables for moe.device (logged at info level: the table and its rows).
void choose_tiles(LaunchState& state, const MoEConfig& moe, const char* who,
                  cuda::sm90::TileFamily family = cuda::sm90::TileFamily::k16Bit);

// The row GEMM `gemm` (0: GEMM1, 1: GEMM2) launches with at M tokens: the forced tile, else the
// tuned row nearest M (within a factor of 2, nearest_m), else -1 (the rows-per-expert heuristic).
// No allocation.
inline int tile_for(const LaunchState& state, int gemm, int64_t M) {
  if (state.tile >= 0) return state.tile;
  const LaunchState::TunedRows& t = state.tuned[gemm];
  const int i = cuda::sm90::nearest_m(t.m.data(), t.m.size(), M);
  return i < 0 ? -1 : t.row[i];
}

// Workspaces of the Standard-format launch sequence (align tables live in workspace2; with an a2
// quantization, its codes and scales too; fp8 activations of MX weights on the bf16 rows, their
// codes as bf16), for W packed as `packing` (LaunchState::packing).
WorkspaceShapes grouped_workspace_shapes(const MoEConfig& moe, const QuantConfig& quant,
                                         cuda::WPacking packing, int64_t M, int64_t N, int64_t K,
                                         int64_t topk, int64_t local_num_experts,
                                         Activation activation);

// Workspaces of the batched launch sequence, T rows per expert: GEMM1's output (E * T, N) in
// workspace13 (which the modular kernel reuses for the experts' output), the activation
// (E * T, N') in workspace2 and after it, with an 8-bit a2, its codes, scales and amax word.
WorkspaceShapes batched_workspace_shapes(const MoEConfig& moe, const QuantConfig& quant, int64_t T,
                                         int64_t N, int64_t K, int64_t local_num_experts,
                                         Activation activation);

// SM count, kernel attributes and W's tensor maps for w1 (E, N, K) and w2 (E, K, N'), on their
// device (fp8 / int8 codes: for GEMMs writing act_dtype). Outside graph capture.
// Packed weights (state.packing) are prepared as such.
void bind_weights(LaunchState& state, const Tensor& w1, const Tensor& w2, DType act_dtype);

// The tile family of an fp8 layer with these weight / activation group shapes: the promoting
// rows for block scales, the direct ones otherwise (cuda::tile_family_of's rule, from the shapes).
cuda::sm90::TileFamily fp8_tile_family(const GroupShape& weight, const GroupShape& activation);

// The grouped GEMMs' tile for GEMM1 and GEMM2 at a few batch sizes, with the auto-selection's
// reasons, as grouped_apply would launch them for this deployment (`moekit explain`); weight /
// activation: the scheme's keys (none: unquantized); mxfp4_fp8: MXFP4 weights on the e4m3 rows
// (Sm90Mxfp4Fp8Experts) rather than the bf16 ones. Host code only.
std::string describe_grouped_tiles(const MoEConfig& moe, const std::optional<QuantKey>& weight,
                                   const std::optional<QuantKey>& activation,
                                   bool mxfp4_fp8 = false);

// MXFP4 codes on the device, in place: every 16-byte group between the standard and the kernel's
// nibble order (sm90/mxfp4_layout.h), asynchronously on `stream`.
void reorder_mxfp4_codes(Tensor& w, bool to_kernel, Stream stream);
// int4 (uint4b8) codes on the device, in place: into the W4A8 kernels' split codes or back (the
// same swap; sm90/int4_layout.h), on `stream`.
void split_int4_codes(Tensor& w, Stream stream);
// MXFP6 rows on the device, in place: each row (the last dimension, 3k / 4 bytes, k a multiple of
// 64) between the standard and the kernel layout (sm90/mxfp6_layout.h), on `stream`.
void repack_mxfp6_codes(Tensor& w, bool to_kernel, Stream stream);

// align -> GEMM1 (+ fused activation) -> (activation) -> GEMM2 -> weighted unpermute.
void grouped_apply(const ExpertsModular& experts, const LaunchState& state,
                   const ExpertsApplyArgs& args, RunContext ctx);
// GEMM1 (+ fused activation) -> (activation) -> (requantization) -> GEMM2 on the batched
// schedule.
void batched_apply(const ExpertsModular& experts, const LaunchState& state,
                   const ExpertsApplyArgs& args, RunContext ctx);

// The shared dense MLP of Sm90SharedExperts: its weights, the buffers allocated once and the
// weights' launch state.
struct SharedMlp {
  Tensor w13, w2;           // (N, H), (H, I)
  Tensor hidden, act, out;  // (max_tokens, N), (max_tokens, I), (max_tokens, H)
  Tensor offsets;           // (2,) int32 on the device: {0, M} of the single "expert"
  Activation activation = Activation::kSilu;
  ActivationParams params;
  cuda::sm90::WeightLaunchCache w13_cache, w2_cache;
};
// Prepares mlp's weights' launch state (once, at construction).
void prepare_shared(SharedMlp& mlp);
// GEMM1 -> activation -> GEMM2 over every token of x (M, H); returns mlp.out's first M rows.
Tensor shared_forward(const SharedMlp& mlp, const Tensor& x, RunContext ctx);

// The expert-parallel forward of Sm90EpPeerExperts as one launch (experts/cuda/ep_one_launch.h),
// for the local experts `experts` with launch state `state` (16-bit or packed W4A16 weights
// args.w1 / args.w2 with bf16 / f16 activations, their scales, biases and activation): the
// workspace2 bytes it needs (a forward reads args.workspace2 for its scratch), why a forward
// cannot take it (empty: it can), and the launch (for a forward the reason was asked of).
size_t ep_one_launch_workspace_bytes(const cuda::ep::PeerLayout& layout, int64_t local_experts,
                                     int64_t N, Activation activation);
std::string ep_one_launch_unsupported_reason(const ExpertsModular& experts,
                                             const LaunchState& state,
                                             const cuda::ep::ForwardArgs& f,
                                             const ExpertsApplyArgs& args);
void ep_one_launch_apply(const ExpertsModular& experts, const LaunchState& state,
                         const cuda::ep::ForwardArgs& f, const ExpertsApplyArgs& args);

}  // namespace moekit::sm90
