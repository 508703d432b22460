#include "moekit/core/workspace.h"

#include <algorithm>

#include "moekit/core/error.h"

namespace moekit {

WorkspaceManager::WorkspaceManager(Device device) : device_(device) {}

void WorkspaceManager::reserve(size_t slot0_bytes, size_t slot1_bytes) {
  const std::array<size_t, 2> want = {slot0_bytes, slot1_bytes};
  for (int i = 0; i < 2; ++i) {
    if (capacity(i) < want[i]) {
      // Round up to 2 MiB so nearby sizes share one allocation.
      const size_t bytes = ((want[i] + (2u << 20) - 1) / (2u << 20)) * (2u << 20);
      slots_[i] = Tensor::empty({static_cast<int64_t>(bytes)}, DType::kUInt8, device_);
    }
  }
}

size_t WorkspaceManager::capacity(int slot) const {
  MOEKIT_CHECK(slot == 0 || slot == 1, "workspace slot {} does not exist (0 or 1)", slot);
  return slots_[slot].defined() ? slots_[slot].nbytes() : 0;
}

Tensor WorkspaceManager::take(int slot, const Shape& shape, DType dtype) {
  const size_t need = static_cast<size_t>(numel_of(shape)) * element_size(dtype);
  if (need > capacity(slot)) {
    MOEKIT_CHECK(
        !growth_locked_,
        "workspace slot {} holds {} bytes but {} {} needs {}; the workspace is locked (sized "
        "for the worst case at construction), so the request exceeds the configured "
        "max_num_tokens",
        slot, capacity(slot), dtype_name(dtype), shape_to_string(shape), need);
    std::array<size_t, 2> want = {capacity(0), capacity(1)};
    want[slot] = need;
    reserve(want[0], want[1]);
  }
  return slots_[slot].reinterpret(shape, dtype);
}

std::pair<Tensor, Tensor> WorkspaceManager::get_simultaneous(const Shape& shape0, DType dtype0,
                                                             const Shape& shape1, DType dtype1) {
  Tensor a = take(0, shape0, dtype0);
  Tensor b = take(1, shape1, dtype1);
  return {a, b};
}

}  // namespace moekit
