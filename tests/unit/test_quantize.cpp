// quantize / dequantize: closed-form cases, scale-grid shapes, per-scheme error bounds on random
// data, zero and tiny blocks, code packing inside QuantizedTensor, and argument checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "moekit/core/error.h"
#include "moekit/quant/formats.h"
#include "moekit/quant/quantize.h"

namespace moekit::quant {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Random matrix with a different magnitude per row and no exact zeros.
std::vector<float> random_matrix(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> log_mag(-3.0f, 3.0f);
  std::vector<float> data(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float mag = std::exp2(log_mag(rng));
    for (int64_t c = 0; c < cols; ++c) {
      float x = 0.0f;
      while (std::fabs(x) < 1e-3f)
        x = normal(rng);
      data[static_cast<size_t>(r * cols + c)] = x * mag;
    }
  }
  return data;
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

std::optional<Format> element_format(QuantDType dtype) {
  switch (dtype) {
    case QuantDType::kFp8E4M3:
      return Format::kFp8E4M3;
    case QuantDType::kFp8E5M2:
      return Format::kFp8E5M2;
    case QuantDType::kFp4E2M1:
      return Format::kFp4E2M1;
    case QuantDType::kFp6E3M2:
      return Format::kFp6E3M2;
    case QuantDType::kFp6E2M3:
      return Format::kFp6E2M3;
    default:
      return std::nullopt;
  }
}

// Error bound in scaled units for y = x / s: half the grid spacing at |y| for float elements (plus
// the saturation excess beyond qmax), half a step for integers.
double scaled_bound(const QuantScheme& scheme, double y) {
  const double a = std::fabs(y);
  const auto f = element_format(scheme.dtype);
  if (!f) return 0.5;
  const FormatInfo& info = format_info(*f);
  const int emin = 1 - info.bias;
  const int e = a > 0 ? std::max(std::ilogb(a), emin) : emin;
  const double half_spacing = std::ldexp(0.5, e - info.mantissa_bits);
  return std::max(half_spacing, a - info.max_finite);
}

// Block (i, j) of element (r, c).
std::pair<int64_t, int64_t> block_of(const QuantizedTensor& q, int64_t r, int64_t c) {
  const int64_t br = q.scheme.block.rows < 0 ? std::max<int64_t>(q.rows, 1) : q.scheme.block.rows;
  const int64_t bc = q.scheme.block.cols < 0 ? std::max<int64_t>(q.cols, 1) : q.scheme.block.cols;
  return {r / br, c / bc};
}

// Expected [scale_rows, scale_cols] of a scheme on [rows, cols].
std::pair<int64_t, int64_t> expected_grid(const QuantScheme& s, int64_t rows, int64_t cols) {
  return {s.block.rows < 0 ? 1 : ceil_div(rows, s.block.rows),
          s.block.cols < 0 ? 1 : ceil_div(cols, s.block.cols)};
}

void expect_shapes(const QuantizedTensor& q, const QuantScheme& s, int64_t rows, int64_t cols) {
  const auto [sr, sc] = expected_grid(s, rows, cols);
  EXPECT_EQ(q.scale_rows, sr);
  EXPECT_EQ(q.scale_cols, sc);
  const auto n = static_cast<size_t>(sr * sc);
  EXPECT_EQ(q.scales.size(), s.scale_dtype == ScaleDType::kF32 ? n : 0u);
  EXPECT_EQ(q.scale_codes.size(), s.scale_dtype == ScaleDType::kF32 ? 0u : n);
  EXPECT_EQ(q.zero_points.size(), s.symmetric ? 0u : n);
  EXPECT_EQ(q.codes.size(), static_cast<size_t>(rows * code_row_bytes(s.dtype, cols)));
}

// Every scheme the tests sweep, with a name for messages.
struct NamedScheme {
  std::string name;
  QuantScheme scheme;
};

std::vector<NamedScheme> all_schemes() {
  return {
      {"fp8_per_tensor", QuantScheme::fp8_per_tensor()},
      {"fp8_per_token", QuantScheme::fp8_per_token()},
      {"fp8_group128", QuantScheme::fp8_per_token_group(128)},
      {"fp8_group64", QuantScheme::fp8_per_token_group(64)},
      {"fp8_block128", QuantScheme::fp8_block()},
      {"fp8_block128_e8m0", QuantScheme::fp8_block(128, 128, ScaleDType::kUE8M0)},
      {"mxfp4", QuantScheme::mxfp4()},
      {"mxfp4_ceil", QuantScheme::mx(QuantDType::kFp4E2M1, E8M0Rounding::kCeil)},
      {"mxfp6_e3m2", QuantScheme::mxfp6_e3m2()},
      {"mxfp6_e2m3", QuantScheme::mxfp6_e2m3()},
      {"mxfp8", QuantScheme::mxfp8()},
      {"mxfp8_e5m2", QuantScheme::mx(QuantDType::kFp8E5M2)},
      {"nvfp4", QuantScheme::nvfp4()},
      {"int8_per_tensor", QuantScheme::int8_per_tensor()},
      {"int8_per_token", QuantScheme::int8_per_token()},
      {"int8_per_token_asym", QuantScheme::int8_per_token(false)},
      {"int8_group128", QuantScheme::int_weight_groups(QuantDType::kInt8, 128)},
      {"int8_group128_asym", QuantScheme::int_weight_groups(QuantDType::kInt8, 128, false)},
      {"int4_group32", QuantScheme::int_weight_groups(QuantDType::kInt4, 32)},
      {"int4_group128_asym", QuantScheme::int_weight_groups(QuantDType::kInt4, 128, false)},
      {"int4_per_channel", QuantScheme::int_weight_groups(QuantDType::kInt4, -1)},
  };
}

// ---- error bounds on random data ----------------------------------------------------------------

TEST(Quantize, ErrorBoundsPerScheme) {
  const std::pair<int64_t, int64_t> sizes[] = {{1, 1}, {1, 33}, {33, 300}, {130, 256}, {7, 16}};
  uint32_t seed = 1;
  for (const auto& [name, scheme] : all_schemes()) {
    for (const auto& [rows, cols] : sizes) {
      SCOPED_TRACE(name + " [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
      const std::vector<float> x = random_matrix(rows, cols, seed++);
      const QuantizedTensor q = quantize(x, rows, cols, scheme);
      expect_shapes(q, scheme, rows, cols);
      std::vector<float> dq(x.size(), kNaN);  // poisoned
      dequantize(q, dq);
      double worst = 0.0;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const auto i = static_cast<size_t>(r * cols + c);
          const auto [bi, bj] = block_of(q, r, c);
          const double s = q.scale_value(bi, bj);
          ASSERT_TRUE(std::isfinite(s) && s >= 0) << "scale " << s;
          if (s == 0) {  // NVFP4 block whose ue4m3 scale underflowed: its codes are 0
            ASSERT_EQ(dq[i], 0.0f);
            continue;
          }
          const double err = std::fabs(static_cast<double>(x[i]) - dq[i]);
          const double bound =
              s * scaled_bound(scheme, x[i] / s) * (1 + 1e-5) + 1e-6 * std::fabs(x[i]);
          ASSERT_LE(err, bound) << "x=" << x[i] << " dq=" << dq[i] << " at (" << r << ", " << c
                                << ")";
          worst = std::max(worst, err / std::max(bound, 1e-30));
        }
      }
      // Random data is not representable: the error reaches a fair part of the bound.
      if (rows * cols >= 33) {
        EXPECT_GT(worst, 0.05);
      }
    }
  }
}

// Dynamic scales follow the documented rule, block by block.
TEST(Quantize, DynamicScalesFollowTheRule) {
  const int64_t rows = 70, cols = 300;
  const std::vector<float> x = random_matrix(rows, cols, 42);
  for (const auto& [name, scheme] : all_schemes()) {
    SCOPED_TRACE(name);
    const QuantizedTensor q = quantize(x, rows, cols, scheme);
    const float qmax = element_qmax(scheme);
    std::vector<float> amax(static_cast<size_t>(q.scale_rows * q.scale_cols), 0.0f);
    std::vector<float> lo(amax.size(), 0.0f), hi(amax.size(), 0.0f);
    float tensor_amax = 0.0f;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const auto [bi, bj] = block_of(q, r, c);
        const auto b = static_cast<size_t>(bi * q.scale_cols + bj);
        const float v = x[static_cast<size_t>(r * cols + c)];
        amax[b] = std::max(amax[b], std::fabs(v));
        lo[b] = std::min(lo[b], v);
        hi[b] = std::max(hi[b], v);
        tensor_amax = std::max(tensor_amax, std::fabs(v));
      }
    }
    if (scheme.scale_dtype == ScaleDType::kUE4M3) {
      EXPECT_EQ(q.global_scale, 448.0f * 6.0f / tensor_amax);
    }
    for (size_t b = 0; b < amax.size(); ++b) {
      switch (scheme.scale_dtype) {
        case ScaleDType::kF32:
          if (scheme.symmetric) {
            EXPECT_EQ(q.scales[b], amax[b] / qmax) << b;
          } else {
            EXPECT_EQ(q.scales[b], (hi[b] - lo[b]) / qmax) << b;
            EXPECT_EQ(q.zero_points[b], static_cast<int>(std::nearbyint(-lo[b] / q.scales[b])));
          }
          break;
        case ScaleDType::kUE8M0: {
          const int e = e8m0_exponent(q.scale_codes[b]);
          if (scheme.e8m0_rounding == E8M0Rounding::kFloor) {
            // OCP MX: floor(log2 amax) - emax_elem.
            const int emax = format_info(*element_format(scheme.dtype)).emax;
            EXPECT_EQ(e,
                      static_cast<int>(std::floor(std::log2(static_cast<double>(amax[b])))) - emax);
          } else {
            // Smallest power of two that keeps amax / scale <= qmax.
            EXPECT_LE(amax[b], std::ldexp(static_cast<double>(qmax), e));
            EXPECT_GT(amax[b], std::ldexp(static_cast<double>(qmax), e - 1));
          }
          break;
        }
        case ScaleDType::kUE4M3:
          EXPECT_EQ(q.scale_codes[b], encode_ue4m3(amax[b] / 6.0f * q.global_scale));
          break;
        case ScaleDType::kActivation:
          FAIL();
      }
    }
  }
}

// ---- closed-form cases --------------------------------------------------------------------------

TEST(Quantize, Fp8StaticPerTensorIsExactOnTheGrid) {
  // x = 0.5 * v for every finite e4m3 value v: codes are exactly the codes of v.
  std::vector<float> x;
  std::vector<uint8_t> expected;
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    x.push_back(0.5f * decode_e4m3(static_cast<uint8_t>(c)));
    expected.push_back(static_cast<uint8_t>(c));
  }
  const auto cols = static_cast<int64_t>(x.size());
  const float scale = 0.5f;
  const QuantizedTensor q =
      quantize_with_scales(x, 1, cols, QuantScheme::fp8_per_tensor(), std::span(&scale, 1));
  EXPECT_EQ(q.codes, expected);
  ASSERT_EQ(q.scales, std::vector<float>{0.5f});
  EXPECT_EQ(dequantize(q), x);
  // Static scales saturate values beyond the range.
  const std::vector<float> big = {1000.0f, -1000.0f};
  const QuantizedTensor qs =
      quantize_with_scales(big, 1, 2, QuantScheme::fp8_per_tensor(), std::span(&scale, 1));
  EXPECT_EQ(qs.codes, (std::vector<uint8_t>{0x7e, 0xfe}));
}

TEST(Quantize, StaticScalesReproduceDynamicCodes) {
  const int64_t rows = 9, cols = 260;
  const std::vector<float> x = random_matrix(rows, cols, 5);
  for (const QuantScheme& s : {QuantScheme::fp8_per_token(), QuantScheme::fp8_per_token_group(),
                               QuantScheme::fp8_block(), QuantScheme::int8_per_token()}) {
    const QuantizedTensor dyn = quantize(x, rows, cols, s);
    const QuantizedTensor st = quantize_with_scales(x, rows, cols, s, dyn.scales);
    EXPECT_EQ(st.codes, dyn.codes) << s.to_string();
    EXPECT_EQ(st.scales, dyn.scales);
  }
  const QuantizedTensor dyn = quantize(x, rows, cols, QuantScheme::nvfp4());
  const QuantizedTensor st =
      quantize_with_scales(x, rows, cols, QuantScheme::nvfp4(), std::span(&dyn.global_scale, 1));
  EXPECT_EQ(st.codes, dyn.codes);
  EXPECT_EQ(st.scale_codes, dyn.scale_codes);
}

TEST(Quantize, Int8PerTokenIsExactForScaledIntegers) {
  // Row r holds k * 2^-r for k in [-127, 127]: the scale is exactly 2^-r and codes are k.
  const int64_t rows = 4, cols = 255;
  std::vector<float> x;
  for (int64_t r = 0; r < rows; ++r) {
    for (int k = -127; k <= 127; ++k)
      x.push_back(std::ldexp(static_cast<float>(k), -static_cast<int>(r)));
  }
  const QuantizedTensor q = quantize(x, rows, cols, QuantScheme::int8_per_token());
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_EQ(q.scales[static_cast<size_t>(r)], std::ldexp(1.0f, -static_cast<int>(r)));
    for (int k = -127; k <= 127; ++k) {
      EXPECT_EQ(static_cast<int8_t>(q.code_at(r, k + 127)), k);
    }
  }
  EXPECT_EQ(dequantize(q), x);
}

TEST(Quantize, Nvfp4ClosedForm) {
  // Tensor amax 6 -> global scale 448. Block 0 (amax 6): scale 448, y = x. Block 1 (amax 3):
  // scale 224, y = 2x. Every value sits on the fp4 grid, so dequantization is exact.
  std::vector<float> x(32);
  const float grid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int i = 0; i < 16; ++i) {
    x[static_cast<size_t>(i)] = (i % 2 ? -1.0f : 1.0f) * grid[i % 8];
    x[static_cast<size_t>(16 + i)] = x[static_cast<size_t>(i)] / 2;
  }
  const QuantizedTensor q = quantize(x, 1, 32, QuantScheme::nvfp4());
  EXPECT_EQ(q.global_scale, 448.0f);
  EXPECT_EQ(q.scale_codes, (std::vector<uint8_t>{0x7e, encode_ue4m3(224.0f)}));
  EXPECT_EQ(decode_ue4m3(q.scale_codes[1]), 224.0f);
  EXPECT_EQ(dequantize(q), x);
  // Element 1 = -0.5 (code 0x9) and element 0 = 0 (code 0x0) share byte 0, low nibble first.
  EXPECT_EQ(q.codes[0], 0x90);
  EXPECT_EQ(q.code_at(0, 17), q.code_at(0, 1));
}

TEST(Quantize, MxClosedForm) {
  // amax 12 -> floor(log2 12) - 2 = 1: scale 2, elements = x / 2 on the fp4 grid.
  std::vector<float> x(32, 1.0f);
  x[0] = 12.0f;
  x[1] = -8.0f;
  x[2] = 3.0f;
  const QuantizedTensor q = quantize(x, 1, 32, QuantScheme::mxfp4());
  ASSERT_EQ(q.scale_codes, std::vector<uint8_t>{128});
  EXPECT_EQ(q.code_at(0, 0), 0x7);  // 6
  EXPECT_EQ(q.code_at(0, 1), 0xe);  // -4
  EXPECT_EQ(q.code_at(0, 2), 0x3);  // 1.5
  EXPECT_EQ(q.code_at(0, 3), 0x1);  // 0.5
  EXPECT_EQ(dequantize(q), x);
  // OCP floor rule saturates: amax 7.9 -> e = 0, 7.9 -> 6; ceil picks e = 1 instead.
  x[0] = 7.9f;
  x[1] = 0.0f;
  const QuantizedTensor qf = quantize(x, 1, 32, QuantScheme::mxfp4());
  EXPECT_EQ(qf.scale_codes[0], 127);
  EXPECT_EQ(qf.code_at(0, 0), 0x7);
  const QuantizedTensor qc =
      quantize(x, 1, 32, QuantScheme::mx(QuantDType::kFp4E2M1, E8M0Rounding::kCeil));
  EXPECT_EQ(qc.scale_codes[0], 128);
  EXPECT_EQ(qc.code_at(0, 0), 0x6);  // 7.9 / 2 = 3.95 -> 4
}

TEST(Quantize, Int4SymmetricIsUint4b8LowNibbleFirst) {
  // Group of 16 with amax 7: scale 1, q = x, stored as q + 8.
  std::vector<float> x(16);
  for (int i = 0; i < 16; ++i)
    x[static_cast<size_t>(i)] = static_cast<float>(i % 15 - 7);
  const QuantizedTensor q =
      quantize(x, 1, 16, QuantScheme::int_weight_groups(QuantDType::kInt4, 16));
  ASSERT_EQ(q.scales, std::vector<float>{1.0f});
  ASSERT_EQ(q.codes.size(), 8u);
  EXPECT_EQ(q.codes[0], 0x21);  // x0 = -7 -> 1 (low), x1 = -6 -> 2 (high)
  EXPECT_EQ(q.codes[7], 0x1f);  // x14 = 7 -> 15 (low), x15 = -7 -> 1 (high)
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(q.code_at(0, i), static_cast<uint8_t>(x[static_cast<size_t>(i)] + 8));
  }
  EXPECT_EQ(dequantize(q), x);
}

TEST(Quantize, AsymmetricZeroPoints) {
  // Values -3..12: lo = -3, hi = 12, scale 1, zero point 3, codes x + 3.
  std::vector<float> x(16);
  for (int i = 0; i < 16; ++i)
    x[static_cast<size_t>(i)] = static_cast<float>(i - 3);
  const QuantizedTensor q4 =
      quantize(x, 1, 16, QuantScheme::int_weight_groups(QuantDType::kInt4, -1, false));
  ASSERT_EQ(q4.scales, std::vector<float>{1.0f});
  ASSERT_EQ(q4.zero_points, std::vector<uint8_t>{3});
  for (int i = 0; i < 16; ++i)
    EXPECT_EQ(q4.code_at(0, i), i);
  EXPECT_EQ(dequantize(q4), x);
  // All-positive data still keeps zero exactly representable (lo is clamped to 0).
  std::vector<float> pos(255);
  for (int i = 0; i < 255; ++i)
    pos[static_cast<size_t>(i)] = static_cast<float>(i + 1);
  const QuantizedTensor q8 = quantize(pos, 1, 255, QuantScheme::int8_per_token(false));
  EXPECT_EQ(q8.zero_points, std::vector<uint8_t>{0});
  EXPECT_EQ(q8.scales, std::vector<float>{1.0f});
  EXPECT_EQ(dequantize(q8), pos);
}

// ---- zero and tiny blocks -----------------------------------------------------------------------

TEST(Quantize, ZeroAndTinyBlocksStayFinite) {
  const int64_t rows = 5, cols = 300;
  for (const auto& [name, scheme] : all_schemes()) {
    SCOPED_TRACE(name);
    // All zeros: finite, non-zero scales and exact zeros back.
    const std::vector<float> zeros(static_cast<size_t>(rows * cols), 0.0f);
    const QuantizedTensor qz = quantize(zeros, rows, cols, scheme);
    for (int64_t i = 0; i < qz.scale_rows; ++i) {
      for (int64_t j = 0; j < qz.scale_cols; ++j) {
        const float s = qz.scale_value(i, j);
        if (scheme.scale_dtype == ScaleDType::kUE4M3) {
          EXPECT_EQ(s, 0.0f);  // sf = ue4m3(0) = 0; its codes are 0
        } else {
          EXPECT_TRUE(std::isfinite(s) && s > 0.0f) << s;
        }
      }
    }
    EXPECT_TRUE(std::isfinite(qz.global_scale));
    for (float v : dequantize(qz))
      ASSERT_EQ(v, 0.0f);

    // One normal row, the rest tiny: every scale finite, every output finite and close.
    std::vector<float> x = random_matrix(rows, cols, 77);
    for (size_t i = static_cast<size_t>(cols); i < x.size(); ++i)
      x[i] *= 1e-30f;
    const QuantizedTensor qt = quantize(x, rows, cols, scheme);
    for (int64_t i = 0; i < qt.scale_rows; ++i) {
      for (int64_t j = 0; j < qt.scale_cols; ++j)
        ASSERT_TRUE(std::isfinite(qt.scale_value(i, j)));
    }
    const std::vector<float> dq = dequantize(qt);
    for (size_t i = static_cast<size_t>(cols); i < x.size(); ++i) {
      ASSERT_TRUE(std::isfinite(dq[i]));
      ASSERT_LE(std::fabs(dq[i]), 1e-9f) << "tiny input " << x[i];
    }
  }
}

// ---- layout -------------------------------------------------------------------------------------

TEST(Quantize, RowsStartOnByteBoundaries) {
  // fp4 with 3 columns: 2 bytes per row, the high nibble of each row's last byte is 0.
  const std::vector<float> x = {0.5f, 1.0f, 6.0f, -0.5f, -1.0f, -6.0f};
  const float scale = 1.0f;
  QuantScheme s = QuantScheme::fp8_per_tensor();
  s.dtype = QuantDType::kFp4E2M1;
  const QuantizedTensor q = quantize_with_scales(x, 2, 3, s, std::span(&scale, 1));
  EXPECT_EQ(q.codes, (std::vector<uint8_t>{0x21, 0x07, 0xa9, 0x0f}));
  EXPECT_EQ(dequantize(q), x);

  // fp6 e2m3 with 5 columns: 6 bytes per row; row 1 starts at byte 6.
  s.dtype = QuantDType::kFp6E2M3;
  const std::vector<float> y = {1.0f, -7.5f, 0.125f, 0.0f, 1.0f, 0.125f, 0.0f, 0.0f, 0.0f, 0.0f};
  const QuantizedTensor q6 = quantize_with_scales(y, 2, 5, s, std::span(&scale, 1));
  EXPECT_EQ(q6.codes, (std::vector<uint8_t>{0xc8, 0x1f, 0x00, 0x08, 0x00, 0x00,  // row 0
                                            0x01, 0x00, 0x00, 0x00, 0x00, 0x00}));
  EXPECT_EQ(q6.code_at(1, 0), 0x01);
  EXPECT_EQ(dequantize(q6), y);
}

TEST(Quantize, EmptyShapes) {
  const std::vector<float> none;
  const QuantizedTensor q0 = quantize(none, 0, 128, QuantScheme::fp8_per_token_group());
  EXPECT_EQ(q0.scale_rows, 0);
  EXPECT_EQ(q0.scale_cols, 1);
  EXPECT_TRUE(q0.codes.empty());
  const QuantizedTensor qt = quantize(none, 0, 0, QuantScheme::fp8_per_tensor());
  EXPECT_EQ(qt.scales.size(), 1u);
  EXPECT_TRUE(std::isfinite(qt.scales[0]));
  EXPECT_TRUE(dequantize(qt).empty());
}

// ---- argument checks ----------------------------------------------------------------------------

TEST(Quantize, RejectsBadArguments) {
  const std::vector<float> x(64, 1.0f);
  EXPECT_THROW(quantize(x, 8, 9, QuantScheme::fp8_per_tensor()), moekit::Error);
  QuantScheme asym_fp8 = QuantScheme::fp8_per_token();
  asym_fp8.symmetric = false;
  EXPECT_NE(unsupported_reason(asym_fp8), "");
  EXPECT_THROW(quantize(x, 8, 8, asym_fp8), moekit::Error);
  QuantScheme mx_int = QuantScheme::mxfp4();
  mx_int.dtype = QuantDType::kInt8;
  EXPECT_NE(unsupported_reason(mx_int), "");
  QuantScheme bad_block = QuantScheme::fp8_per_token_group(0);
  EXPECT_NE(unsupported_reason(bad_block), "");
  EXPECT_EQ(unsupported_reason(QuantScheme::nvfp4()), "");

  const std::vector<float> two = {1.0f, 2.0f};
  EXPECT_THROW(quantize_with_scales(x, 8, 8, QuantScheme::fp8_per_token(), two), moekit::Error);
  const std::vector<float> zero_scale = {0.0f};
  EXPECT_THROW(quantize_with_scales(x, 8, 8, QuantScheme::fp8_per_tensor(), zero_scale),
               moekit::Error);
  EXPECT_THROW(quantize_with_scales(x, 8, 8, QuantScheme::mxfp4(), two), moekit::Error);
  try {
    quantize_with_scales(x, 8, 8, QuantScheme::fp8_per_token(), two);
  } catch (const moekit::Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs 8"), std::string::npos) << e.what();
  }
  const QuantizedTensor q = quantize(x, 8, 8, QuantScheme::fp8_per_tensor());
  std::vector<float> wrong(63);
  EXPECT_THROW(dequantize(q, wrong), moekit::Error);
}

}  // namespace
}  // namespace moekit::quant
