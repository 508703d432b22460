// FusedMoEParallelConfig: tensor / data / expert parallel sizes and ranks, and the all-to-all
// backend that moves tokens between expert-parallel ranks.
#pragma once

#include <string>
#include <string_view>

namespace moekit {

// How tokens reach the ranks that own their experts.
enum class All2AllBackend {
  kNaive,                   // all-gather tokens, reduce-scatter outputs (DP + EP)
  kAllGatherReduceScatter,  // same, with one fused collective each way
  kNcclAllToAll,            // tokens travel only to the ranks that own their experts
  kBatchedLowLatency,       // fixed-size per-expert buffers, CUDA-graph safe (decode)
  kMegakernel,              // dispatch/compute/combine fused in the experts (pass-through P/F)
};
std::string_view all2all_backend_name(All2AllBackend backend);
bool parse_all2all_backend(std::string_view name, All2AllBackend* out);

struct ParallelConfig {
  int tp_size = 1;
  int pcp_size = 1;
  int dp_size = 1;
  int ep_size = 1;
  int tp_rank = 0;
  int pcp_rank = 0;
  int dp_rank = 0;
  int ep_rank = 0;
  int sp_size = 1;
  bool use_ep = false;
  All2AllBackend all2all_backend = All2AllBackend::kNaive;
  bool enable_eplb = false;

  // The seed's make(): TP is flattened across DP and PCP; with EP enabled (and more than one
  // rank) experts are split across all tp*dp*pcp ranks and TP becomes 1.
  static ParallelConfig make(int tp_size, int dp_size, int dp_rank, int tp_rank, bool enable_ep,
                             All2AllBackend backend = All2AllBackend::kNaive, int pcp_size = 1,
                             int pcp_rank = 0);
  // A single rank: no parallelism.
  static ParallelConfig single() { return {}; }

  bool use_all2all_kernels() const {
    return use_ep && (dp_size > 1 || pcp_size > 1 || sp_size > 1);
  }
  bool use_batched_activation_format() const {
    return use_all2all_kernels() && all2all_backend == All2AllBackend::kBatchedLowLatency;
  }
  bool use_megakernel() const { return use_ep && all2all_backend == All2AllBackend::kMegakernel; }
  bool operator==(const ParallelConfig&) const = default;
  // "ParallelConfig(tp=1/0, dp=2/1, ep=2/1, use_ep=true, all2all=naive)"
  std::string to_string() const;
};

}  // namespace moekit
