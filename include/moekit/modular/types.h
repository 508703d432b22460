// Types shared by the parts of the modular kernel.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "moekit/core/device.h"
#include "moekit/core/tensor.h"
#include "moekit/core/workspace.h"

namespace moekit {

// Standard: activations (M, K). BatchedExperts: (E_local, max_tokens * num_dispatchers, K).
enum class ActivationFormat { kStandard, kBatchedExperts };
std::string_view activation_format_name(ActivationFormat format);  // "standard", "batched_experts"
inline bool is_batched(ActivationFormat format) {
  return format == ActivationFormat::kBatchedExperts;
}

// Number of tokens each local expert received (batched format).
struct ExpertTokensMetadata {
  Tensor expert_num_tokens;  // (E_local,) int32 on the compute device
  std::optional<std::vector<int32_t>> expert_num_tokens_cpu;  // same counts on the host, if known

  static ExpertTokensMetadata make_from_list(const std::vector<int32_t>& counts, Device device);
  // The counts on the host (expert_num_tokens_cpu, else a copy of expert_num_tokens), checked:
  // `num_experts` of them, each in [0, capacity]; `who` names the caller in the errors.
  std::vector<int64_t> host_counts(int64_t num_experts, int64_t capacity,
                                   std::string_view who) const;
};

// Told when each stage of a forward has been queued (benchmarks record events here to time the
// router, align, GEMM1, activation, GEMM2 and reduce separately). Must not block.
class StageObserver {
 public:
  virtual ~StageObserver() = default;
  virtual void stage_done(std::string_view stage, Stream stream) const = 0;
};

// What every forward needs besides its tensors: the stream and the caller-owned workspaces.
struct RunContext {
  Stream stream;
  WorkspaceManager* workspace = nullptr;
  const StageObserver* observer = nullptr;  // optional

  void stage_done(std::string_view stage) const {
    if (observer != nullptr) observer->stage_done(stage, stream);
  }
};

// The problem size the experts see: E local experts, M tokens (max_tokens in batched format),
// N = GEMM1 output width (2*I gated), K = hidden, topk.
struct ProblemSize {
  int64_t E = 0, M = 0, N = 0, K = 0, topk = 0;
};

// Workspace shapes: ws13 holds either GEMM output, ws2 the activation output, out the final
// (unreduced) experts output. The kernel aliases ws13 and out.
struct WorkspaceShapes {
  Shape workspace13, workspace2, output;
};

}  // namespace moekit
