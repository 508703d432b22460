// Environment variables read by moekit. Every variable is listed in the README.
//   MOEKIT_LOG_LEVEL   trace|debug|info|warn|error|off (default warn)
//   MOEKIT_MOE_BACKEND force an experts backend by its user-facing name (e.g. "cpu_reference")
//   MOEKIT_SUPPORT_LEGACY / MOEKIT_DISABLE_PDL  diagnostics of the router/align CUDA kernels
// (CPU threads follow OpenMP's OMP_NUM_THREADS.)
#pragma once

#include <optional>
#include <string>

namespace moekit::env {

std::optional<std::string> get(const char* name);
std::optional<long long> get_int(const char* name);
bool get_bool(const char* name, bool fallback);

}  // namespace moekit::env
