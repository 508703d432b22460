// Errors in two tiers: launchers return a Status; the public API throws moekit::Error whose message
// names the tensor, the value and the requirement.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <string_view>

namespace moekit {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A requested backend or configuration that no kernel supports (the oracle's rejection).
class UnsupportedError : public Error {
 public:
  using Error::Error;
};

enum class StatusCode { kOk, kInvalidArgument, kUnsupported, kCudaError, kInternal };

// Result of a low-level operation (kernel launcher, parser) that does not throw.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok() { return {}; }
  bool is_ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

namespace detail {
[[noreturn]] void throw_check_failure(const char* file, int line, const char* condition,
                                      const std::string& message);
}  // namespace detail

// Throws moekit::Error when a status is not ok.
void throw_if_error(const Status& status);

}  // namespace moekit

// MOEKIT_CHECK(cond, "fmt {}", args...): throws moekit::Error("<message> (check `cond` failed at
// file:line)") when cond is false. The message should name the tensor, the value and the
// requirement.
#define MOEKIT_CHECK(cond, ...)                                                                   \
  do {                                                                                            \
    if (!(cond)) [[unlikely]] {                                                                   \
      ::moekit::detail::throw_check_failure(__FILE__, __LINE__, #cond, fmt::format(__VA_ARGS__)); \
    }                                                                                             \
  } while (false)
