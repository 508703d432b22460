#include "moekit/core/error.h"

#include <string>

namespace moekit {
namespace detail {

void throw_check_failure(const char* file, int line, const char* condition,
                         const std::string& message) {
  std::string where(file);
  const auto slash = where.find_last_of('/');
  if (slash != std::string::npos) where = where.substr(slash + 1);
  throw Error(
      fmt::format("moekit: {} (check `{}` failed at {}:{})", message, condition, where, line));
}

}  // namespace detail

void throw_if_error(const Status& status) {
  if (status.is_ok()) return;
  if (status.code() == StatusCode::kUnsupported)
    throw UnsupportedError("moekit: " + status.message());
  throw Error("moekit: " + status.message());
}

}  // namespace moekit
