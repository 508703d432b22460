// A caller-owned, size-queryable workspace manager: named slots of device memory, sized once at
// the worst case and reused across layers and forwards (the seed's current_workspace_manager).
// Distinct slots never alias; one slot's views alias each other.
//
//   WorkspaceManager ws(Device::cuda());
//   ws.reserve(layer_a.workspace_requests());  // each slot grows to the largest request
//   ws.reserve(layer_b.workspace_requests());
//   ws.set_growth_locked(true);                // forwards may now be captured in a CUDA graph
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/core/tensor.h"

namespace moekit {

// The slots the modular kernel uses. Prepare/finalize implementations and experts may add their
// own, named "<part>.<what>".
namespace workspace_slots {
inline constexpr std::string_view kExperts13 = "experts.workspace13";  // GEMM1 out / final out
inline constexpr std::string_view kExperts2 = "experts.workspace2";    // activation out
}  // namespace workspace_slots

// `bytes` of slot `slot`.
struct WorkspaceRequest {
  std::string slot;
  size_t bytes = 0;
  bool operator==(const WorkspaceRequest&) const = default;
};

class WorkspaceManager {
 public:
  explicit WorkspaceManager(Device device = Device::cpu());

  Device device() const { return device_; }
  // Grows a slot's capacity to at least `bytes` (allocates; call outside a forward). Never shrinks.
  void reserve(std::string_view slot, size_t bytes);
  void reserve(const std::vector<WorkspaceRequest>& requests);
  // Capacity of a slot in bytes (0 for a slot never reserved).
  size_t capacity(std::string_view slot) const;
  // Every slot with its capacity, by name; and their sum.
  std::vector<WorkspaceRequest> slots() const;
  size_t total_bytes() const;
  // When locked, get never allocates and throws when a request exceeds the slot's capacity; the GPU
  // path locks after reserving the worst case so a forward can be captured in a CUDA graph.
  void set_growth_locked(bool locked) { growth_locked_ = locked; }
  bool growth_locked() const { return growth_locked_; }

  // A contiguous tensor viewing the start of `slot` (grown first when unlocked and too small).
  Tensor get(std::string_view slot, const Shape& shape, DType dtype);

 private:
  Device device_;
  std::map<std::string, Tensor, std::less<>> slots_;
  bool growth_locked_ = false;
};

}  // namespace moekit
