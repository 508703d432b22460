#include "moekit/core/env.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

namespace moekit::env {

std::optional<std::string> get(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

std::optional<long long> get_int(const char* name) {
  auto value = get(name);
  if (!value) return std::nullopt;
  char* end = nullptr;
  const long long parsed = std::strtoll(value->c_str(), &end, 10);
  if (end == value->c_str() || *end != '\0') return std::nullopt;
  return parsed;
}

bool get_bool(const char* name, bool fallback) {
  auto value = get(name);
  if (!value) return fallback;
  std::string v = *value;
  std::transform(v.begin(), v.end(), v.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  return fallback;
}

}  // namespace moekit::env
