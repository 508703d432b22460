#include "moekit/core/workspace.h"

#include <algorithm>

#include "moekit/core/error.h"

namespace moekit {

WorkspaceManager::WorkspaceManager(Device device) : device_(device) {}

void WorkspaceManager::reserve(std::string_view slot, size_t bytes) {
  MOEKIT_CHECK(!slot.empty(), "workspace slot names must not be empty");
  if (capacity(slot) >= bytes) return;
  // Round up to 2 MiB so nearby sizes share one allocation.
  const size_t rounded = ((bytes + (2u << 20) - 1) / (2u << 20)) * (2u << 20);
  slots_.insert_or_assign(std::string(slot),
                          Tensor::empty({static_cast<int64_t>(rounded)}, DType::kUInt8, device_));
}

void WorkspaceManager::reserve(const std::vector<WorkspaceRequest>& requests) {
  for (const WorkspaceRequest& r : requests)
    reserve(r.slot, r.bytes);
}

size_t WorkspaceManager::capacity(std::string_view slot) const {
  auto it = slots_.find(slot);
  return it == slots_.end() ? 0 : it->second.nbytes();
}

std::vector<WorkspaceRequest> WorkspaceManager::slots() const {
  std::vector<WorkspaceRequest> out;
  for (const auto& [name, t] : slots_)
    out.push_back({name, t.nbytes()});
  return out;
}

size_t WorkspaceManager::total_bytes() const {
  size_t total = 0;
  for (const auto& [name, t] : slots_)
    total += t.nbytes();
  return total;
}

Tensor WorkspaceManager::get(std::string_view slot, const Shape& shape, DType dtype) {
  const size_t need = static_cast<size_t>(numel_of(shape)) * element_size(dtype);
  if (need > capacity(slot)) {
    MOEKIT_CHECK(!growth_locked_,
                 "workspace slot '{}' holds {} bytes but {} {} needs {}; the workspace is locked "
                 "(sized for the worst case at construction), so the request exceeds the "
                 "configured max_num_tokens",
                 slot, capacity(slot), dtype_name(dtype), shape_to_string(shape), need);
    reserve(slot, need);
  }
  auto it = slots_.find(slot);
  if (it == slots_.end()) {  // an empty request of a slot never reserved
    it = slots_.emplace(std::string(slot), Tensor::empty({0}, DType::kUInt8, device_)).first;
  }
  return it->second.reinterpret(shape, dtype);
}

}  // namespace moekit
