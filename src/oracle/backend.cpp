#include "moekit/oracle/backend.h"

#include <fmt/format.h>

#include <algorithm>

#include "moekit/core/error.h"
#include "moekit/oracle/oracle.h"

namespace moekit {

std::string_view quant_oracle_kind_name(QuantOracleKind kind) {
  switch (kind) {
    case QuantOracleKind::kUnquantized:
      return "unquantized";
    case QuantOracleKind::kFp8:
      return "fp8";
    case QuantOracleKind::kInt8:
      return "int8";
    case QuantOracleKind::kIntWna16:
      return "int_wna16";
    case QuantOracleKind::kW4A8:
      return "w4a8";
    case QuantOracleKind::kNvfp4:
      return "nvfp4";
    case QuantOracleKind::kMxfp4:
      return "mxfp4";
  }
  return "?";
}

BackendRegistry& BackendRegistry::global() {
  static BackendRegistry instance;
  return instance;
}

namespace {

// Names are matched case-insensitively (the oracles' map_backend does), so they must be unique
// that way too.
bool names_backend(const ExpertsBackend& b, std::string_view name) {
  const std::string wanted = oracle_detail::lowercase(name);
  if (oracle_detail::lowercase(b.name) == wanted) return true;
  return std::any_of(b.aliases.begin(), b.aliases.end(),
                     [&](const std::string& a) { return oracle_detail::lowercase(a) == wanted; });
}

}  // namespace

void BackendRegistry::add(ExpertsBackend backend) {
  MOEKIT_CHECK(!backend.name.empty(), "an experts backend needs a name (oracle {})",
               quant_oracle_kind_name(backend.oracle));
  for (const ExpertsClass* klass : backend.classes) {
    MOEKIT_CHECK(klass != nullptr, "experts backend '{}' lists a null experts class", backend.name);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto& list = table_[backend.oracle];
  for (const ExpertsBackend& b : list) {
    for (const std::string& n : [&] {
           std::vector<std::string> all = backend.aliases;
           all.push_back(backend.name);
           return all;
         }()) {
      MOEKIT_CHECK(!names_backend(b, n),
                   "the {} oracle already has a backend named '{}' (registering '{}')",
                   quant_oracle_kind_name(backend.oracle), n, backend.name);
    }
  }
  // Ordered by priority; equal priorities keep their registration order.
  auto pos =
      std::upper_bound(list.begin(), list.end(), backend.priority,
                       [](int priority, const ExpertsBackend& b) { return priority < b.priority; });
  list.insert(pos, std::move(backend));
}

std::optional<ExpertsBackend> BackendRegistry::remove(QuantOracleKind oracle,
                                                      std::string_view name) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& list = table_[oracle];
  auto it = std::find_if(list.begin(), list.end(),
                         [&](const ExpertsBackend& b) { return b.name == name; });
  if (it == list.end()) return std::nullopt;
  ExpertsBackend out = std::move(*it);
  list.erase(it);
  return out;
}

std::vector<ExpertsBackend> BackendRegistry::backends(QuantOracleKind oracle) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = table_.find(oracle);
  return it == table_.end() ? std::vector<ExpertsBackend>{} : it->second;
}

std::optional<ExpertsBackend> BackendRegistry::find(QuantOracleKind oracle,
                                                    std::string_view name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = table_.find(oracle);
  if (it == table_.end()) return std::nullopt;
  for (const ExpertsBackend& b : it->second) {
    if (b.name == name) return b;
  }
  return std::nullopt;
}

BackendRegistration::BackendRegistration(ExpertsBackend backend, BackendRegistry& registry)
    : registry_(registry), oracle_(backend.oracle), name_(backend.name) {
  replaced_ = registry_.remove(oracle_, name_);
  try {
    registry_.add(std::move(backend));
  } catch (...) {
    if (replaced_) registry_.add(std::move(*replaced_));
    throw;
  }
}

BackendRegistration::~BackendRegistration() {
  registry_.remove(oracle_, name_);
  if (replaced_) {
    try {
      registry_.add(std::move(*replaced_));
    } catch (...) {  // NOTE: cannot happen (the name was free when it was taken out); never throw
    }
  }
}

}  // namespace moekit
