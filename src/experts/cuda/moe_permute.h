// Token permutation for the GPU experts.
//
// (a) Align / permute: groups the (token, k) slots of topk_ids by local expert, in increasing slot
//     order inside each expert (stable, deterministic), with each expert's segment padded up to a
//     multiple of `row_align` (the GEMM's M tile). Produces the index maps the grouped GEMMs and
//     the unpermute use; it moves no activations.
// (b) BatchedExperts helpers: scatter token rows into [E_local, max_tokens, H] and gather them
// back.
//
// NOTE: launchers never allocate and never synchronize with the host (CUDA-graph capturable); every
// launcher takes the stream it runs on. Slot s = token * top_k + j.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace moekit::cuda {

inline constexpr int kMoeAlignMaxLocalExperts = 512;

// Rows of permuted_rows needed for (M, k, E_local, row_align): M*k + E_local*(row_align-1).
inline int64_t moe_align_capacity(int64_t num_tokens, int top_k, int num_local_experts,
                                  int row_align) {
  return num_tokens * top_k + static_cast<int64_t>(num_local_experts) * (row_align - 1);
}

struct MoeAlignParams {
  const int32_t* topk_ids = nullptr;  // (M, k) global expert ids
  int64_t num_tokens = 0;             // M (0 is valid)
  int top_k = 0;                      // k >= 1
  // (E_global,) global id -> local id or -1; nullptr means local id = global id.
  const int32_t* expert_map = nullptr;
  int num_global_experts = 0;  // E_global; ids outside [0, E_global) are skipped
  int num_local_experts = 0;   // E_local, 1..512; local ids outside [0, E_local) are skipped
  int row_align = 1;           // >= 1; each expert's segment length is rounded up to a multiple

  int32_t* expert_counts = nullptr;   // (E_local,) out: valid slots per expert
  int32_t* expert_offsets = nullptr;  // (E_local + 1,) out: exclusive prefix of padded counts
  int32_t* permuted_rows = nullptr;   // (capacity,) out: source slot per row, -1 for padding/tail
  int32_t* slot_to_row = nullptr;     // (M * k,) out: row of each slot, -1 when skipped
  int32_t* total_rows = nullptr;      // (1,) out, optional: expert_offsets[E_local]
  // (capacity,) out, optional: the token of each row, permuted_rows[r] / top_k (-1 where that is
  // -1): the gather index of the experts' first GEMM, written with the permutation.
  int32_t* token_rows = nullptr;
  // (E_local,) out, optional: zeroed (the counters of the experts' decode pair, which its GEMM1
  // work raises: run_grouped_gemm_pair).
  int32_t* expert_done = nullptr;
  // (zero_words,) out, optional: zeroed (the stream-K counters of the experts' grouped GEMMs,
  // which every launch leaves zero: cuda::stream_k_counter_words()).
  int32_t* zero = nullptr;
  int zero_words = 0;

  void* workspace = nullptr;  // moe_align_workspace_bytes(...) bytes, 4-byte aligned
  size_t workspace_bytes = 0;
};

// Workspace bytes launch_moe_align needs (0 on the one-launch path, M*k <= 8192).
size_t moe_align_workspace_bytes(int64_t num_tokens, int top_k, int num_local_experts);

// nullptr when supported, else a one-line reason.
const char* moe_align_unsupported_reason(const MoeAlignParams& p);

// One launch when M*k <= 8192, else three (count, scan, scatter).
cudaError_t launch_moe_align(const MoeAlignParams& p, cudaStream_t stream);

// ---- BatchedExperts layout -------------------------------------------------------------------

// Copies token rows into the batched layout using the maps of launch_moe_align (any row_align):
// out[e, t, :] = x[permuted_rows[expert_offsets[e] + t] / top_k, :] for t < min(count_e,
// max_tokens). Rows t >= out_counts[e] are left untouched.
struct BatchedScatterParams {
  const void* x = nullptr;  // (M, H) elements of elem_bytes, row stride x_row_stride elements
  int64_t x_row_stride = 0;
  int64_t hidden = 0;  // H
  int elem_bytes = 2;  // 1, 2 or 4 (the copy is bitwise)
  int top_k = 0;
  const int32_t* permuted_rows = nullptr;   // (capacity,) from launch_moe_align
  const int32_t* expert_offsets = nullptr;  // (E_local + 1,)
  const int32_t* expert_counts = nullptr;   // (E_local,)
  int num_local_experts = 0;
  int max_tokens = 0;             // per expert
  void* out = nullptr;            // (E_local, max_tokens, H) contiguous
  int32_t* out_counts = nullptr;  // (E_local,) out: min(count_e, max_tokens)
  int32_t* overflow = nullptr;    // (1,) out: 1 when some count_e > max_tokens, else 0
};
const char* batched_scatter_unsupported_reason(const BatchedScatterParams& p);
cudaError_t launch_batched_scatter(const BatchedScatterParams& p, cudaStream_t stream);

// The inverse copy, one row per slot: out[s, :] = batched[e, t, :] for the slot's (expert, rank)
// from slot_to_row / expert_offsets; zeros for skipped slots and for t >= max_tokens (overflow).
struct BatchedGatherParams {
  const void* batched = nullptr;  // (E_local, max_tokens, H) contiguous
  int64_t hidden = 0;
  int elem_bytes = 2;
  int64_t num_slots = 0;                    // M * k
  const int32_t* slot_to_row = nullptr;     // (M * k,)
  const int32_t* expert_offsets = nullptr;  // (E_local + 1,)
  int num_local_experts = 0;
  int max_tokens = 0;
  void* out = nullptr;  // (M * k, H) contiguous
};
const char* batched_gather_unsupported_reason(const BatchedGatherParams& p);
cudaError_t launch_batched_gather(const BatchedGatherParams& p, cudaStream_t stream);

// The low-latency exchange's receive side: W source ranks each sent this rank's E_local experts a
// fixed block of `capacity` rows, exchanged (W, E_local, capacity, H) with the rows used per
// block in counts (W, E_local). pack: packed[e, offset(s, e) + t, :] = exchanged[s, e, t, :] for
// t < counts[s, e], offset(s, e) = the counts of sources before s (source 0's rows first), and
// expert_num_tokens[e] = the sum over sources; unpack copies the same rows the other way (the
// experts' output back into the blocks it answers). Rows past the counts are left untouched.
struct ExchangePackParams {
  void* exchanged = nullptr;             // (W, E_local, capacity, H) contiguous
  void* packed = nullptr;                // (E_local, W * capacity, H) contiguous
  const int32_t* counts = nullptr;       // (W, E_local), each in [0, capacity]
  int32_t* expert_num_tokens = nullptr;  // pack: (E_local,) out; optional
  int world = 0;
  int num_local_experts = 0;
  int capacity = 0;
  int64_t hidden = 0;
  int elem_bytes = 2;  // 1, 2 or 4 (the copy is bitwise)
  bool unpack = false;
};
const char* exchange_pack_unsupported_reason(const ExchangePackParams& p);
cudaError_t launch_exchange_pack(const ExchangePackParams& p, cudaStream_t stream);

// out[i, :] = src[index[i], :] for i < num_rows (zeros where index[i] < 0): rows of row_bytes
// bytes, copied bitwise.
struct GatherRowsParams {
  const void* src = nullptr;
  const int32_t* index = nullptr;  // (num_rows,)
  int64_t num_rows = 0;
  int64_t row_bytes = 0;
  void* out = nullptr;  // (num_rows, row_bytes) contiguous
};
const char* gather_rows_unsupported_reason(const GatherRowsParams& p);
cudaError_t launch_gather_rows(const GatherRowsParams& p, cudaStream_t stream);

}  // namespace moekit::cuda
