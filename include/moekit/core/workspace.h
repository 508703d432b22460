// A caller-owned, size-queryable workspace manager: two slots of device memory, sized once at the
// worst case and reused across layers and forwards (the seed's current_workspace_manager).
#pragma once

#include <array>
#include <cstddef>
#include <utility>

#include "moekit/core/tensor.h"

namespace moekit {

class WorkspaceManager {
 public:
  explicit WorkspaceManager(Device device = Device::cpu());

  Device device() const { return device_; }
  // Grows slot capacities to at least these byte counts (allocates; call outside a forward).
  void reserve(size_t slot0_bytes, size_t slot1_bytes);
  size_t capacity(int slot) const;
  // When locked, get_simultaneous never allocates and fails if a request exceeds the capacity; the
  // GPU path locks after reserving the worst case so a forward can be captured in a CUDA graph.
  void set_growth_locked(bool locked) { growth_locked_ = locked; }
  bool growth_locked() const { return growth_locked_; }

  // Two non-aliasing contiguous tensors viewing slot 0 and slot 1.
  std::pair<Tensor, Tensor> get_simultaneous(const Shape& shape0, DType dtype0, const Shape& shape1,
                                             DType dtype1);

 private:
  Tensor take(int slot, const Shape& shape, DType dtype);
  Device device_;
  std::array<Tensor, 2> slots_;
  bool growth_locked_ = false;
};

}  // namespace moekit
