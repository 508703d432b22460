// Internal: the token layout shared by PrepareFinalizeBatched (which scatters tokens into
// (E_local, T, K)) and TopKWeightAndReduceNaiveBatched (which gathers them back), so both walk the
// same order: for each local expert, its (token m, slot j) pairs in increasing m, then j.
#pragma once

#include <cstdint>
#include <vector>

#include "moekit/core/checks.h"
#include "moekit/core/tensor.h"

namespace moekit::detail {

// Global expert id -> local expert of this rank, or -1. With an expert_map (E_global,) int32 the
// map decides; without one the rank owns the contiguous range [rank * num_local, (rank+1) *
// num_local). Ids that are negative or outside the map are not local.
class LocalExpertMap {
 public:
  LocalExpertMap(const Tensor& expert_map, int rank, int64_t num_local) : num_local_(num_local) {
    if (expert_map.defined()) {
      expect_dtype(expert_map, "expert_map", {DType::kInt32});
      expect_dim(expert_map, "expert_map", 1);
      expect_contiguous(expert_map, "expert_map");
      MOEKIT_CHECK(expert_map.device().is_cpu(), "expert_map must be on the CPU here, got {}",
                   expert_map.device().to_string());
      map_ = expert_map.data_as<const int32_t>();
      map_size_ = expert_map.size(0);
    } else {
      first_ = static_cast<int64_t>(rank) * num_local;
    }
  }

  int64_t operator()(int64_t global) const {
    int64_t local = -1;
    if (map_ != nullptr) {
      if (global >= 0 && global < map_size_) local = map_[global];
    } else if (global >= 0) {
      local = global - first_;
    }
    return (local >= 0 && local < num_local_) ? local : -1;
  }

 private:
  const int32_t* map_ = nullptr;
  int64_t map_size_ = 0;
  int64_t first_ = 0;
  int64_t num_local_;
};

// topk ids (M, topk) int32 or int64 on the CPU, row-major.
inline std::vector<int64_t> read_topk_ids(const Tensor& topk_ids) {
  expect_dtype(topk_ids, "topk_ids", {DType::kInt32, DType::kInt64});
  MOEKIT_CHECK(topk_ids.device().is_cpu(), "topk_ids must be on the CPU here, got {}",
               topk_ids.device().to_string());
  return topk_ids.to_int_vector();
}

// Where each (m, j) slot lives in the batched buffer.
struct BatchedLayout {
  std::vector<int32_t> counts;      // (E_local,) rows used per local expert
  std::vector<int64_t> slot_local;  // (M * topk,) local expert of the slot, or -1
  std::vector<int64_t> slot_row;    // (M * topk,) row within that expert, or -1
};

inline BatchedLayout make_batched_layout(const std::vector<int64_t>& ids, int64_t num_slots,
                                         const LocalExpertMap& to_local, int64_t num_local) {
  BatchedLayout layout;
  layout.counts.assign(static_cast<size_t>(num_local), 0);
  layout.slot_local.assign(static_cast<size_t>(num_slots), -1);
  layout.slot_row.assign(static_cast<size_t>(num_slots), -1);
  for (int64_t s = 0; s < num_slots; ++s) {  // s = m * topk + j: token order, then slot order
    const int64_t local = to_local(ids[static_cast<size_t>(s)]);
    if (local < 0) continue;
    layout.slot_local[static_cast<size_t>(s)] = local;
    layout.slot_row[static_cast<size_t>(s)] = layout.counts[static_cast<size_t>(local)]++;
  }
  return layout;
}

}  // namespace moekit::detail
