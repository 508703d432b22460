// Reading JSON files at a trust boundary (config.json, quantization_config, index files): the
// whole file read with its size capped, parsed with duplicate keys refused, and typed accessors
// whose errors name where the value sits ("config.json: text_config.hidden_size"), the value and
// the requirement. Every failure throws moekit::Error; nothing here aborts or recurses into a
// value, so hostile input (deep nesting, huge numbers, NaN-like text) yields a message, not a
// crash.
#pragma once

#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace moekit::io {

// Files larger than this are refused before they are read.
inline constexpr uint64_t kMaxJsonFileBytes = uint64_t{64} << 20;

// The contents of a regular file of at most max_bytes. Throws moekit::Error naming the file when
// it is missing, a directory or another non-regular file, unreadable, or too large.
std::string read_text_file(const std::filesystem::path& file,
                           uint64_t max_bytes = kMaxJsonFileBytes);

// Parses JSON text; `where` (a file name) prefixes errors: "<where>: not valid JSON (byte 12):
// ...", "<where>: repeats the key 'x' (keys must be unique)" (in any object).
nlohmann::json parse_json(std::string_view text, std::string_view where);

// read_text_file + parse_json.
nlohmann::json read_json_file(const std::filesystem::path& file,
                              uint64_t max_bytes = kMaxJsonFileBytes);

// A short description of a JSON value for messages: never recurses into it, never throws, cuts
// long strings ("an object of 3 keys", "an array of 2 elements", "192.5", "\"gelu\"").
std::string describe_json(const nlohmann::json& value);

// Typed reads of one value. `where` names it ("config.json: hidden_size"). Each throws
// moekit::Error "<where>=<value> must be <requirement>" when the value does not qualify, or
// "<where>=<value> has the wrong type (string): expected <requirement>".
// An integer: a JSON number without fraction or exponent (192, not 192.5 or 1.92e2), in
// [min, max].
int64_t json_integer(const nlohmann::json& value, std::string_view where, int64_t min, int64_t max);
// A finite number (integer or not) in [min, max].
double json_number(const nlohmann::json& value, std::string_view where, double min, double max);
bool json_bool(const nlohmann::json& value, std::string_view where);
std::string json_string(const nlohmann::json& value, std::string_view where);
// An array of strings; `items` names them in the requirement ("an array of module names").
std::vector<std::string> json_string_array(const nlohmann::json& value, std::string_view where,
                                           std::string_view items);
// A string equal to one of `valid`; the error lists them.
std::string json_choice(const nlohmann::json& value, std::string_view where,
                        std::initializer_list<std::string_view> valid);

// a * b, or a moekit::Error naming `what` ("num_experts * 2 * intermediate_size * hidden_size")
// when the product of non-negative int64 values overflows.
int64_t checked_mul(int64_t a, int64_t b, std::string_view what);

}  // namespace moekit::io
