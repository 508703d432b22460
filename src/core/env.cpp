#include "moekit/core/env.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "moekit/core/error.h"

namespace moekit::env {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

[[noreturn]] void invalid(const char* name, const std::string& value, std::string_view expected) {
  throw Error(fmt::format("moekit: environment variable {}='{}' is not valid: expected {}", name,
                          value, expected));
}

}  // namespace

std::optional<std::string> get(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

std::optional<long long> get_int(const char* name, long long min, long long max) {
  auto value = get(name);
  if (!value) return std::nullopt;
  const std::string range = fmt::format("an integer in [{}, {}]", min, max);
  char* end = nullptr;
  errno = 0;
  const long long parsed = std::strtoll(value->c_str(), &end, 10);
  const bool whole = end != value->c_str() && *end == '\0' &&
                     !std::isspace(static_cast<unsigned char>((*value)[0]));
  if (!whole || errno == ERANGE || parsed < min || parsed > max) invalid(name, *value, range);
  return parsed;
}

bool get_bool(const char* name, bool fallback) {
  auto value = get(name);
  if (!value) return fallback;
  const std::string v = lower(*value);
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  invalid(name, *value, "one of 1, true, yes, on, 0, false, no, off");
}

std::optional<std::string> get_choice(const char* name,
                                      std::initializer_list<std::string_view> valid) {
  auto value = get(name);
  if (!value) return std::nullopt;
  const std::string v = lower(*value);
  for (std::string_view choice : valid) {
    if (lower(choice) == v) return std::string(choice);
  }
  invalid(name, *value, fmt::format("one of {}", fmt::join(valid, ", ")));
}

}  // namespace moekit::env
