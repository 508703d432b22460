#include "moekit/config/parallel_config.h"

#include <fmt/format.h>

#include "moekit/core/error.h"

namespace moekit {

std::string_view all2all_backend_name(All2AllBackend backend) {
  switch (backend) {
    case All2AllBackend::kNaive:
      return "naive";
    case All2AllBackend::kAllGatherReduceScatter:
      return "allgather_reducescatter";
    case All2AllBackend::kNcclAllToAll:
      return "nccl_all2all";
    case All2AllBackend::kBatchedLowLatency:
      return "batched_low_latency";
    case All2AllBackend::kMegakernel:
      return "megakernel";
  }
  return "?";
}

bool parse_all2all_backend(std::string_view name, All2AllBackend* out) {
  for (All2AllBackend b : {All2AllBackend::kNaive, All2AllBackend::kAllGatherReduceScatter,
                           All2AllBackend::kNcclAllToAll, All2AllBackend::kBatchedLowLatency,
                           All2AllBackend::kMegakernel}) {
    if (all2all_backend_name(b) == name) {
      *out = b;
      return true;
    }
  }
  return false;
}

ParallelConfig ParallelConfig::make(int tp_size, int dp_size, int dp_rank, int tp_rank,
                                    bool enable_ep, All2AllBackend backend, int pcp_size,
                                    int pcp_rank) {
  MOEKIT_CHECK(tp_size >= 1 && dp_size >= 1 && pcp_size >= 1,
               "parallel sizes must be >= 1 (tp={}, dp={}, pcp={})", tp_size, dp_size, pcp_size);
  MOEKIT_CHECK(0 <= tp_rank && tp_rank < tp_size, "tp_rank={} must be in [0, tp_size={})", tp_rank,
               tp_size);
  MOEKIT_CHECK(0 <= dp_rank && dp_rank < dp_size, "dp_rank={} must be in [0, dp_size={})", dp_rank,
               dp_size);
  ParallelConfig c;
  c.dp_size = dp_size;
  c.dp_rank = dp_rank;
  c.pcp_size = pcp_size;
  c.pcp_rank = pcp_rank;
  c.all2all_backend = backend;
  // TP is flattened across DP and PCP.
  const int flat_tp = tp_size * dp_size * pcp_size;
  const int flat_rank = (dp_rank * pcp_size + pcp_rank) * tp_size + tp_rank;
  c.use_ep = flat_tp > 1 && enable_ep;
  if (c.use_ep) {
    c.ep_size = flat_tp;
    c.ep_rank = flat_rank;
    c.tp_size = 1;
    c.tp_rank = 0;
  } else {
    c.tp_size = flat_tp;
    c.tp_rank = flat_rank;
    c.ep_size = 1;
    c.ep_rank = 0;
  }
  return c;
}

std::string ParallelConfig::to_string() const {
  return fmt::format("ParallelConfig(tp={}/{}, dp={}/{}, ep={}/{}, use_ep={}, all2all={})", tp_size,
                     tp_rank, dp_size, dp_rank, ep_size, ep_rank, use_ep,
                     all2all_backend_name(all2all_backend));
}

}  // namespace moekit
