// Scalar conversions between float and the 16-bit floating-point formats (bf16, IEEE fp16).
// Host-side, bit-exact, round-to-nearest-even; NaN stays NaN and infinities are kept.
#pragma once

#include <bit>
#include <cstdint>

namespace moekit {

// Raw storage of one bf16 value (the top 16 bits of an IEEE float32).
struct bf16_t {
  uint16_t bits = 0;
};
// Raw storage of one IEEE binary16 value.
struct f16_t {
  uint16_t bits = 0;
};

inline float bf16_bits_to_float(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

inline uint16_t float_to_bf16_bits(float value) {
  uint32_t u = std::bit_cast<uint32_t>(value);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  const uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding_bias) >> 16);
}

inline float f16_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: renormalize
      int e = -1;
      uint32_t m = mant;
      do {
        ++e;
        m <<= 1;
      } while ((m & 0x400u) == 0);
      u = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((m & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0u);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(u);
}

inline uint16_t float_to_f16_bits(float value) {
  const uint32_t u = std::bit_cast<uint32_t>(value);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {               // result is subnormal or zero
    if (abs < 0x33000000u) return sign;  // below half the smallest subnormal
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - exp;  // aligns the 24-bit mantissa to the subnormal grid 2^-24
    uint32_t result = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);  // bits shifted out: round to nearest even
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (result & 1u))) ++result;
    return static_cast<uint16_t>(sign | result);
  }
  uint32_t result = ((abs - 0x38000000u) >> 13);
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (result & 1u))) ++result;
  return static_cast<uint16_t>(sign | result);
}

inline float to_float(bf16_t v) {
  return bf16_bits_to_float(v.bits);
}
inline float to_float(f16_t v) {
  return f16_bits_to_float(v.bits);
}
inline bf16_t to_bf16(float v) {
  return bf16_t{float_to_bf16_bits(v)};
}
inline f16_t to_f16(float v) {
  return f16_t{float_to_f16_bits(v)};
}

// Rounds a float to the nearest value representable in bf16 / fp16 (as a float).
inline float round_to_bf16(float v) {
  return bf16_bits_to_float(float_to_bf16_bits(v));
}
inline float round_to_f16(float v) {
  return f16_bits_to_float(float_to_f16_bits(v));
}

}  // namespace moekit
