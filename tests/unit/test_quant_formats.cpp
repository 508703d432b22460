// Number formats: exhaustive round trips, round-half-even at every midpoint, saturation, NaN, and
// fp8 encoders against a brute-force nearest-code reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "moekit/core/error.h"
#include "moekit/quant/formats.h"

namespace moekit::quant {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

constexpr Format kAllFormats[] = {Format::kFp8E4M3, Format::kFp8E5M2, Format::kInt8,
                                  Format::kFp4E2M1, Format::kFp6E3M2, Format::kFp6E2M3,
                                  Format::kE8M0,    Format::kUE4M3};
// Sign-magnitude minifloats (the grid formats).
constexpr Format kMiniFloats[] = {Format::kFp8E4M3, Format::kFp8E5M2, Format::kFp4E2M1,
                                  Format::kFp6E3M2, Format::kFp6E2M3, Format::kUE4M3};

int num_codes(Format f) {
  return 1 << format_info(f).bits;
}

bool is_sign_bit_set(Format f, int code) {
  const FormatInfo& info = format_info(f);
  return info.is_signed && f != Format::kInt8 && ((code >> (info.bits - 1)) & 1) != 0;
}

// Value of a minifloat code by the textbook formula, in double (independent of the library).
double formula_value(Format f, int code) {
  const FormatInfo& info = format_info(f);
  const int mbits = info.mantissa_bits;
  const int ebits = info.exponent_bits;
  const int exp_field = (code >> mbits) & ((1 << ebits) - 1);
  const int mant = code & ((1 << mbits) - 1);
  const double frac = static_cast<double>(mant) / static_cast<double>(1 << mbits);
  const double mag = exp_field == 0 ? frac * std::pow(2.0, 1 - info.bias)
                                    : (1.0 + frac) * std::pow(2.0, exp_field - info.bias);
  return is_sign_bit_set(f, code) ? -mag : mag;
}

bool is_nan_code(Format f, int code) {
  switch (f) {
    case Format::kFp8E4M3:
      return (code & 0x7f) == 0x7f;
    case Format::kFp8E5M2:
      return (code & 0x7c) == 0x7c && (code & 0x3) != 0;
    case Format::kE8M0:
      return code == 0xff;
    case Format::kUE4M3:
      return code >= 0x7f;
    default:
      return false;
  }
}

bool is_inf_code(Format f, int code) {
  return f == Format::kFp8E5M2 && (code & 0x7f) == 0x7c;
}

// Finite non-negative codes of a minifloat sorted by value (+0 first).
std::vector<int> nonnegative_codes(Format f) {
  std::vector<int> codes;
  for (int c = 0; c < num_codes(f); ++c) {
    if (is_sign_bit_set(f, c) || is_nan_code(f, c) || is_inf_code(f, c)) continue;
    codes.push_back(c);
  }
  std::sort(codes.begin(), codes.end(), [&](int a, int b) {
    return decode(f, static_cast<uint8_t>(a)) < decode(f, static_cast<uint8_t>(b));
  });
  return codes;
}

// Brute-force saturating RNE: the nearest non-negative code, ties to the even code (whose lowest
// bit is the mantissa's), applied to |x|, with the sign bit added back.
int reference_encode(Format f, const std::vector<int>& codes, float x) {
  const double a = std::fabs(static_cast<double>(x));
  int best = codes.front();
  double best_err = std::fabs(a - decode(f, static_cast<uint8_t>(best)));
  for (int c : codes) {
    const double err = std::fabs(a - decode(f, static_cast<uint8_t>(c)));
    if (err < best_err || (err == best_err && (c & 1) == 0 && (best & 1) == 1)) {
      best = c;
      best_err = err;
    }
  }
  if (std::signbit(x) && f != Format::kUE4M3) best |= 1 << (format_info(f).bits - 1);
  return best;
}

// ---- every code ---------------------------------------------------------------------------------

TEST(QuantFormats, EveryCodeRoundTrips) {
  for (Format f : kAllFormats) {
    SCOPED_TRACE(format_name(f));
    int nan_codes = 0;
    for (int c = 0; c < num_codes(f); ++c) {
      const auto code = static_cast<uint8_t>(c);
      const float v = decode(f, code);
      if (is_nan_code(f, c)) {
        ++nan_codes;
        EXPECT_TRUE(std::isnan(v)) << "code " << c;
        EXPECT_TRUE(std::isnan(decode(f, encode(f, v)))) << "code " << c;
        continue;
      }
      ASSERT_FALSE(std::isnan(v)) << "code " << c;
      if (is_inf_code(f, c)) {
        EXPECT_EQ(encode(f, v, Overflow::kIeee), code);
        continue;
      }
      EXPECT_EQ(encode(f, v), code) << "code " << c << " value " << v;
      EXPECT_EQ(encode(f, v, Overflow::kIeee), code) << "code " << c << " value " << v;
      if (f == Format::kE8M0) {
        EXPECT_EQ(encode_e8m0_ceil(v), code);
      }
    }
    const int expected_nans = f == Format::kFp8E4M3   ? 2
                              : f == Format::kFp8E5M2 ? 6
                              : f == Format::kE8M0    ? 1
                              : f == Format::kUE4M3   ? 129
                                                      : 0;
    EXPECT_EQ(nan_codes, expected_nans);
  }
}

TEST(QuantFormats, DecodeMatchesTextbookFormula) {
  for (Format f : kMiniFloats) {
    SCOPED_TRACE(format_name(f));
    for (int c = 0; c < num_codes(f); ++c) {
      if (is_nan_code(f, c) || is_inf_code(f, c)) continue;
      EXPECT_EQ(static_cast<double>(decode(f, static_cast<uint8_t>(c))), formula_value(f, c))
          << "code " << c;
    }
  }
  for (int c = 0; c < 256; ++c) {
    EXPECT_EQ(decode(Format::kInt8, static_cast<uint8_t>(c)),
              static_cast<float>(c < 128 ? c : c - 256));
    if (c < 255) {
      EXPECT_EQ(static_cast<double>(decode_e8m0(static_cast<uint8_t>(c))), std::pow(2.0, c - 127));
    }
  }
}

TEST(QuantFormats, KnownValues) {
  EXPECT_EQ(decode_e4m3(0x7e), 448.0f);
  EXPECT_EQ(decode_e4m3(0x38), 1.0f);
  EXPECT_EQ(decode_e4m3(0x08), std::ldexp(1.0f, -6));  // min normal
  EXPECT_EQ(decode_e4m3(0x01), std::ldexp(1.0f, -9));  // min subnormal
  EXPECT_EQ(decode_e4m3(0xfe), -448.0f);
  EXPECT_EQ(decode_e5m2(0x7b), 57344.0f);
  EXPECT_EQ(decode_e5m2(0x3c), 1.0f);
  EXPECT_EQ(decode_e5m2(0x01), std::ldexp(1.0f, -16));
  EXPECT_EQ(decode_e5m2(0x7c), kInf);
  EXPECT_EQ(decode_e5m2(0xfc), -kInf);
  const float fp4_values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int c = 0; c < 8; ++c) {
    EXPECT_EQ(decode_fp4_e2m1(static_cast<uint8_t>(c)), fp4_values[c]);
    EXPECT_EQ(decode_fp4_e2m1(static_cast<uint8_t>(c | 8)), -fp4_values[c]);
  }
  EXPECT_EQ(decode_fp4_e2m1(0xf7), 6.0f);  // high bits ignored
  EXPECT_EQ(decode_fp6_e3m2(0x1f), 28.0f);
  EXPECT_EQ(decode_fp6_e3m2(0x01), 0.0625f);
  EXPECT_EQ(decode_fp6_e3m2(0x3f), -28.0f);
  EXPECT_EQ(decode_fp6_e2m3(0x1f), 7.5f);
  EXPECT_EQ(decode_fp6_e2m3(0x01), 0.125f);
  EXPECT_EQ(decode_fp6_e2m3(0x08), 1.0f);
  EXPECT_EQ(decode_e8m0(127), 1.0f);
  EXPECT_EQ(decode_e8m0(0), std::ldexp(1.0f, -127));
  EXPECT_EQ(decode_e8m0(254), std::ldexp(1.0f, 127));
  EXPECT_EQ(decode_ue4m3(0x7e), 448.0f);
  EXPECT_EQ(decode_ue4m3(0x38), 1.0f);
  EXPECT_TRUE(std::isnan(decode_ue4m3(0x80)));
  for (Format f : kAllFormats) {
    EXPECT_EQ(format_info(f).max_finite, f == Format::kE8M0 ? decode(f, 254)
                                         : f == Format::kInt8
                                             ? 127.0f
                                             : decode(f, nonnegative_codes(f).back()));
  }
}

TEST(QuantFormats, SignSymmetry) {
  for (Format f :
       {Format::kFp8E4M3, Format::kFp8E5M2, Format::kFp4E2M1, Format::kFp6E3M2, Format::kFp6E2M3}) {
    SCOPED_TRACE(format_name(f));
    const int sign = 1 << (format_info(f).bits - 1);
    for (int c = 0; c < sign; ++c) {
      if (is_nan_code(f, c)) continue;
      const float pos = decode(f, static_cast<uint8_t>(c));
      const float neg = decode(f, static_cast<uint8_t>(c | sign));
      EXPECT_EQ(neg, -pos);
      EXPECT_TRUE(std::signbit(neg));
      EXPECT_EQ(encode(f, -pos, Overflow::kIeee), c | sign);
    }
  }
}

TEST(QuantFormats, NegativeZeroKeepsSign) {
  EXPECT_EQ(encode_e4m3(-0.0f), 0x80);
  EXPECT_TRUE(std::signbit(decode_e4m3(0x80)));
  EXPECT_EQ(encode_e4m3(-1e-10f), 0x80);  // underflow keeps the sign
  EXPECT_EQ(encode_e5m2(-0.0f), 0x80);
  EXPECT_EQ(encode_fp4_e2m1(-0.0f), 0x8);
  EXPECT_EQ(encode_fp4_e2m1(-0.2f), 0x8);
  EXPECT_EQ(encode_fp6_e3m2(-0.0f), 0x20);
  EXPECT_EQ(encode_fp6_e2m3(-0.0f), 0x20);
  EXPECT_EQ(encode_int8(-0.0f), 0);
  EXPECT_EQ(encode_int8(-0.4f), 0);
  EXPECT_EQ(encode_ue4m3(-0.0f), 0);
}

// ---- rounding -----------------------------------------------------------------------------------

TEST(QuantFormats, MidpointsRoundHalfToEven) {
  for (Format f : kMiniFloats) {
    SCOPED_TRACE(format_name(f));
    const std::vector<int> codes = nonnegative_codes(f);
    for (size_t i = 0; i + 1 < codes.size(); ++i) {
      const int lo = codes[i], hi = codes[i + 1];
      const float a = decode(f, static_cast<uint8_t>(lo)), b = decode(f, static_cast<uint8_t>(hi));
      const float mid = (a + b) / 2;  // exact: a and b have few significant bits
      ASSERT_EQ(static_cast<double>(mid), (static_cast<double>(a) + b) / 2);
      const int even = (lo & 1) == 0 ? lo : hi;
      ASSERT_NE(lo & 1, hi & 1) << "neighbours must differ in the lowest bit";
      EXPECT_EQ(encode(f, mid), even) << "midpoint " << mid;
      EXPECT_EQ(encode(f, std::nextafter(mid, 0.0f)), lo) << "below " << mid;
      EXPECT_EQ(encode(f, std::nextafter(mid, kInf)), hi) << "above " << mid;
      if (f != Format::kUE4M3) {
        const int sign = 1 << (format_info(f).bits - 1);
        EXPECT_EQ(encode(f, -mid), even | sign) << "midpoint " << -mid;
      }
    }
  }
}

TEST(QuantFormats, Int8RoundsHalfToEven) {
  for (int k = -128; k <= 127; ++k) {
    EXPECT_EQ(encode_int8(static_cast<float>(k)), k);
    if (k < 127) {
      const float mid = static_cast<float>(k) + 0.5f;
      EXPECT_EQ(encode_int8(mid), k % 2 == 0 ? k : k + 1) << mid;
      EXPECT_EQ(encode_int8(std::nextafter(mid, -kInf)), k) << mid;
      EXPECT_EQ(encode_int8(std::nextafter(mid, kInf)), k + 1) << mid;
    }
  }
  EXPECT_EQ(encode_int8(0.5f), 0);
  EXPECT_EQ(encode_int8(1.5f), 2);
  EXPECT_EQ(encode_int8(2.5f), 2);
  EXPECT_EQ(encode_int8(-0.5f), 0);
  EXPECT_EQ(encode_int8(-1.5f), -2);
  EXPECT_EQ(encode_int8(-2.5f), -2);
}

// fp8 (and the small formats) against the brute-force nearest code on random values spread over
// every binade, below the smallest subnormal to beyond max.
TEST(QuantFormats, MatchesBruteForceReference) {
  std::mt19937 rng(1234);
  for (Format f : kMiniFloats) {
    SCOPED_TRACE(format_name(f));
    const std::vector<int> codes = nonnegative_codes(f);
    const float max = format_info(f).max_finite;
    const float min_sub = decode(f, 1);
    std::uniform_real_distribution<float> log2_dist(std::log2(min_sub) - 3, std::log2(max) + 2);
    std::uniform_real_distribution<float> linear(-2 * max, 2 * max);
    for (int i = 0; i < 20000; ++i) {
      float x = i % 2 == 0 ? std::exp2(log2_dist(rng)) : linear(rng);
      if (i % 4 == 0) x = -x;
      const int expected = reference_encode(f, codes, f == Format::kUE4M3 ? std::max(x, 0.0f) : x);
      ASSERT_EQ(encode(f, x), expected) << "x = " << x;
    }
  }
}

// ---- overflow and specials ----------------------------------------------------------------------

TEST(QuantFormats, E4M3Overflow) {
  EXPECT_EQ(encode_e4m3(449.0f), 0x7e);
  EXPECT_EQ(encode_e4m3(1e30f), 0x7e);
  EXPECT_EQ(encode_e4m3(kInf), 0x7e);
  EXPECT_EQ(encode_e4m3(-kInf), 0xfe);
  EXPECT_EQ(encode_e4m3(-1e9f), 0xfe);
  // kIeee: 464 is the tie between 448 (even) and the unrepresentable 480.
  EXPECT_EQ(encode_e4m3(464.0f, Overflow::kIeee), 0x7e);
  EXPECT_EQ(encode_e4m3(std::nextafter(464.0f, kInf), Overflow::kIeee), 0x7f);
  EXPECT_EQ(encode_e4m3(-500.0f, Overflow::kIeee), 0xff);
  EXPECT_EQ(encode_e4m3(kInf, Overflow::kIeee), 0x7f);
}

TEST(QuantFormats, E5M2Overflow) {
  EXPECT_EQ(encode_e5m2(61440.0f), 0x7b);
  EXPECT_EQ(encode_e5m2(1e30f), 0x7b);
  EXPECT_EQ(encode_e5m2(kInf), 0x7b);
  EXPECT_EQ(encode_e5m2(-kInf), 0xfb);
  // kIeee: 61440 is the tie between 57344 (odd mantissa) and 65536 (even): rounds to inf.
  EXPECT_EQ(encode_e5m2(std::nextafter(61440.0f, 0.0f), Overflow::kIeee), 0x7b);
  EXPECT_EQ(encode_e5m2(61440.0f, Overflow::kIeee), 0x7c);
  EXPECT_EQ(encode_e5m2(-kInf, Overflow::kIeee), 0xfc);
}

TEST(QuantFormats, SmallFormatsSaturate) {
  for (Overflow o : {Overflow::kSaturate, Overflow::kIeee}) {
    EXPECT_EQ(encode(Format::kFp4E2M1, 7.0f, o), 0x7);
    EXPECT_EQ(encode(Format::kFp4E2M1, 1e20f, o), 0x7);
    EXPECT_EQ(encode(Format::kFp4E2M1, -kInf, o), 0xf);
    EXPECT_EQ(encode(Format::kFp6E3M2, 30.0f, o), 0x1f);
    EXPECT_EQ(encode(Format::kFp6E3M2, -kInf, o), 0x3f);
    EXPECT_EQ(encode(Format::kFp6E2M3, 8.0f, o), 0x1f);
    EXPECT_EQ(encode(Format::kFp6E2M3, -100.0f, o), 0x3f);
    EXPECT_EQ(encode(Format::kUE4M3, 1000.0f, o), 0x7e);
    EXPECT_EQ(encode(Format::kUE4M3, kInf, o), 0x7e);
  }
  EXPECT_EQ(encode_fp4_e2m1(5.0f), 0x6);  // tie 4 | 6: 4 has the even code
  EXPECT_EQ(encode_fp4_e2m1(2.5f), 0x4);  // tie 2 | 3
  EXPECT_EQ(encode_fp4_e2m1(0.25f), 0x0);
  EXPECT_EQ(encode_fp4_e2m1(0.75f), 0x2);
  EXPECT_EQ(encode_int8(127.5f), 127);
  EXPECT_EQ(encode_int8(1e10f), 127);
  EXPECT_EQ(encode_int8(-128.5f), -128);
  EXPECT_EQ(encode_int8(-kInf), -128);
  EXPECT_EQ(encode_ue4m3(-1.0f), 0);
  EXPECT_EQ(encode_ue4m3(-kInf), 0);
}

TEST(QuantFormats, NaNHandling) {
  EXPECT_EQ(encode_e4m3(kNaN), 0x7f);
  EXPECT_EQ(encode_e4m3(-kNaN), 0xff);
  EXPECT_EQ(encode_e4m3(kNaN, Overflow::kIeee), 0x7f);
  EXPECT_EQ(encode_e5m2(kNaN), 0x7e);
  EXPECT_EQ(encode_e5m2(-kNaN), 0xfe);
  EXPECT_TRUE(std::isnan(decode_e5m2(0x7e)));
  EXPECT_TRUE(std::isnan(decode_e5m2(0xfd)));
  EXPECT_EQ(encode_fp4_e2m1(kNaN), 0x7);
  EXPECT_EQ(encode_fp4_e2m1(-kNaN), 0x7);
  EXPECT_EQ(encode_fp6_e3m2(kNaN), 0x1f);
  EXPECT_EQ(encode_fp6_e2m3(-kNaN), 0x1f);
  EXPECT_EQ(encode_int8(kNaN), 0);
  EXPECT_EQ(encode_ue4m3(kNaN), 0x7f);
  EXPECT_EQ(encode_e8m0_floor(kNaN), 0xff);
  EXPECT_EQ(encode_e8m0_ceil(kNaN), 0xff);
}

TEST(QuantFormats, E8M0FloorAndCeil) {
  EXPECT_EQ(encode_e8m0_floor(1.0f), 127);
  EXPECT_EQ(encode_e8m0_ceil(1.0f), 127);
  EXPECT_EQ(encode_e8m0_floor(1.5f), 127);
  EXPECT_EQ(encode_e8m0_ceil(1.5f), 128);
  EXPECT_EQ(encode_e8m0_floor(0.75f), 126);
  EXPECT_EQ(encode_e8m0_ceil(0.75f), 127);
  EXPECT_EQ(encode(Format::kE8M0, 0.75f), 126);  // the generic encoder floors
  // Clamping and specials.
  EXPECT_EQ(encode_e8m0_floor(std::ldexp(1.0f, -130)), 0);
  EXPECT_EQ(encode_e8m0_ceil(std::numeric_limits<float>::denorm_min()), 0);
  EXPECT_EQ(encode_e8m0_floor(std::numeric_limits<float>::max()), 254);
  EXPECT_EQ(encode_e8m0_ceil(std::numeric_limits<float>::max()), 254);
  EXPECT_EQ(encode_e8m0_floor(0.0f), 0);
  EXPECT_EQ(encode_e8m0_ceil(kInf), 254);
  EXPECT_EQ(encode_e8m0_floor(-1.0f), 255);
  // Every power of two, and the values just around it.
  for (int c = 1; c <= 253; ++c) {
    const float v = decode_e8m0(static_cast<uint8_t>(c));
    EXPECT_EQ(encode_e8m0_floor(v * 1.5f), c);
    EXPECT_EQ(encode_e8m0_ceil(v * 1.5f), c + 1);
    EXPECT_EQ(encode_e8m0_floor(std::nextafter(v, 0.0f)), c - 1);
    EXPECT_EQ(encode_e8m0_ceil(std::nextafter(v, 0.0f)), c);
    EXPECT_EQ(encode_e8m0_ceil(std::nextafter(v, kInf)), c + 1);
    EXPECT_EQ(e8m0_exponent(static_cast<uint8_t>(c)), c - 127);
  }
}

// ---- bulk and packing ---------------------------------------------------------------------------

TEST(QuantFormats, BulkMatchesScalar) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 100.0f);
  std::vector<float> values(1001);
  for (float& v : values)
    v = dist(rng);
  std::vector<uint8_t> codes(values.size());
  std::vector<float> back(values.size());
  for (Format f : kAllFormats) {
    encode(f, values, codes);
    decode(f, codes, back);
    for (size_t i = 0; i < values.size(); ++i) {
      ASSERT_EQ(codes[i], encode(f, values[i])) << format_name(f) << " " << values[i];
      ASSERT_EQ(std::bit_cast<uint32_t>(back[i]), std::bit_cast<uint32_t>(decode(f, codes[i])));
    }
  }
  std::vector<uint8_t> named(values.size());
  encode_e4m3(values, named, Overflow::kIeee);
  for (size_t i = 0; i < values.size(); ++i)
    ASSERT_EQ(named[i], encode_e4m3(values[i], Overflow::kIeee));
  std::vector<int8_t> int8_codes(values.size());
  encode_int8(values, int8_codes);
  decode_int8(int8_codes, back);
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(int8_codes[i], encode_int8(values[i]));
    ASSERT_EQ(back[i], static_cast<float>(int8_codes[i]));
  }
  encode_e8m0(values, named, E8M0Rounding::kCeil);
  for (size_t i = 0; i < values.size(); ++i)
    ASSERT_EQ(named[i], encode_e8m0_ceil(values[i]));

  std::vector<uint8_t> short_codes(values.size() - 1);
  EXPECT_THROW(encode(Format::kFp8E4M3, values, short_codes), moekit::Error);
  EXPECT_THROW(decode_e5m2(short_codes, back), moekit::Error);
}

TEST(QuantFormats, Pack4BitLowNibbleFirst) {
  const std::vector<uint8_t> codes = {0x1, 0x2, 0x3};
  std::vector<uint8_t> packed(packed_size_4bit(codes.size()));
  ASSERT_EQ(packed.size(), 2u);
  pack_4bit(codes, packed);
  EXPECT_EQ(packed[0], 0x21);
  EXPECT_EQ(packed[1], 0x03);  // odd tail: high nibble 0
  std::vector<uint8_t> back(3);
  unpack_4bit(packed, back);
  EXPECT_EQ(back, codes);

  // fp4: 0.5 -> 0x1, -6 -> 0xf, 1 -> 0x2.
  const std::vector<float> values = {0.5f, -6.0f, 1.0f};
  std::vector<uint8_t> fp4(2, 0xaa);
  encode_fp4_e2m1_packed(values, fp4);
  EXPECT_EQ(fp4[0], 0xf1);
  EXPECT_EQ(fp4[1], 0x02);
  std::vector<float> decoded(3);
  decode_fp4_e2m1_packed(fp4, decoded);
  EXPECT_EQ(decoded, values);
  std::vector<uint8_t> wrong(3);
  EXPECT_THROW(pack_4bit(codes, wrong), moekit::Error);
}

TEST(QuantFormats, Pack6BitLittleEndianWord) {
  // word = 0x01 | 0x02 << 6 | 0x03 << 12 | 0x3f << 18 = 0xfc3081.
  const std::vector<uint8_t> codes = {0x01, 0x02, 0x03, 0x3f, 0x15};
  std::vector<uint8_t> packed(packed_size_6bit(codes.size()));
  ASSERT_EQ(packed.size(), 6u);
  pack_6bit(codes, packed);
  EXPECT_EQ(packed, (std::vector<uint8_t>{0x81, 0x30, 0xfc, 0x15, 0x00, 0x00}));
  std::vector<uint8_t> back(codes.size());
  unpack_6bit(packed, back);
  EXPECT_EQ(back, codes);

  // fp6 e2m3: 1.0 -> 0x08, -7.5 -> 0x3f, 0.125 -> 0x01, 0 -> 0x00.
  // word = 0x08 | 0x3f << 6 | 0x01 << 12 = 0x001fc8.
  const std::vector<float> values = {1.0f, -7.5f, 0.125f, 0.0f};
  std::vector<uint8_t> fp6(3);
  encode_fp6_packed(Format::kFp6E2M3, values, fp6);
  EXPECT_EQ(fp6, (std::vector<uint8_t>{0xc8, 0x1f, 0x00}));
  EXPECT_THROW(encode_fp6_packed(Format::kFp4E2M1, values, fp6), moekit::Error);
}

TEST(QuantFormats, PackingRoundTripsEverySize) {
  std::mt19937 rng(99);
  for (size_t n = 0; n <= 1030; n += (n < 20 ? 1 : 257)) {
    std::vector<uint8_t> codes4(n), codes6(n);
    for (size_t i = 0; i < n; ++i) {
      codes4[i] = static_cast<uint8_t>(rng() & 0xf);
      codes6[i] = static_cast<uint8_t>(rng() & 0x3f);
    }
    std::vector<uint8_t> p4(packed_size_4bit(n)), p6(packed_size_6bit(n)), b4(n), b6(n);
    pack_4bit(codes4, p4);
    unpack_4bit(p4, b4);
    pack_6bit(codes6, p6);
    unpack_6bit(p6, b6);
    EXPECT_EQ(b4, codes4) << n;
    EXPECT_EQ(b6, codes6) << n;

    // Packed fp6 encode/decode equals scalar encode/decode (crosses the 256-value chunking).
    std::vector<float> values(n), decoded(n);
    std::normal_distribution<float> dist(0.0f, 4.0f);
    for (float& v : values)
      v = dist(rng);
    for (Format f : {Format::kFp6E3M2, Format::kFp6E2M3}) {
      encode_fp6_packed(f, values, p6);
      decode_fp6_packed(f, p6, decoded);
      unpack_6bit(p6, b6);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(b6[i], encode(f, values[i]));
        ASSERT_EQ(decoded[i], decode(f, b6[i]));
      }
    }
  }
}

}  // namespace
}  // namespace moekit::quant
