// Grouped expert GEMM for Hopper tensor cores (sm_90a wgmma), fp32 accumulate: bf16 / fp16
// operands, or fp8 e4m3 / int8 operands with their scales (bf16 / fp16 out; int8 accumulates
// exactly in int32).
//
// For every expert e and every scheduled row r of that expert:
//   C[r, :] = A[src_row(r), :] @ W[e]^T (+ bias[e, :])
// fp8: C[r, c] = sum over K blocks kb of 128 of sa(r, kb) sw(e, c, kb) (A_kb[src_row(r)] .
// W_kb[e, c]) (+ bias), each K block's product taken from the tensor cores into a temporary and
// added to the fp32 accumulator with its scales (no precision lost to the tensor cores' own
// accumulation; per-tensor / per-row / per-channel scales are applied once, in the epilogue).
// with src_row(r) = gather_rows[r] when gather_rows is given, else r. Rows are "slots" (token, k)
// sorted by expert. The host never reads the schedule: the kernel is a persistent grid whose CTAs
// walk (expert, m-tile, n-tile) work items derived on the device from the schedule, so a launch is
// CUDA-graph capturable (no allocation, no synchronisation, no device reads from the host).
//
// Host operations follow the house shape: can_implement -> workspace size -> run on a stream;
// prepare_grouped_gemm_weights does the per-weight setup once (outside graph capture). The tile
// configurations are the rows of sm90/tiles.h; the mainloops are in sm90_bf16_grouped_gemm.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/cuda/elem_type.h"
#include "experts/cuda/sm90/launch_cache.h"
#include "experts/cuda/sm90/mxfp4_layout.h"
#include "experts/cuda/sm90/tiles.h"
#include "experts/cuda/w_packing.h"

namespace moekit::cuda {

// Optional gated activation fused into the epilogue (GEMM1 of an MoE layer). The math is that of
// the gated kinds of the activation kernel (experts/cuda/sm90/act_math.cuh), with g the gate and u
// the up pre-activation (bias added), L = clamp_limit:
//   kSiluMul      silu(g) * u, or with has_clamp_limit silu(min(g, L)) * clamp(u, -L, L)
//   kGeluMul      gelu_erf(g) * u
//   kGeluTanhMul  gelu_tanh(g) * u
//   kSwigluOai    (clamp(u, -L, L) + 1) * min(g, L) * sigmoid(alpha * min(g, L))  (L always used)
//   kSwigluStep   min(silu(g), L) * clamp(u, -L, L)                               (L always used)
//   kRelu2Mul     relu(g)^2 * u
enum class FusedActivation {
  kNone,
  kSiluMul,
  kGeluMul,
  kGeluTanhMul,
  kSwigluOai,
  kSwigluStep,
  kRelu2Mul,
};

// Row block of the fused layout: W rows [64b, 64b + 32) are the gate rows and [64b + 32, 64b + 64)
// the up rows of output columns [32b, 32b + 32).
inline constexpr int kFusedGateUpBlock = 32;

// Scales of fp8 / int8 A (the rows of A, indexed like A: the gathered source row); int8 takes
// kTensor and kRow:
enum class AScale : uint8_t {
  kNone,         // 16-bit operands
  kTensor,       // a_scale (1,)
  kRow,          // a_scale (num_a_rows,): one per row of A (per-token)
  kRowBlock128,  // a_scale (num_a_rows, ceil(k / 128)) row stride a_scale_ld: 1x128 groups
};
// Scales of fp8 / int8 W, in the row order of W as the kernel reads it; int8 takes kExpert and
// kChannel:
enum class WScale : uint8_t {
  kNone,         // 16-bit operands
  kExpert,       // w_scale (E,): per-tensor per expert
  kChannel,      // w_scale (E, n): per output channel
  kBlock32x128,  // w_scale (E, ceil(n / 32), ceil(k / 128)): per 32 rows x 128 K (a 128x128
                 // weight block's scale repeated for its four quarters, which the gate/up
                 // blocks-of-32 reorder moves apart)
  kGroup128,     // w_scale (E, ceil(k / 128), n): per output channel and 128 of K (int4 groups
                 // of 128 along K, W4A8 only), K-major so that a K step's n scales lie together
};

// Row alignment the kernel requires of expert_offsets: none. Offsets need not be padded to the tile
// height; partial tiles are predicated (loads zero-filled, stores masked).
inline constexpr int kRowAlign = 1;
// Largest num_experts a launch accepts (the per-CTA tile prefix lives in shared memory).
inline constexpr int kMaxExperts = 1024;

// The problem, as the caller describes it. Pointers are device pointers.
//
// Schedule, one of two forms:
//   * offsets (expert_counts == nullptr): rows of expert e are
//       [expert_offsets[e], expert_offsets[e+1]).
//   * batched (expert_counts != nullptr): rows of expert e are
//       [e * batched_stride, e * batched_stride + expert_counts[e]); expert_offsets is ignored.
//     Rows outside every expert's range are never read or written.
// Fused activation (fused_act != kNone): W's n rows are gate/up rows interleaved in blocks of 32
//   (kFusedGateUpBlock above; interleave_gate_up_rows builds it from the library's w13 layout), the
//   bias (if any) is in the same row order, n is a multiple of 64, and C has n / 2 columns
//   (ldc >= n / 2): C[r, i] = act(gate_i, up_i) computed in fp32 on the accumulators (bias added
//   first) and rounded once to the dtype. NOTE: the unfused pipeline (GEMM1, then
//   moe_activation) rounds gate and up to the dtype before the activation; the fused result skips
//   that rounding, so it differs from it by up to ~1 ulp of the dtype (and is closer to fp64).
// Gather: when gather_rows is non-null, row r reads A[gather_rows[r]]; a negative entry marks a
//   padding row: it reads zeros, and C[r, :] IS written (with bias[e, :], or zeros without bias).
struct GroupedGemmArgs {
  const void* a = nullptr;               // (num_a_rows, k) row stride lda, dtype
  int64_t lda = 0;                       // elements; multiple of 8
  const int32_t* gather_rows = nullptr;  // (num_rows,) optional, index into A's rows; < 0 = padding
  const void* w = nullptr;               // (num_experts, n, k) contiguous, dtype
  const void* bias = nullptr;            // (num_experts, n) optional, fp32 or dtype
  bool bias_is_fp32 = true;              // bias element type: fp32 (true) or dtype (false)
  void* c = nullptr;                     // (num_rows, n) row stride ldc, dtype (n / 2 if fused)
  int64_t ldc = 0;                       // elements; even; >= n (>= n / 2 if fused)
  const int32_t* expert_offsets = nullptr;  // (num_experts + 1,) nondecreasing, offsets form
  // (num_experts,) batched form, each in [0, batched_stride] (clamped to it)
  const int32_t* expert_counts = nullptr;
  int64_t batched_stride = 0;  // rows between consecutive experts, batched form
  int num_experts = 0;
  // Upper bound on the total scheduled rows. It only sizes the grid and picks the tile: a larger
  // actual count is still computed correctly, just with fewer CTAs than ideal.
  int64_t num_rows_upper_bound = 0;
  int n = 0;                             // output columns; multiple of 8
  int k = 0;                             // reduction length; multiple of 8
  ElemType dtype = ElemType::kBF16;      // A, W and C: kBF16 or kF16; or A and W kE4M3 / kS8
  ElemType out_dtype = ElemType::kBF16;  // C when dtype is kE4M3 / kS8: kBF16 or kF16
  // 8-bit scales (see AScale / WScale); both kNone for 16-bit operands, both set for kE4M3 / kS8.
  AScale a_scale_kind = AScale::kNone;
  const float* a_scale = nullptr;
  int64_t a_scale_ld = 0;  // kRowBlock128: floats between rows (>= ceil(k / 128))
  WScale w_scale_kind = WScale::kNone;
  const float* w_scale = nullptr;
  // Packed W (see WPacking); kNone: W is in dtype.
  WPacking w_packing = WPacking::kNone;
  const uint8_t* w_group_scale = nullptr;  // kMxfp4 / kNvfp4 / kMxfp6*: group scale codes
  // Fused gated activation (see above); kNone = plain GEMM (C has n columns).
  FusedActivation fused_act = FusedActivation::kNone;
  bool has_clamp_limit = false;  // kSiluMul only: clamp g above and u to [-L, L]
  float clamp_limit = 7.0f;      // L: kSiluMul with has_clamp_limit, kSwigluOai, kSwigluStep
  float alpha = 1.702f;          // kSwigluOai sigmoid slope
};

// Stream-K scheduling of the swap-AB rows (kSwapAB, 16-bit and fp8; sm90/grouped_kernels.cuh,
// swapab_kernel): instead of walking whole work items round-robin, each CTA of a grid of
// min_blocks x multiprocessors takes an equal contiguous share of the (work item, K step) units, so
// that every SM streams the same number of weight bytes when the items do not divide evenly over
// the SMs (qwen3-30b-a3b GEMM1 at one token: 192 items over 132 SMs, 60 SMs streaming two). An
// item split between CTAs is summed by the last of them to finish (fp32 partials in the
// workspace, added in CTA order: the result does not depend on which CTA finishes, so a launch is
// deterministic, but it is not bitwise the round-robin launch). Measured slower than round-robin
// where it should pay most (bench/results/2026-12-06-h100-stream-k, H100: qwen3-30b-a3b M = 1
// GEMM1 26.7 -> 29.2-34.6 us, gpt-oss-120b GEMM2 31.2 -> 37.0): off unless asked for.
enum class StreamK : uint8_t {
  kOff,      // work items round-robin
  kBalance,  // where the round-robin walk leaves the busiest SM >= 1.2x the mean (stream_k_pays)
  kAlways,   // every launch of a swap-AB row with a workspace: for tests and experiments
};

// Largest work-item count (m-tiles x n-tiles, as bounded from num_rows_upper_bound) a stream-K
// launch takes: its counters in the workspace. Larger problems walk the items round-robin.
inline constexpr int64_t kStreamKMaxItems = 8192;
// Multiprocessors the stream-K workspace is sized for (a larger device walks round-robin).
inline constexpr int kStreamKMaxSms = 160;

// The stream-K workspace: kStreamKMaxItems int32 counters, which must be zero when a launch
// starts (every launch leaves them zero), then the fp32 partial sums (two slots per CTA).
size_t stream_k_workspace_bytes();
inline constexpr size_t stream_k_counter_words() {
  return static_cast<size_t>(kStreamKMaxItems);
}

// Whether stream-K evens out the SMs' work for `items` work items over `sms` multiprocessors: up
// to 4 items per SM, when the round-robin walk gives the busiest SM >= 1.2x the mean.
bool stream_k_pays(int64_t items, int sms);

// For `moekit explain`: "" where a launch of table row `row` on `sms` multiprocessors with a
// workspace walks its items round-robin under StreamK::kBalance, else why it takes stream-K
// ("stream-K: 192 items over 132 SMs, round-robin 2 on the busiest, 1.45 on average").
std::string stream_k_note(const GroupedGemmArgs& args, int row, int sms);

// Tuning knobs and prepared state, kept apart from the problem.
struct GroupedGemmParams {
  // Row of sm90::kTileTable of the problem's family; -1: select_grouped_gemm_tile (rows per expert)
  int tile = -1;
  int max_ctas = 0;  // cap on the persistent grid; 0 = occupancy x multiprocessors
  // Launch state from prepare_grouped_gemm_weights; used when it describes args.w (same pointer,
  // shape and dtype), otherwise the launch queries the device, sets the kernel attribute and
  // encodes W's tensor map itself.
  const sm90::WeightLaunchCache* cache = nullptr;
  // Stream-K for the swap-AB rows; only with a workspace of get_workspace_size bytes.
  StreamK stream_k = StreamK::kOff;
};

// "" when the problem can run, else a one-line reason ("k=12 is not a positive multiple of 8").
std::string can_implement(const GroupedGemmArgs& args, const GroupedGemmParams& params = {});

// Device workspace a launch may use, in bytes: stream_k_workspace_bytes() for a problem whose
// tile (params.tile, or the selected row) is a stream-K capable swap-AB row and params.stream_k is
// not kOff, else 0. A launch without it (workspace null) walks its items round-robin.
size_t get_workspace_size(const GroupedGemmArgs& args, const GroupedGemmParams& params = {});

// The table row auto-selection picks (by the rows per expert), with the reason in *why.
int select_grouped_gemm_tile(const GroupedGemmArgs& args, std::string* why = nullptr);

// Builds the launch state of W = args.w (its shape and dtype from args; the schedule is not read)
// on the current device: SM count, the kernels' shared-memory attribute, W's tensor map for every
// TMA row of the table. Call outside graph capture; valid while W lives at that address.
cudaError_t prepare_grouped_gemm_weights(const GroupedGemmArgs& args,
                                         sm90::WeightLaunchCache* cache);

// Launches on stream. Returns cudaErrorInvalidValue when can_implement fails, else the launch's
// status. An empty schedule (every expert with 0 rows) launches a grid that writes nothing.
// workspace: null, or get_workspace_size bytes, 16-byte aligned, whose first
// stream_k_counter_words() int32 are zero (left zero by the launch).
cudaError_t run_grouped_gemm(const GroupedGemmArgs& args, cudaStream_t stream,
                             const GroupedGemmParams& params = {}, void* workspace = nullptr);

// The decode pair: GEMM1 (g1, with its fused gated activation) and GEMM2 (g2, reading g1's
// output) of one MoE layer in a single persistent launch of CUDA-core table row `row`
// (sm90/grouped_kernels.cuh, simt_pair_kernel): GEMM2's work waits per expert on a counter of
// GEMM1's finished work instead of on a second launch. The outputs are bitwise those of the two
// launches. Measured (bench/results/2026-12-03-h200-decode-pair) faster than the two launches of
// the CUDA-core row at 1-2 tokens per expert (gpt-oss-120b M = 1 73.7 vs 83.0 us, mixtral-8x7b
// 208 vs 248) but only level with the swap-AB row the tables pick, so the layer runs it only
// where both GEMMs are on the CUDA-core row (a forced or tuned tile); W4A16 ran slower as a pair.
// Requires (else can_run_grouped_gemm_pair says why): both problems runnable on `row`, a kSimt
// row of the 16-bit family; g1.fused_act set and g2's not; g2.a == g1.c with
// g2.lda == g1.ldc and no gather; the offsets schedule, the same for both; g2.k == g1.n / 2.
// expert_done: (num_experts,) int32 device counters, zero when the launch starts (the experts'
// align launch zeroes them: MoeAlignParams::expert_done) and left nonzero by it.
std::string can_run_grouped_gemm_pair(const GroupedGemmArgs& g1, const GroupedGemmArgs& g2,
                                      int row);
// Launches the pair on stream (cudaErrorInvalidValue when can_run_grouped_gemm_pair fails or
// expert_done is null). cache: W1's prepared launch state, or null.
cudaError_t run_grouped_gemm_pair(const GroupedGemmArgs& g1, const GroupedGemmArgs& g2, int row,
                                  int32_t* expert_done, cudaStream_t stream,
                                  const sm90::WeightLaunchCache* cache = nullptr);
// Host-side weight conversion for the fused layout (runs once at load time; plain loops).
// src: (experts, n, k) in the library's w13 layout: rows [0, n/2) gate, [n/2, n) up; or, when
// source_is_pairwise_interleaved (swigluoai checkpoints), gate = row 2i, up = row 2i + 1.
// dst: (experts, n, k) in the blocks-of-32 layout the fused epilogue reads. elem_bytes is the
// size of one element (2 for bf16 / fp16, 4 for fp32). n must be a positive multiple of 64 and
// src != dst; otherwise nothing is written.
void interleave_gate_up_rows(const void* src, void* dst, int64_t experts, int64_t n, int64_t k,
                             int elem_bytes, bool source_is_pairwise_interleaved);
// The same permutation for a bias (experts, n).
void interleave_gate_up_bias(const void* src, void* dst, int64_t experts, int64_t n, int elem_bytes,
                             bool source_is_pairwise_interleaved);

// Rewrites `groups` 16-byte MXFP4 groups at device address w in place from the standard into the
// kernel nibble order (to_kernel) or back (sm90/mxfp4_layout.h); w 16-byte aligned.
cudaError_t reorder_mxfp4_groups(void* w, int64_t groups, bool to_kernel, cudaStream_t stream);
// Rewrites `bytes` bytes of uint4b8 nibbles at device address w in place into the W4A8 kernels'
// split codes (bits 2 and 3 of every nibble swapped, sm90/int4_layout.h; its own inverse); w
// 16-byte aligned, bytes a multiple of 16.
cudaError_t split_int4_codes(void* w, int64_t bytes, cudaStream_t stream);
// Rewrites `rows` MXFP6 rows of k elements (3k / 4 bytes each, k a positive multiple of 64) at
// device address w in place from the standard layout into the kernel layout (to_kernel) or back
// (sm90/mxfp6_layout.h); w 16-byte aligned. One CTA per row at a time (the row staged in shared
// memory: the two layouts of a row overlap); k up to 2^18.
cudaError_t repack_mxfp6_rows(void* w, int64_t rows, int64_t k, bool to_kernel,
                              cudaStream_t stream);

// The tile family that serves the operand type of `args` (k16Bit for bf16 / f16; e4m3: kFp8 with
// block scales on A or W, kFp8Direct otherwise; kInt8 for int8, kW4A16 for MXFP4-, MXFP6- or
// NVFP4-packed W with bf16 A, kW4A8 for int4-packed W with e4m3 A).
sm90::TileFamily tile_family_of(const GroupedGemmArgs& args);

namespace detail {
// "" when table row `row` (of the problem's family) takes the problem's shape, else why not (the
// swap-AB row needs k % 64 == 0 and 4-byte aligned group scales).
std::string tile_fits(const GroupedGemmArgs& args, int row);
// The checks every dtype of the grouped GEMM shares (can_implement adds the family's own).
std::string check_grouped_gemm_args(const GroupedGemmArgs& args, const GroupedGemmParams& params);
// Each family's own checks, W preparation and launch of table row `row` (one of its rows):
// sm90_bf16_grouped_gemm.cu, sm90_fp8_grouped_gemm.cu, sm90_int8_grouped_gemm.cu,
// sm90_w4a16_grouped_gemm.cu and sm90_w4a8_grouped_gemm.cu.
std::string can_implement_16bit(const GroupedGemmArgs& args);
cudaError_t prepare_16bit(const GroupedGemmArgs& args, sm90::WeightLaunchCache* cache);
cudaError_t run_16bit(const GroupedGemmArgs& args, int row, const GroupedGemmParams& params,
                      cudaStream_t stream, void* workspace);
std::string can_implement_fp8(const GroupedGemmArgs& args);
cudaError_t prepare_fp8(const GroupedGemmArgs& args, sm90::WeightLaunchCache* cache);
cudaError_t run_fp8(const GroupedGemmArgs& args, int row, const GroupedGemmParams& params,
                    cudaStream_t stream, void* workspace);
std::string can_implement_w4a16(const GroupedGemmArgs& args);
cudaError_t prepare_w4a16(const GroupedGemmArgs& args, sm90::WeightLaunchCache* cache);
cudaError_t run_w4a16(const GroupedGemmArgs& args, int row, const GroupedGemmParams& params,
                      cudaStream_t stream);
// Whether GEMM1 and GEMM2 can run as the CUDA-core pair's tasks on `row` (can_run_grouped_gemm_pair
// without its 16-bit policy: the expert-parallel one launch runs W4A16 problems on them too).
std::string simt_pair_unsupported_reason(const GroupedGemmArgs& g1, const GroupedGemmArgs& g2,
                                         int row);
// The decode pair of the 16-bit family (run_grouped_gemm_pair, checked).
cudaError_t run_16bit_pair(const GroupedGemmArgs& g1, const GroupedGemmArgs& g2, int row,
                           int32_t* expert_done, const sm90::WeightLaunchCache* cache,
                           cudaStream_t stream);
std::string can_implement_w4a8(const GroupedGemmArgs& args);
cudaError_t prepare_w4a8(const GroupedGemmArgs& args, sm90::WeightLaunchCache* cache);
cudaError_t run_w4a8(const GroupedGemmArgs& args, int row, const GroupedGemmParams& params,
                     cudaStream_t stream);
std::string can_implement_int8(const GroupedGemmArgs& args);
cudaError_t prepare_int8(const GroupedGemmArgs& args, sm90::WeightLaunchCache* cache);
cudaError_t run_int8(const GroupedGemmArgs& args, int row, const GroupedGemmParams& params,
                     cudaStream_t stream);
// What every 8-bit family (fp8, int8; `what` names it) requires: bf16 / f16 out, 16-byte rows
// (k and lda multiples of 16), both operands' scales given and 4-byte aligned.
std::string check_8bit_operands(const GroupedGemmArgs& args, const char* what);
}  // namespace detail

}  // namespace moekit::cuda
