// Checked JSON reading; see include/moekit/io/json.h.
#include "moekit/io/json.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <fstream>
#include <set>
#include <system_error>
#include <vector>

#include "moekit/core/error.h"

namespace moekit::io {
namespace {

using json = nlohmann::json;

constexpr std::size_t kMaxShownChars = 96;  // longer strings are cut in messages

std::string clip(std::string s, std::size_t max_chars = kMaxShownChars) {
  if (s.size() > max_chars) {
    const std::size_t n = s.size();
    s.resize(max_chars);
    s += fmt::format("...({} bytes)", n);
  }
  return s;
}

// "<where>=<value> must be <requirement>", or "... has the wrong type (a string): expected ..."
// when `type_ok` is false.
[[noreturn]] void bad_value(const json& v, std::string_view where, std::string_view requirement,
                            bool type_ok) {
  if (!type_ok) {
    throw Error(fmt::format("moekit: {}={} has the wrong type ({}): expected {}", where,
                            describe_json(v), v.type_name(), requirement));
  }
  throw Error(fmt::format("moekit: {}={} must be {}", where, describe_json(v), requirement));
}

}  // namespace

std::string read_text_file(const std::filesystem::path& file, uint64_t max_bytes) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(file, ec);
  if (ec || !fs::exists(st)) {
    throw Error(fmt::format("moekit: cannot open {}: {}", file.string(),
                            ec ? ec.message() : "no such file"));
  }
  if (fs::is_directory(st)) {
    throw Error(
        fmt::format("moekit: cannot read {}: it is a directory, not a file", file.string()));
  }
  if (!fs::is_regular_file(st)) {
    throw Error(fmt::format("moekit: cannot read {}: not a regular file", file.string()));
  }
  const uintmax_t size = fs::file_size(file, ec);
  if (ec) throw Error(fmt::format("moekit: cannot read {}: {}", file.string(), ec.message()));
  if (size > max_bytes) {
    throw Error(fmt::format("moekit: {} is {} bytes, above the limit of {} bytes", file.string(),
                            size, max_bytes));
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error(fmt::format("moekit: cannot open {}", file.string()));
  std::string text(static_cast<std::size_t>(size), '\0');
  // NOTE: a file that shrinks while being read is reported, never read past its end.
  if (!in.read(text.data(), static_cast<std::streamsize>(text.size())) ||
      static_cast<uintmax_t>(in.gcount()) != size) {
    throw Error(fmt::format("moekit: cannot read {} bytes of {}", size, file.string()));
  }
  return text;
}

json parse_json(std::string_view text, std::string_view where) {
  // Keys seen in each open object: nlohmann would silently keep the last of a repeated key.
  std::vector<std::set<std::string>> open_objects;
  std::string repeated;
  auto on_event = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key:
        if (!open_objects.empty() && repeated.empty() &&
            !open_objects.back().insert(parsed.get<std::string>()).second) {
          repeated = parsed.get<std::string>();
        }
        break;
      default:
        break;
    }
    return true;
  };
  json out;
  try {
    out = json::parse(text.begin(), text.end(), on_event, /*allow_exceptions=*/true);
  } catch (const json::parse_error& e) {
    throw Error(fmt::format("moekit: {}: not valid JSON (byte {}): {}", where, e.byte,
                            clip(e.what(), 4 * kMaxShownChars)));
  } catch (const json::exception& e) {
    throw Error(
        fmt::format("moekit: {}: not valid JSON: {}", where, clip(e.what(), 4 * kMaxShownChars)));
  }
  if (!repeated.empty()) {
    throw Error(fmt::format("moekit: {}: repeats the key '{}' (keys must be unique)", where,
                            clip(repeated)));
  }
  return out;
}

json read_json_file(const std::filesystem::path& file, uint64_t max_bytes) {
  return parse_json(read_text_file(file, max_bytes), file.string());
}

std::string describe_json(const json& v) {
  switch (v.type()) {
    case json::value_t::object:
      return fmt::format("an object of {} keys", v.size());
    case json::value_t::array:
      return fmt::format("an array of {} elements", v.size());
    case json::value_t::string:
      return clip(v.dump(-1, ' ', false, json::error_handler_t::replace));
    case json::value_t::discarded:
      return "nothing";
    default:
      return v.dump();
  }
}

int64_t json_integer(const json& v, std::string_view where, int64_t min, int64_t max) {
  const std::string range = fmt::format("an integer in [{}, {}]", min, max);
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (max >= 0 && u <= static_cast<uint64_t>(max) && static_cast<int64_t>(u) >= min) {
      return static_cast<int64_t>(u);
    }
    bad_value(v, where, range, true);
  }
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i >= min && i <= max) return i;
  }
  // A fraction (192.5) or an exponent form (1e3) is a number, but not an integer.
  bad_value(v, where, range, v.is_number());
}

double json_number(const json& v, std::string_view where, double min, double max) {
  const std::string range = fmt::format("a number in [{}, {}]", min, max);
  if (!v.is_number()) bad_value(v, where, range, false);
  const double d = v.get<double>();
  if (!(std::isfinite(d) && d >= min && d <= max)) bad_value(v, where, range, true);
  return d;
}

bool json_bool(const json& v, std::string_view where) {
  if (!v.is_boolean()) bad_value(v, where, "true or false", false);
  return v.get<bool>();
}

std::string json_string(const json& v, std::string_view where) {
  if (!v.is_string()) bad_value(v, where, "a string", false);
  return v.get<std::string>();
}

std::vector<std::string> json_string_array(const json& v, std::string_view where,
                                           std::string_view items) {
  if (!v.is_array()) bad_value(v, where, fmt::format("an array of {}", items), false);
  std::vector<std::string> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    out.push_back(json_string(v[i], fmt::format("{}[{}]", where, i)));
  return out;
}

std::string json_choice(const json& v, std::string_view where,
                        std::initializer_list<std::string_view> valid) {
  const std::string requirement = fmt::format("one of {}", fmt::join(valid, ", "));
  if (!v.is_string()) bad_value(v, where, requirement, false);
  const std::string s = v.get<std::string>();
  for (std::string_view choice : valid) {
    if (choice == s) return s;
  }
  bad_value(v, where, requirement, true);
}

int64_t checked_mul(int64_t a, int64_t b, std::string_view what) {
  int64_t out = 0;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &out)) {
    throw Error(fmt::format("moekit: {} overflows a 64-bit integer", what));
  }
  return out;
}

}  // namespace moekit::io
