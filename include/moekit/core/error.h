// Errors in two tiers: launchers return a Status; the public API throws moekit::Error whose message
// names the tensor, the value and the requirement.
#pragma once

#if defined(__CUDACC__)
#include <sstream>
#else
#include <fmt/format.h>
#endif

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
#if defined(__CUDACC__)
// nvcc cannot compile {fmt} (its constexpr machinery), so CUDA sources format their check messages
// with this small "{}" substitution over ostream (format specs inside braces are ignored).
inline void format_into(std::ostringstream& out, std::string_view f) {
  out << f;
}
template <typename T, typename... Rest>
void format_into(std::ostringstream& out, std::string_view f, const T& value, const Rest&... rest) {
  const size_t open = f.find('{');
  if (open == std::string_view::npos) {
    out << f;
    return;
  }
  const size_t close = f.find('}', open);
  out << f.substr(0, open) << value;
  format_into(out, close == std::string_view::npos ? std::string_view() : f.substr(close + 1),
              rest...);
}
template <typename... Args>
std::string format_runtime(std::string_view f, const Args&... args) {
  std::ostringstream out;
  format_into(out, f, args...);
  return out.str();
}
#endif
[[noreturn]] void throw_check_failure(const char* file, int line, const char* condition,
                                      const std::string& message);
}  // namespace detail

// Throws moekit::Error when a status is not ok.
void throw_if_error(const Status& status);

}  // namespace moekit

// MOEKIT_CHECK(cond, "fmt {}", args...): throws moekit::Error("<message> (check `cond` failed at
// file:line)") when cond is false. The message should name the tensor, the value and the
// requirement.
#if defined(__CUDACC__)
#define MOEKIT_FORMAT_MESSAGE(...) ::moekit::detail::format_runtime(__VA_ARGS__)
#else
#define MOEKIT_FORMAT_MESSAGE(...) fmt::format(__VA_ARGS__)
#endif

#define MOEKIT_CHECK(cond, ...)                                                  \
  do {                                                                           \
    if (!(cond)) [[unlikely]] {                                                  \
      ::moekit::detail::throw_check_failure(__FILE__, __LINE__, #cond,           \
                                            MOEKIT_FORMAT_MESSAGE(__VA_ARGS__)); \
    }                                                                            \
  } while (false)
