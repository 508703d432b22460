// Closed-form tests of the helpers that the CPU emulation experts AND the tests' own float64
// references both call: quant::quantize / quantize_with_scales / dequantize (quant/quantize.h),
// quantize_moe_input / dequantize_moe_input / quant_dequant_rows (quant/moe_input_quant.h) and
// dequantize_expert_weight (experts/cpu_emulation.h). A bug in one of them would cancel out in
// emulation-vs-reference comparisons, so each is checked here against values worked out by hand:
// inputs on the format's grid with power-of-two scales (exact results), hand-rounded values off the
// grid, saturation, zero points and NaN. Expected codes and values are literals, never computed by
// the code under test.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "moekit/core/error.h"
#include "moekit/experts/cpu_emulation.h"
#include "moekit/quant/formats.h"
#include "moekit/quant/moe_input_quant.h"
#include "moekit/quant/quantize.h"
#include "testing.h"

namespace moekit {
namespace {

using quant::QuantizedTensor;
using quant::QuantScheme;
using testing::contains_all;
using testing::error_of;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

Tensor f32_tensor(const std::vector<float>& v, const Shape& shape) {
  return Tensor::from_floats(v, shape, DType::kF32);
}

Tensor byte_tensor(const std::vector<uint8_t>& bytes, const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  EXPECT_EQ(t.nbytes(), bytes.size());
  if (!bytes.empty()) std::memcpy(t.data(), bytes.data(), bytes.size());
  return t;
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const auto* p = t.data_as<const uint8_t>();
  return {p, p + t.nbytes()};
}

QuantDesc desc(QuantDType dtype, GroupShape shape) {
  QuantDesc d;
  d.dtype = dtype;
  d.shape = shape;
  return d;
}

// A [rows, cols] row-major matrix with value(r, c) at (r, c).
template <typename F>
std::vector<float> matrix(int64_t rows, int64_t cols, F value) {
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c)
      x[static_cast<size_t>(r * cols + c)] = value(r, c);
  }
  return x;
}

// quant_dequant_rows on a copy.
std::vector<float> qdq(std::vector<float> v, int64_t rows, const QuantDesc& d,
                       std::optional<float> g = std::nullopt) {
  const auto cols = static_cast<int64_t>(v.size()) / rows;
  quant_dequant_rows(v, rows, cols, d, g);
  return v;
}

// ---- quant::quantize: the scale granularities ---------------------------------------------------

TEST(QuantClosedForm, Fp8PerTokenPowerOfTwoScales) {
  // Row r has amax 448 * 2^-r, so its scale is exactly 2^-r and every value below is k * 2^-r
  // with k on the e4m3 grid: codes are the codes of k, dequantization is exact.
  const std::vector<float> k = {448.0f, -224.0f, 1.0f, 0.0f, -0.015625f, 3.25f};
  const std::vector<uint8_t> k_codes = {0x7e, 0xf6, 0x38, 0x00, 0x88, 0x45};
  std::vector<float> x;
  for (int r = 0; r < 3; ++r) {
    for (float v : k)
      x.push_back(std::ldexp(v, -r));
  }
  const QuantizedTensor q = quant::quantize(x, 3, 6, QuantScheme::fp8_per_token());
  EXPECT_EQ(q.scales, (std::vector<float>{1.0f, 0.5f, 0.25f}));
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 6; ++c)
      EXPECT_EQ(q.code_at(r, c), k_codes[static_cast<size_t>(c)]) << r << ", " << c;
  }
  EXPECT_EQ(quant::dequantize(q), x);
}

TEST(QuantClosedForm, Fp8OneBy128GroupsWithAPartialGroup) {
  // 2 rows x 300 cols: groups [0,128), [128,256), [256,300). Group (r, j) has amax 448 * 2^(j-r):
  // scale 2^(j-r). The other elements are 1.5 * scale (code 0x3c), one 0 and one -0.25 * scale.
  const int64_t rows = 2, cols = 300;
  const std::vector<float> x = matrix(rows, cols, [](int64_t r, int64_t c) {
    const float s = std::ldexp(1.0f, static_cast<int>(c / 128 - r));
    const int64_t within = c % 128;
    return within == 0 ? 448.0f * s : within == 1 ? 0.0f : within == 2 ? -0.25f * s : 1.5f * s;
  });
  const QuantizedTensor q = quant::quantize(x, rows, cols, QuantScheme::fp8_per_token_group(128));
  ASSERT_EQ(q.scale_rows, 2);
  ASSERT_EQ(q.scale_cols, 3);
  EXPECT_EQ(q.scales, (std::vector<float>{1.0f, 2.0f, 4.0f, 0.5f, 1.0f, 2.0f}));
  EXPECT_EQ(q.code_at(0, 256), 0x7e);
  EXPECT_EQ(q.code_at(1, 258), 0xa8);  // -0.25
  EXPECT_EQ(q.code_at(1, 299), 0x3c);  // 1.5
  EXPECT_EQ(quant::dequantize(q), x);
}

TEST(QuantClosedForm, Fp8128x128BlocksF32AndUe8m0) {
  // 130 x 260: blocks [2, 3], the last row and column blocks partial. Block (i, j) holds one
  // 448 * 2^(i+j) and otherwise -3 * 2^(i+j): f32 scale 2^(i+j).
  const int64_t rows = 130, cols = 260;
  const std::vector<float> x = matrix(rows, cols, [](int64_t r, int64_t c) {
    const float s = std::ldexp(1.0f, static_cast<int>(r / 128 + c / 128));
    return (r % 128 == 1 && c % 128 == 2 ? 448.0f : -3.0f) * s;
  });
  const QuantizedTensor q = quant::quantize(x, rows, cols, QuantScheme::fp8_block());
  ASSERT_EQ(q.scale_rows, 2);
  ASSERT_EQ(q.scale_cols, 3);
  EXPECT_EQ(q.scales, (std::vector<float>{1.0f, 2.0f, 4.0f, 2.0f, 4.0f, 8.0f}));
  EXPECT_EQ(q.code_at(129, 259), 0xc4);  // -3
  EXPECT_EQ(quant::dequantize(q), x);

  // UE8M0 (DeepGEMM) scales round up to a power of two: amax 300 -> 2^0 (448 >= 300), amax 500
  // -> 2^1 (896 >= 500). 500 / 2 = 250 rounds to the e4m3 value 256 (grid 240, 256): 512 back.
  std::vector<float> y(2 * 128, 1.0f);
  y[0] = 300.0f;
  y[128] = 500.0f;
  const QuantizedTensor qe =
      quant::quantize(y, 1, 256, QuantScheme::fp8_block(128, 128, ScaleDType::kUE8M0));
  EXPECT_EQ(qe.scale_codes, (std::vector<uint8_t>{127, 128}));
  const std::vector<float> back = quant::dequantize(qe);
  EXPECT_EQ(back[0], 288.0f);  // 300 on the e4m3 grid (288, 320): nearer 288
  EXPECT_EQ(back[128], 512.0f);
  EXPECT_EQ(back[1], 1.0f);
  EXPECT_EQ(back[129], 1.0f);
}

TEST(QuantClosedForm, Mx32ScalesOfEveryElementType) {
  // OCP floor rule: e = floor(log2 amax) - emax_elem.
  struct Case {
    QuantScheme scheme;
    float amax;
    uint8_t scale_code;
    float x;         // a second element
    float expected;  // its dequantized value
  };
  const std::vector<Case> cases = {
      // fp6 e3m2 (emax 4): amax 20 -> e = 0; 0.3 -> 0.3125 (grid 0.25, 0.3125).
      {QuantScheme::mxfp6_e3m2(), 20.0f, 127, 0.3f, 0.3125f},
      // fp6 e2m3 (emax 2): amax 7 -> e = 0; 7 is on the grid; 0.3 -> 0.25 (grid step 0.125).
      {QuantScheme::mxfp6_e2m3(), 7.0f, 127, 0.3f, 0.25f},
      // fp8 e4m3 (emax 8): amax 1792 -> e = 10 - 8 = 2; 102 / 4 = 25.5 -> 26 (grid 24, 26) -> 104.
      {QuantScheme::mxfp8(), 1792.0f, 129, 102.0f, 104.0f},
      // fp4 (emax 2): amax 0.75 -> e = -1 - 2 = -3; 0.75 * 8 = 6 exact; 0.1 * 8 = 0.8 -> 1 ->
      // 0.125.
      {QuantScheme::mxfp4(), 0.75f, 124, 0.1f, 0.125f},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.scheme.to_string());
    std::vector<float> x(32, 0.0f);
    x[0] = c.amax;
    x[1] = c.x;
    x[2] = -c.amax;
    const QuantizedTensor q = quant::quantize(x, 1, 32, c.scheme);
    ASSERT_EQ(q.scale_codes, std::vector<uint8_t>{c.scale_code});
    const std::vector<float> back = quant::dequantize(q);
    EXPECT_EQ(back[0], c.amax);
    EXPECT_EQ(back[1], c.expected);
    EXPECT_EQ(back[2], -c.amax);
    EXPECT_EQ(back[3], 0.0f);
  }
}

TEST(QuantClosedForm, Nvfp4WithAGivenGlobalScale) {
  // g = 224. Block 0 amax 12: sf = ue4m3(12 / 6 * 224) = 448, y = x * 224 / 448 = x / 2.
  // Block 1 amax 3: sf = 112, y = 2x. Both on the fp4 grid: exact.
  std::vector<float> x(32, 0.0f);
  x[0] = 12.0f;
  x[1] = -1.0f;  // -0.5 after scaling
  x[16] = 3.0f;
  x[17] = 0.75f;  // 1.5 after scaling
  const float g = 224.0f;
  const QuantizedTensor q =
      quant::quantize_with_scales(x, 1, 32, QuantScheme::nvfp4(), std::span(&g, 1));
  EXPECT_EQ(q.global_scale, 224.0f);
  EXPECT_EQ(q.scale_codes, (std::vector<uint8_t>{0x7e, 0x6e}));  // 448, 112
  EXPECT_EQ(q.code_at(0, 0), 0x7);                               // 6
  EXPECT_EQ(q.code_at(0, 1), 0x9);                               // -0.5
  EXPECT_EQ(quant::dequantize(q), x);
  // A global scale too large for the block: sf saturates at 448, y = 12 * 2688 / 448 = 72
  // saturates at 6: 6 * 448 / 2688 = 1 comes back.
  const float big = 2688.0f;
  const QuantizedTensor qs =
      quant::quantize_with_scales(x, 1, 32, QuantScheme::nvfp4(), std::span(&big, 1));
  EXPECT_EQ(qs.scale_codes[0], 0x7e);
  EXPECT_EQ(quant::dequantize(qs)[0], 1.0f);
}

TEST(QuantClosedForm, IntGroupsWithAndWithoutZeroPoints) {
  // int8 symmetric groups of 32, each holding k / 8 for integers k with max |k| = 127: the scale
  // is exactly (127 / 8) / 127 = 1/8 and the codes are k.
  std::vector<float> x(64);
  for (int i = 0; i < 32; ++i) {
    x[static_cast<size_t>(i)] = static_cast<float>(i * 4 - 62) / 8.0f;  // -62/8 .. 62/8
    x[static_cast<size_t>(32 + i)] = static_cast<float>(127 - i) / 8.0f;
  }
  x[0] = -127.0f / 8.0f;
  const QuantizedTensor q8 =
      quant::quantize(x, 1, 64, QuantScheme::int_weight_groups(QuantDType::kInt8, 32));
  EXPECT_EQ(q8.scales, (std::vector<float>{0.125f, 0.125f}));
  EXPECT_EQ(static_cast<int8_t>(q8.code_at(0, 0)), -127);
  EXPECT_EQ(static_cast<int8_t>(q8.code_at(0, 1)), -58);
  EXPECT_EQ(static_cast<int8_t>(q8.code_at(0, 63)), 96);
  EXPECT_EQ(quant::dequantize(q8), x);

  // int4 asymmetric, group 8: lo = -1.5, hi = 6 -> scale 7.5 / 15 = 0.5, zero point 3.
  // q = clamp(rne(x / s) + zp): 0.25 / 0.5 = 0.5 rounds to 0 (even) -> code 3 -> 0; 0.75 -> 1.5
  // -> 2 -> code 5 -> 1.0; 1.25 -> 2.5 -> 2 -> 1.0. (Rounding after adding the odd zero point
  // would give 4, 4 and 6 instead.)
  const std::vector<float> a = {-1.5f, 6.0f, 0.25f, 0.75f, 1.25f, 0.0f, -1.0f, 5.5f};
  const QuantizedTensor q4 =
      quant::quantize(a, 1, 8, QuantScheme::int_weight_groups(QuantDType::kInt4, 8, false));
  EXPECT_EQ(q4.scales, std::vector<float>{0.5f});
  EXPECT_EQ(q4.zero_points, std::vector<uint8_t>{3});
  const std::vector<uint8_t> codes = {0, 15, 3, 5, 5, 3, 1, 14};
  for (int i = 0; i < 8; ++i)
    EXPECT_EQ(q4.code_at(0, i), codes[static_cast<size_t>(i)]) << i;
  EXPECT_EQ(quant::dequantize(q4),
            (std::vector<float>{-1.5f, 6.0f, 0.0f, 1.0f, 1.0f, 0.0f, -1.0f, 5.5f}));

  // int8 asymmetric (uint8 + zero point), per row: lo = -2, hi = 253 -> scale 1, zero point 2.
  std::vector<float> u(256);
  for (int i = 0; i < 256; ++i)
    u[static_cast<size_t>(i)] = static_cast<float>(i - 2);
  const QuantizedTensor qu = quant::quantize(u, 1, 256, QuantScheme::int8_per_token(false));
  EXPECT_EQ(qu.scales, std::vector<float>{1.0f});
  EXPECT_EQ(qu.zero_points, std::vector<uint8_t>{2});
  EXPECT_EQ(qu.code_at(0, 0), 0);
  EXPECT_EQ(qu.code_at(0, 255), 255);
  EXPECT_EQ(quant::dequantize(qu), u);
}

TEST(QuantClosedForm, StaticScalesSaturate) {
  // Per-token static fp8 scales (1, 0.5): 1000 saturates at 448 * scale, -1000 at -448 * scale.
  const std::vector<float> x = {1000.0f, -1000.0f, 2.0f, 1000.0f, -1000.0f, 2.0f};
  const std::vector<float> s = {1.0f, 0.5f};
  const QuantizedTensor q = quant::quantize_with_scales(x, 2, 3, QuantScheme::fp8_per_token(), s);
  EXPECT_EQ(quant::dequantize(q),
            (std::vector<float>{448.0f, -448.0f, 2.0f, 224.0f, -224.0f, 2.0f}));
  // int8 per tensor, scale 0.5: 100 -> 200 -> 127 (63.5), -100 -> -128 (two's complement floor).
  const float half = 0.5f;
  const QuantizedTensor qi =
      quant::quantize_with_scales(std::vector<float>{100.0f, -100.0f, 1.25f}, 1, 3,
                                  QuantScheme::int8_per_tensor(), std::span(&half, 1));
  EXPECT_EQ(quant::dequantize(qi), (std::vector<float>{63.5f, -64.0f, 1.0f}));  // 2.5 -> 2 (even)
}

TEST(QuantClosedForm, NaNIsIgnoredByScalesAndEncodesAsDocumented) {
  // quantize.h: NaN is ignored by amax and encodes as the element's NaN (fp8), +max (fp4, fp6)
  // or 0 (int).
  const std::vector<float> x = {kNaN, 2.0f, -448.0f, 1.0f};
  const QuantizedTensor f8 = quant::quantize(x, 1, 4, QuantScheme::fp8_per_tensor());
  EXPECT_EQ(f8.scales, std::vector<float>{1.0f});
  EXPECT_EQ(f8.code_at(0, 0), 0x7f);
  const std::vector<float> f8_back = quant::dequantize(f8);
  EXPECT_TRUE(std::isnan(f8_back[0]));
  EXPECT_EQ(f8_back[1], 2.0f);

  std::vector<float> mx(32, 0.0f);
  mx[0] = kNaN;
  mx[1] = 3.0f;  // amax 3 -> e = 1 - 2 = -1: NaN becomes +6 * 0.5 = 3
  const QuantizedTensor q4 = quant::quantize(mx, 1, 32, QuantScheme::mxfp4());
  EXPECT_EQ(q4.scale_codes, std::vector<uint8_t>{126});
  EXPECT_EQ(quant::dequantize(q4)[0], 3.0f);
  const QuantizedTensor q6 = quant::quantize(mx, 1, 32, QuantScheme::mxfp6_e2m3());
  EXPECT_EQ(quant::dequantize(q6)[0], 3.75f);  // +7.5 * 2^-1

  // Integers: the NaN element decodes to exactly 0 and the others keep the scale of the finite
  // values, symmetric or with a zero point.
  const std::vector<float> xi = {kNaN, 7.0f, -7.0f, 3.0f};
  for (const QuantScheme& s : {QuantScheme::int8_per_token(), QuantScheme::int8_per_token(false),
                               QuantScheme::int_weight_groups(QuantDType::kInt4, -1),
                               QuantScheme::int_weight_groups(QuantDType::kInt4, -1, false)}) {
    SCOPED_TRACE(s.to_string());
    const std::vector<float> back = quant::dequantize(quant::quantize(xi, 1, 4, s));
    EXPECT_EQ(back[0], 0.0f);
    EXPECT_TRUE(std::isfinite(back[1]));
    EXPECT_NEAR(back[1], 7.0f, 0.5f);
  }
}

// ---- MoE activation quantization (a1 / a2)
// -------------------------------------------------------

TEST(QuantClosedForm, MoeInputFp8StaticPerTensor) {
  QuantDesc d = desc(QuantDType::kFp8E4M3, GroupShape::per_tensor());
  d.scale = f32_tensor({0.5f}, {1});
  // x / 0.5 = {2, -6, 2000 -> 448, 0.6 -> 0.625 (grid 0.5625, 0.625)}.
  const std::vector<float> x = {1.0f, -3.0f, 1000.0f, 0.3f};
  const QuantizedInput q = quantize_moe_input(f32_tensor(x, {1, 4}), d, RunContext{});
  EXPECT_EQ(q.data.dtype(), DType::kFp8E4M3);
  EXPECT_EQ(bytes_of(q.data), (std::vector<uint8_t>{0x40, 0xcc, 0x7e, 0x32}));
  EXPECT_EQ(q.scale.to_float_vector(), std::vector<float>{0.5f});
  const std::vector<float> expected = {1.0f, -3.0f, 224.0f, 0.3125f};
  EXPECT_EQ(dequantize_moe_input(q, d, 4), expected);
  EXPECT_EQ(qdq(x, 1, d), expected);
}

TEST(QuantClosedForm, MoeInputFp8DynamicPerTokenAndGroups) {
  // Row 0 amax 448 (scale 1), row 1 amax 3.5 = 448 * 2^-7 (scale 2^-7): every value on the grid.
  const std::vector<float> x = {448.0f, 1.0f, -2.0f, 0.0f, 3.5f, -1.75f, 0.0f, 0.4375f};
  const QuantDesc tok = desc(QuantDType::kFp8E4M3, GroupShape::per_token());
  const QuantizedInput q = quantize_moe_input(f32_tensor(x, {2, 4}), tok, RunContext{});
  EXPECT_EQ(q.scale.shape(), (Shape{2, 1}));
  EXPECT_EQ(q.scale.to_float_vector(), (std::vector<float>{1.0f, 0.0078125f}));
  EXPECT_EQ(bytes_of(q.data), (std::vector<uint8_t>{0x7e, 0x38, 0xc0, 0x00, 0x7e, 0xf6, 0x00,
                                                    0x66}));  // 448 1 -2 0 | 448 -224 0 56
  EXPECT_EQ(dequantize_moe_input(q, tok, 4), x);
  EXPECT_EQ(qdq(x, 2, tok), x);

  // (1, 2) groups of fp8 with f32 scales amax / 448: group amaxes 448, 2, 3.5 and 0.4375.
  const QuantDesc grp = desc(QuantDType::kFp8E4M3, GroupShape{1, 2});
  const QuantizedInput qg = quantize_moe_input(f32_tensor(x, {2, 4}), grp, RunContext{});
  EXPECT_EQ(qg.scale.shape(), (Shape{2, 2}));
  EXPECT_EQ(qg.scale.to_float_vector(),
            (std::vector<float>{1.0f, 2.0f / 448.0f, 3.5f / 448.0f, 0.4375f / 448.0f}));
  EXPECT_EQ(qg.data.to_float_vector()[0], 448.0f);
  EXPECT_EQ(bytes_of(qg.data)[2], 0xfe);  // -2 at scale 2/448 -> -448
}

TEST(QuantClosedForm, MoeInputMxfp8AndMxfp4AndMxfp6) {
  // fp8 with (1, 32) groups means MXFP8 (e8m0 scales): amax 1792 -> 2^2.
  std::vector<float> x(32, 0.0f);
  x[0] = 1792.0f;
  x[1] = 102.0f;  // 25.5 -> 26 -> 104
  const QuantDesc mx8 = desc(QuantDType::kFp8E4M3, GroupShape{1, 32});
  const QuantizedInput q8 = quantize_moe_input(f32_tensor(x, {1, 32}), mx8, RunContext{});
  EXPECT_EQ(q8.scale.dtype(), DType::kUE8M0);
  EXPECT_EQ(bytes_of(q8.scale), std::vector<uint8_t>{129});
  EXPECT_EQ(qdq(x, 1, mx8)[1], 104.0f);

  // MXFP4: amax 12 -> 2^1; 0.75 -> 0.375 -> 0.5 -> 1.0; 5 -> 2.5 -> 2 (even) -> 4.
  std::vector<float> y(32, 0.0f);
  y[0] = 12.0f;
  y[1] = -8.0f;
  y[2] = 0.75f;
  y[3] = 5.0f;
  const QuantDesc mx4 = desc(QuantDType::kFp4E2M1, GroupShape{1, 32});
  const QuantizedInput q4 = quantize_moe_input(f32_tensor(y, {1, 32}), mx4, RunContext{});
  EXPECT_EQ(q4.data.dtype(), DType::kFp4E2M1x2);
  EXPECT_EQ(q4.data.shape(), (Shape{1, 16}));
  EXPECT_EQ(bytes_of(q4.scale), std::vector<uint8_t>{128});
  EXPECT_EQ(bytes_of(q4.data)[0], 0xe7);  // 6 (low nibble), -4 (high nibble)
  std::vector<float> expected(32, 0.0f);
  expected[0] = 12.0f;
  expected[1] = -8.0f;
  expected[2] = 1.0f;
  expected[3] = 4.0f;
  EXPECT_EQ(dequantize_moe_input(q4, mx4, 32), expected);
  EXPECT_EQ(qdq(y, 1, mx4), expected);

  // MXFP6 e3m2: amax 20 -> 2^0; 0.3 -> 0.3125.
  std::vector<float> z(32, 0.0f);
  z[0] = 20.0f;
  z[1] = 0.3f;
  const QuantDesc mx6 = desc(QuantDType::kFp6E3M2, GroupShape{1, 32});
  const std::vector<float> back = qdq(z, 1, mx6);
  EXPECT_EQ(back[0], 20.0f);
  EXPECT_EQ(back[1], 0.3125f);
}

TEST(QuantClosedForm, MoeInputNvfp4GlobalScaleFromTheDescOrTheOverride) {
  std::vector<float> x(32, 0.0f);
  x[0] = 12.0f;
  x[1] = -1.0f;
  x[16] = 3.0f;
  x[17] = 0.75f;
  QuantDesc d = desc(QuantDType::kFp4E2M1, GroupShape{1, 16});
  d.alpha_or_gscale = f32_tensor({224.0f}, {1});
  const QuantizedInput q = quantize_moe_input(f32_tensor(x, {1, 32}), d, RunContext{});
  EXPECT_EQ(q.scale.dtype(), DType::kUE4M3);
  EXPECT_EQ(bytes_of(q.scale), (std::vector<uint8_t>{0x7e, 0x6e}));
  EXPECT_EQ(dequantize_moe_input(q, d, 32), x);
  EXPECT_EQ(qdq(x, 1, d), x);
  // The per-expert override replaces the desc's global scale: 2688 saturates block 0 (12 -> 1).
  EXPECT_EQ(qdq(x, 1, d, 2688.0f)[0], 1.0f);
}

TEST(QuantClosedForm, MoeInputInt8StaticAndPerToken) {
  QuantDesc st = desc(QuantDType::kInt8, GroupShape::per_tensor());
  st.scale = f32_tensor({0.5f}, {1});
  // 1 / 0.5 = 2; -1.25 / 0.5 = -2.5 -> -2 (even); 100 -> 200 -> 127.
  EXPECT_EQ(qdq({1.0f, -1.25f, 100.0f, 0.0f}, 1, st),
            (std::vector<float>{1.0f, -1.0f, 63.5f, 0.0f}));
  const QuantDesc tok = desc(QuantDType::kInt8, GroupShape::per_token());
  // amax 127 -> scale 1: -63.5 -> -64 (even), 0.25 -> 0.
  const QuantizedInput q =
      quantize_moe_input(f32_tensor({127.0f, -63.5f, 0.25f, 0.0f}, {1, 4}), tok, RunContext{});
  EXPECT_EQ(q.data.dtype(), DType::kInt8);
  EXPECT_EQ(bytes_of(q.data), (std::vector<uint8_t>{0x7f, 0xc0, 0x00, 0x00}));
  EXPECT_EQ(dequantize_moe_input(q, tok, 4), (std::vector<float>{127.0f, -64.0f, 0.0f, 0.0f}));
}

TEST(QuantClosedForm, MoeInputUnquantizedAndBadScales) {
  const std::vector<float> x = {1.0f, kNaN, 3.0f};
  const std::vector<float> same = qdq(x, 1, QuantDesc{});
  EXPECT_EQ(same[0], 1.0f);
  EXPECT_TRUE(std::isnan(same[1]));
  std::vector<float> none;
  quant_dequant_rows(none, 0, 5, desc(QuantDType::kFp8E4M3, GroupShape::per_token()));

  QuantDesc two = desc(QuantDType::kFp8E4M3, GroupShape::per_tensor());
  two.scale = f32_tensor({1.0f, 2.0f}, {2});
  EXPECT_TRUE(contains_all(error_of([&] { qdq({1.0f}, 1, two); }), {"must hold one value"}));
  for (float bad : {0.0f, -1.0f, kNaN, std::numeric_limits<float>::infinity()}) {
    QuantDesc d = desc(QuantDType::kFp8E4M3, GroupShape::per_tensor());
    d.scale = f32_tensor({bad}, {1});
    EXPECT_TRUE(contains_all(error_of([&] { qdq({1.0f}, 1, d); }), {"finite and > 0"})) << bad;
    QuantDesc nv = desc(QuantDType::kFp4E2M1, GroupShape{1, 16});
    nv.alpha_or_gscale = f32_tensor({bad}, {1});
    EXPECT_TRUE(contains_all(error_of([&] { qdq(std::vector<float>(16, 1.0f), 1, nv); }),
                             {"global scale", "finite and > 0"}))
        << bad;
  }
  const QuantDesc no_global = desc(QuantDType::kFp4E2M1, GroupShape{1, 16});
  EXPECT_TRUE(contains_all(error_of([&] { qdq(std::vector<float>(16, 1.0f), 1, no_global); }),
                           {"NVFP4", "global scale"}));
}

// ---- expert weights -----------------------------------------------------------------------------

TEST(QuantClosedForm, ExpertWeightFp8PerChannelAndBlocks) {
  // Two experts of (2, 4) e4m3 codes {1, 2, -0.5, 448}; per-channel scales (E, 2, 1).
  const std::vector<uint8_t> row = {0x38, 0x40, 0xb0, 0x7e};
  std::vector<uint8_t> codes;
  for (int i = 0; i < 4; ++i)
    codes.insert(codes.end(), row.begin(), row.end());
  const Tensor w = byte_tensor(codes, {2, 2, 4}, DType::kFp8E4M3);
  QuantDesc d = desc(QuantDType::kFp8E4M3, GroupShape::per_channel());
  d.scale = f32_tensor({1.0f, 2.0f, 0.5f, 4.0f}, {2, 2, 1});
  EXPECT_EQ(dequantize_expert_weight(w, d, QuantDesc{}, 1, 4),
            (std::vector<float>{0.5f, 1.0f, -0.25f, 224.0f, 4.0f, 8.0f, -2.0f, 1792.0f}));
  // Per tensor: one scale per expert.
  QuantDesc t = desc(QuantDType::kFp8E4M3, GroupShape::per_tensor());
  t.scale = f32_tensor({2.0f, 0.25f}, {2});
  EXPECT_EQ(dequantize_expert_weight(w, t, QuantDesc{}, 0, 4)[3], 896.0f);
  // (1, 2) blocks, scales (E, 2, 2).
  QuantDesc b = desc(QuantDType::kFp8E4M3, GroupShape{1, 2});
  b.scale = f32_tensor({1.0f, 2.0f, 4.0f, 8.0f, 1.0f, 1.0f, 1.0f, 1.0f}, {2, 2, 2});
  EXPECT_EQ(dequantize_expert_weight(w, b, QuantDesc{}, 0, 4),
            (std::vector<float>{1.0f, 2.0f, -1.0f, 896.0f, 4.0f, 8.0f, -4.0f, 3584.0f}));
}

TEST(QuantClosedForm, ExpertWeightInt4GroupsWithZeroPointsPackedOrNot) {
  // One expert, one row of 4, groups of 2: scales {0.5, 2}, zero points {8, 3}.
  // Codes {8, 10, 3, 0} -> (q - zp) * s = {0, 1, 0, -6}.
  QuantDesc d = desc(QuantDType::kInt4, GroupShape{1, 2});
  d.scale = f32_tensor({0.5f, 2.0f}, {1, 1, 2});
  d.zp = byte_tensor({8, 3}, {1, 1, 2}, DType::kUInt8);
  const std::vector<float> expected = {0.0f, 1.0f, 0.0f, -6.0f};
  const Tensor packed = byte_tensor({0xa8, 0x03}, {1, 1, 2}, DType::kUInt8);  // low nibble first
  EXPECT_EQ(dequantize_expert_weight(packed, d, QuantDesc{}, 0, 4), expected);
  const Tensor unpacked = byte_tensor({8, 10, 3, 0}, {1, 1, 4}, DType::kUInt8);
  EXPECT_EQ(dequantize_expert_weight(unpacked, d, QuantDesc{}, 0, 4), expected);
  // Symmetric int4 (uint4b8) per channel, and int8 per channel (two's complement).
  QuantDesc s4 = desc(QuantDType::kInt4, GroupShape::per_channel());
  s4.scale = f32_tensor({0.25f}, {1, 1, 1});
  EXPECT_EQ(dequantize_expert_weight(packed, s4, QuantDesc{}, 0, 4),
            (std::vector<float>{0.0f, 0.5f, -1.25f, -2.0f}));
  QuantDesc s8 = desc(QuantDType::kInt8, GroupShape::per_channel());
  s8.scale = f32_tensor({0.5f}, {1, 1, 1});
  const Tensor w8 = byte_tensor({0x7f, 0x80, 0xff, 0x02}, {1, 1, 4}, DType::kInt8);
  EXPECT_EQ(dequantize_expert_weight(w8, s8, QuantDesc{}, 0, 4),
            (std::vector<float>{63.5f, -64.0f, -0.5f, 1.0f}));
}

TEST(QuantClosedForm, ExpertWeightMxfp4AndNvfp4) {
  // MXFP4: one row of 32, e8m0 scale 2^-1; codes 0x7 (6) and 0xc (-2) in byte 0.
  std::vector<uint8_t> codes(16, 0);
  codes[0] = 0xc7;
  const Tensor w = byte_tensor(codes, {1, 1, 16}, DType::kFp4E2M1x2);
  QuantDesc mx = desc(QuantDType::kFp4E2M1, GroupShape{1, 32});
  mx.scale = byte_tensor({126}, {1, 1, 1}, DType::kUE8M0);
  const std::vector<float> m = dequantize_expert_weight(w, mx, QuantDesc{}, 0, 32);
  EXPECT_EQ(m[0], 3.0f);
  EXPECT_EQ(m[1], -1.0f);
  EXPECT_EQ(m[2], 0.0f);

  // NVFP4: block scales ue4m3 {4, 0.5}; weight_scale_2 = g-alpha 0.25 * activation global 2 = 0.5:
  // value = fp4 * sf * 0.5.
  QuantDesc nv = desc(QuantDType::kFp4E2M1, GroupShape{1, 16});
  nv.scale = byte_tensor({0x48, 0x30}, {1, 1, 2}, DType::kUE4M3);
  nv.alpha_or_gscale = f32_tensor({0.25f}, {1});
  QuantDesc act = desc(QuantDType::kFp4E2M1, GroupShape{1, 16});
  act.alpha_or_gscale = f32_tensor({2.0f}, {1});
  std::vector<uint8_t> nc(16, 0);
  nc[0] = 0xc7;  // 6, -2
  nc[8] = 0x07;  // element 16: 6
  const Tensor wn = byte_tensor(nc, {1, 1, 16}, DType::kFp4E2M1x2);
  const std::vector<float> n = dequantize_expert_weight(wn, nv, act, 0, 32);
  EXPECT_EQ(n[0], 12.0f);  // 6 * 4 * 0.5
  EXPECT_EQ(n[1], -4.0f);  // -2 * 4 * 0.5
  EXPECT_EQ(n[16], 1.5f);  // 6 * 0.5 * 0.5
  // Weight-only NVFP4 (no activation quantization): weight_scale_2 = the g-alpha alone.
  EXPECT_EQ(dequantize_expert_weight(wn, nv, QuantDesc{}, 0, 32)[0], 6.0f);
}

}  // namespace
}  // namespace moekit
