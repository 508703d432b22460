#include "moekit/quant/formats.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "moekit/core/error.h"

namespace moekit::quant {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// The grid of a sign-magnitude minifloat: `mantissa_bits` fraction bits, exponent field
// [0, 2^exponent_bits), exponent field 0 holds the subnormals.
struct MiniFloat {
  int exponent_bits;
  int mantissa_bits;
  int bias;
  int emin() const { return 1 - bias; }
};

constexpr MiniFloat kE4M3{4, 3, 7};
constexpr MiniFloat kE5M2{5, 2, 15};
constexpr MiniFloat kE2M1{2, 1, 1};
constexpr MiniFloat kE3M2{3, 2, 3};
constexpr MiniFloat kE2M3{2, 3, 1};

// Round-half-to-even of a non-negative float below 2^23 (the fraction is then exact).
float round_half_even(float t) {
  const float whole = std::floor(t);
  const float frac = t - whole;
  if (frac > 0.5f || (frac == 0.5f && std::fmod(whole, 2.0f) != 0.0f)) return whole + 1.0f;
  return whole;
}

// Rounds a finite a >= 0 to the grid of `f` with an unbounded exponent range above.
// The result may be one binade above the format's largest finite value; callers check overflow.
float round_to_grid(float a, const MiniFloat& f) {
  if (a == 0.0f) return 0.0f;
  const int e = std::max(std::ilogb(a), f.emin());
  const float steps = round_half_even(std::ldexp(a, f.mantissa_bits - e));  // exact scaling
  return std::ldexp(steps, e - f.mantissa_bits);
}

// The magnitude code (exponent and mantissa fields) of a value r >= 0 that lies on the grid.
uint32_t magnitude_code(float r, const MiniFloat& f) {
  if (r == 0.0f) return 0;
  const int e = std::ilogb(r);
  if (e < f.emin()) return static_cast<uint32_t>(std::ldexp(r, f.mantissa_bits - f.emin()));
  const uint32_t mantissa =
      static_cast<uint32_t>(std::ldexp(r, f.mantissa_bits - e)) - (1u << f.mantissa_bits);
  return (static_cast<uint32_t>(e + f.bias) << f.mantissa_bits) | mantissa;
}

// The value of a magnitude code (no special values).
float magnitude_value(uint32_t mag, const MiniFloat& f) {
  const uint32_t mant_mask = (1u << f.mantissa_bits) - 1u;
  const int exp_field = static_cast<int>(mag >> f.mantissa_bits);
  const auto mantissa = static_cast<float>(mag & mant_mask);
  if (exp_field == 0) return std::ldexp(mantissa, f.emin() - f.mantissa_bits);
  return std::ldexp(static_cast<float>(1u << f.mantissa_bits) + mantissa,
                    exp_field - f.bias - f.mantissa_bits);
}

float with_sign(float magnitude, bool negative) {
  return negative ? -magnitude : magnitude;
}

// Encoder for the formats without inf/NaN (fp4, fp6): NaN -> +max, overflow saturates.
uint8_t encode_saturating_minifloat(float value, const MiniFloat& f, float max_finite) {
  const uint32_t sign_bit = 1u << (f.exponent_bits + f.mantissa_bits);
  const uint32_t max_code = magnitude_code(max_finite, f);
  if (std::isnan(value)) return static_cast<uint8_t>(max_code);
  const uint32_t sign = std::signbit(value) ? sign_bit : 0u;
  const float a = std::fabs(value);
  if (a >= max_finite) return static_cast<uint8_t>(sign | max_code);  // also +-inf
  const float r = std::min(round_to_grid(a, f), max_finite);
  return static_cast<uint8_t>(sign | magnitude_code(r, f));
}

float decode_plain_minifloat(uint8_t code, const MiniFloat& f) {
  const int width = f.exponent_bits + f.mantissa_bits;
  const uint32_t c = code & ((1u << (width + 1)) - 1u);
  return with_sign(magnitude_value(c & ((1u << width) - 1u), f), ((c >> width) & 1u) != 0);
}

constexpr std::array<FormatInfo, 8> kFormatInfo = {{
    {"fp8_e4m3", 8, 4, 3, 7, 8, 448.0f, true, false, true},
    {"fp8_e5m2", 8, 5, 2, 15, 15, 57344.0f, true, true, true},
    {"int8", 8, 0, 0, 0, 0, 127.0f, true, false, false},
    {"fp4_e2m1", 4, 2, 1, 1, 2, 6.0f, true, false, false},
    {"fp6_e3m2", 6, 3, 2, 3, 4, 28.0f, true, false, false},
    {"fp6_e2m3", 6, 2, 3, 1, 2, 7.5f, true, false, false},
    {"e8m0", 8, 8, 0, 127, 127, 1.7014118346046923e38f, false, false, true},
    {"ue4m3", 8, 4, 3, 7, 8, 448.0f, false, false, true},
}};

// `count` values need a span of `expected` elements; the caller passed `actual`.
void check_sizes(std::string_view what, size_t count, size_t actual, size_t expected) {
  MOEKIT_CHECK(actual == expected, "{}: span has {} elements, expected {} for {} values", what,
               actual, expected, count);
}

}  // namespace

const FormatInfo& format_info(Format format) {
  return kFormatInfo.at(static_cast<size_t>(format));
}

std::string_view format_name(Format format) {
  return format_info(format).name;
}

// ---- fp8 e4m3fn ---------------------------------------------------------------------------------

float decode_e4m3(uint8_t code) {
  if ((code & 0x7fu) == 0x7fu) return kNaN;
  return with_sign(magnitude_value(code & 0x7fu, kE4M3), (code & 0x80u) != 0);
}

uint8_t encode_e4m3(float value, Overflow overflow) {
  const uint32_t sign = std::signbit(value) ? 0x80u : 0u;
  if (std::isnan(value)) return static_cast<uint8_t>(sign | 0x7fu);
  const float a = std::fabs(value);
  const uint32_t overflow_code = overflow == Overflow::kSaturate ? 0x7eu : 0x7fu;
  if (std::isinf(a)) return static_cast<uint8_t>(sign | overflow_code);
  const float r = round_to_grid(a, kE4M3);
  if (r > 448.0f) return static_cast<uint8_t>(sign | overflow_code);
  return static_cast<uint8_t>(sign | magnitude_code(r, kE4M3));
}

// ---- fp8 e5m2 -----------------------------------------------------------------------------------

float decode_e5m2(uint8_t code) {
  const bool negative = (code & 0x80u) != 0;
  if ((code & 0x7cu) == 0x7cu) {
    if ((code & 0x03u) != 0) return kNaN;
    return with_sign(std::numeric_limits<float>::infinity(), negative);
  }
  return with_sign(magnitude_value(code & 0x7fu, kE5M2), negative);
}

uint8_t encode_e5m2(float value, Overflow overflow) {
  const uint32_t sign = std::signbit(value) ? 0x80u : 0u;
  if (std::isnan(value)) return static_cast<uint8_t>(sign | 0x7eu);
  const float a = std::fabs(value);
  const uint32_t overflow_code = overflow == Overflow::kSaturate ? 0x7bu : 0x7cu;
  if (std::isinf(a)) return static_cast<uint8_t>(sign | overflow_code);
  const float r = round_to_grid(a, kE5M2);
  if (r > 57344.0f) return static_cast<uint8_t>(sign | overflow_code);
  return static_cast<uint8_t>(sign | magnitude_code(r, kE5M2));
}

// ---- int8 ---------------------------------------------------------------------------------------

int8_t encode_int8(float value) {
  if (std::isnan(value)) return 0;
  const float clamped = std::clamp(value, -128.0f, 127.0f);
  const float r = std::signbit(clamped) ? -round_half_even(-clamped) : round_half_even(clamped);
  return static_cast<int8_t>(static_cast<int>(r));
}

// ---- fp4 / fp6 ----------------------------------------------------------------------------------

float decode_fp4_e2m1(uint8_t code) {
  return decode_plain_minifloat(code, kE2M1);
}
uint8_t encode_fp4_e2m1(float value) {
  return encode_saturating_minifloat(value, kE2M1, 6.0f);
}
float decode_fp6_e3m2(uint8_t code) {
  return decode_plain_minifloat(code, kE3M2);
}
uint8_t encode_fp6_e3m2(float value) {
  return encode_saturating_minifloat(value, kE3M2, 28.0f);
}
float decode_fp6_e2m3(uint8_t code) {
  return decode_plain_minifloat(code, kE2M3);
}
uint8_t encode_fp6_e2m3(float value) {
  return encode_saturating_minifloat(value, kE2M3, 7.5f);
}

// ---- e8m0 ---------------------------------------------------------------------------------------

float decode_e8m0(uint8_t code) {
  if (code == 0xffu) return kNaN;
  return std::ldexp(1.0f, e8m0_exponent(code));
}

uint8_t encode_e8m0(float value, E8M0Rounding rounding) {
  if (std::isnan(value) || value < 0.0f) return 0xffu;
  if (value == 0.0f) return 0;
  if (std::isinf(value)) return 254;
  int e = std::ilogb(value);  // exact floor(log2 value), subnormals included
  if (rounding == E8M0Rounding::kCeil && value != std::ldexp(1.0f, e)) ++e;
  return static_cast<uint8_t>(std::clamp(e, -127, 127) + 127);
}

// ---- ue4m3 --------------------------------------------------------------------------------------

float decode_ue4m3(uint8_t code) {
  if (code >= 0x7fu) return kNaN;
  return magnitude_value(code, kE4M3);
}

uint8_t encode_ue4m3(float value) {
  if (std::isnan(value)) return 0x7fu;
  if (!(value > 0.0f)) return 0;
  if (value >= 448.0f) return 0x7eu;
  return static_cast<uint8_t>(magnitude_code(std::min(round_to_grid(value, kE4M3), 448.0f), kE4M3));
}

// ---- any format ---------------------------------------------------------------------------------

float decode(Format format, uint8_t code) {
  switch (format) {
    case Format::kFp8E4M3:
      return decode_e4m3(code);
    case Format::kFp8E5M2:
      return decode_e5m2(code);
    case Format::kInt8:
      return decode_int8(static_cast<int8_t>(code));
    case Format::kFp4E2M1:
      return decode_fp4_e2m1(code);
    case Format::kFp6E3M2:
      return decode_fp6_e3m2(code);
    case Format::kFp6E2M3:
      return decode_fp6_e2m3(code);
    case Format::kE8M0:
      return decode_e8m0(code);
    case Format::kUE4M3:
      return decode_ue4m3(code);
  }
  return kNaN;
}

uint8_t encode(Format format, float value, Overflow overflow) {
  switch (format) {
    case Format::kFp8E4M3:
      return encode_e4m3(value, overflow);
    case Format::kFp8E5M2:
      return encode_e5m2(value, overflow);
    case Format::kInt8:
      return static_cast<uint8_t>(encode_int8(value));
    case Format::kFp4E2M1:
      return encode_fp4_e2m1(value);
    case Format::kFp6E3M2:
      return encode_fp6_e3m2(value);
    case Format::kFp6E2M3:
      return encode_fp6_e2m3(value);
    case Format::kE8M0:
      return encode_e8m0(value, E8M0Rounding::kFloor);
    case Format::kUE4M3:
      return encode_ue4m3(value);
  }
  return 0;
}

void encode(Format format, std::span<const float> values, std::span<uint8_t> codes,
            Overflow overflow) {
  check_sizes(format_name(format), values.size(), codes.size(), values.size());
  std::transform(values.begin(), values.end(), codes.begin(),
                 [&](float v) { return encode(format, v, overflow); });
}

void decode(Format format, std::span<const uint8_t> codes, std::span<float> values) {
  check_sizes(format_name(format), codes.size(), values.size(), codes.size());
  std::transform(codes.begin(), codes.end(), values.begin(),
                 [&](uint8_t c) { return decode(format, c); });
}

void encode_e4m3(std::span<const float> values, std::span<uint8_t> codes, Overflow overflow) {
  encode(Format::kFp8E4M3, values, codes, overflow);
}
void decode_e4m3(std::span<const uint8_t> codes, std::span<float> values) {
  decode(Format::kFp8E4M3, codes, values);
}
void encode_e5m2(std::span<const float> values, std::span<uint8_t> codes, Overflow overflow) {
  encode(Format::kFp8E5M2, values, codes, overflow);
}
void decode_e5m2(std::span<const uint8_t> codes, std::span<float> values) {
  decode(Format::kFp8E5M2, codes, values);
}
void encode_int8(std::span<const float> values, std::span<int8_t> codes) {
  check_sizes("int8", values.size(), codes.size(), values.size());
  std::transform(values.begin(), values.end(), codes.begin(),
                 [](float v) { return encode_int8(v); });
}
void decode_int8(std::span<const int8_t> codes, std::span<float> values) {
  check_sizes("int8", codes.size(), values.size(), codes.size());
  std::transform(codes.begin(), codes.end(), values.begin(),
                 [](int8_t c) { return decode_int8(c); });
}
void encode_ue4m3(std::span<const float> values, std::span<uint8_t> codes) {
  encode(Format::kUE4M3, values, codes);
}
void decode_ue4m3(std::span<const uint8_t> codes, std::span<float> values) {
  decode(Format::kUE4M3, codes, values);
}
void encode_e8m0(std::span<const float> values, std::span<uint8_t> codes, E8M0Rounding rounding) {
  check_sizes("e8m0", values.size(), codes.size(), values.size());
  std::transform(values.begin(), values.end(), codes.begin(),
                 [&](float v) { return encode_e8m0(v, rounding); });
}
void decode_e8m0(std::span<const uint8_t> codes, std::span<float> values) {
  decode(Format::kE8M0, codes, values);
}

// ---- packing ------------------------------------------------------------------------------------

void pack_4bit(std::span<const uint8_t> codes, std::span<uint8_t> packed) {
  check_sizes("pack_4bit", codes.size(), packed.size(), packed_size_4bit(codes.size()));
  for (size_t i = 0; i < packed.size(); ++i) {
    const uint32_t lo = codes[2 * i] & 0xfu;
    const uint32_t hi = 2 * i + 1 < codes.size() ? codes[2 * i + 1] & 0xfu : 0u;
    packed[i] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

void unpack_4bit(std::span<const uint8_t> packed, std::span<uint8_t> codes) {
  check_sizes("unpack_4bit", codes.size(), packed.size(), packed_size_4bit(codes.size()));
  for (size_t i = 0; i < codes.size(); ++i) {
    codes[i] = static_cast<uint8_t>((packed[i / 2] >> (4 * (i % 2))) & 0xfu);
  }
}

void pack_6bit(std::span<const uint8_t> codes, std::span<uint8_t> packed) {
  check_sizes("pack_6bit", codes.size(), packed.size(), packed_size_6bit(codes.size()));
  for (size_t group = 0; group * 4 < codes.size(); ++group) {
    uint32_t word = 0;
    for (size_t i = 0; i < 4 && group * 4 + i < codes.size(); ++i) {
      word |= (codes[group * 4 + i] & 0x3fu) << (6 * i);
    }
    for (size_t b = 0; b < 3; ++b)
      packed[group * 3 + b] = static_cast<uint8_t>(word >> (8 * b));
  }
}

void unpack_6bit(std::span<const uint8_t> packed, std::span<uint8_t> codes) {
  check_sizes("unpack_6bit", codes.size(), packed.size(), packed_size_6bit(codes.size()));
  for (size_t i = 0; i < codes.size(); ++i) {
    const size_t base = i / 4 * 3;
    const uint32_t word = packed[base] | (static_cast<uint32_t>(packed[base + 1]) << 8) |
                          (static_cast<uint32_t>(packed[base + 2]) << 16);
    codes[i] = static_cast<uint8_t>((word >> (6 * (i % 4))) & 0x3fu);
  }
}

void encode_fp4_e2m1_packed(std::span<const float> values, std::span<uint8_t> packed) {
  check_sizes("fp4_e2m1 packed", values.size(), packed.size(), packed_size_4bit(values.size()));
  for (size_t i = 0; i < packed.size(); ++i) {
    const uint32_t lo = encode_fp4_e2m1(values[2 * i]);
    const uint32_t hi = 2 * i + 1 < values.size() ? encode_fp4_e2m1(values[2 * i + 1]) : 0u;
    packed[i] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

void decode_fp4_e2m1_packed(std::span<const uint8_t> packed, std::span<float> values) {
  check_sizes("fp4_e2m1 packed", values.size(), packed.size(), packed_size_4bit(values.size()));
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = decode_fp4_e2m1(static_cast<uint8_t>(packed[i / 2] >> (4 * (i % 2))));
  }
}

void encode_fp6_packed(Format format, std::span<const float> values, std::span<uint8_t> packed) {
  MOEKIT_CHECK(format == Format::kFp6E3M2 || format == Format::kFp6E2M3,
               "encode_fp6_packed: format={} is not an fp6 format", format_name(format));
  check_sizes("fp6 packed", values.size(), packed.size(), packed_size_6bit(values.size()));
  constexpr size_t kChunk = 256;  // a multiple of 4, so chunks pack independently
  std::array<uint8_t, kChunk> codes{};
  for (size_t start = 0; start < values.size(); start += kChunk) {
    const size_t n = std::min(kChunk, values.size() - start);
    for (size_t i = 0; i < n; ++i)
      codes[i] = encode(format, values[start + i]);
    pack_6bit(std::span<const uint8_t>(codes.data(), n),
              packed.subspan(start / 4 * 3, packed_size_6bit(n)));
  }
}

void decode_fp6_packed(Format format, std::span<const uint8_t> packed, std::span<float> values) {
  MOEKIT_CHECK(format == Format::kFp6E3M2 || format == Format::kFp6E2M3,
               "decode_fp6_packed: format={} is not an fp6 format", format_name(format));
  check_sizes("fp6 packed", values.size(), packed.size(), packed_size_6bit(values.size()));
  constexpr size_t kChunk = 256;
  std::array<uint8_t, kChunk> codes{};
  for (size_t start = 0; start < values.size(); start += kChunk) {
    const size_t n = std::min(kChunk, values.size() - start);
    unpack_6bit(packed.subspan(start / 4 * 3, packed_size_6bit(n)), std::span(codes.data(), n));
    for (size_t i = 0; i < n; ++i)
      values[start + i] = decode(format, codes[i]);
  }
}

}  // namespace moekit::quant
