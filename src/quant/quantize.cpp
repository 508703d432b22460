#include "moekit/quant/quantize.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include <fmt/format.h>

#include "moekit/core/error.h"

namespace moekit::quant {
namespace {

// Where each block of the scale grid lies in the data.
struct Grid {
  int64_t block_rows;  // rows per block (the last block may be shorter)
  int64_t block_cols;
  int64_t scale_rows;
  int64_t scale_cols;
};

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

Grid make_grid(const BlockShape& block, int64_t rows, int64_t cols) {
  Grid g{};
  g.block_rows = block.rows < 0 ? std::max<int64_t>(rows, 1) : block.rows;
  g.block_cols = block.cols < 0 ? std::max<int64_t>(cols, 1) : block.cols;
  g.scale_rows = block.rows < 0 ? 1 : ceil_div(rows, block.rows);
  g.scale_cols = block.cols < 0 ? 1 : ceil_div(cols, block.cols);
  return g;
}

// The float format of a floating-point element type.
std::optional<Format> float_format(QuantDType dtype) {
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

bool is_int(QuantDType dtype) {
  return dtype == QuantDType::kInt8 || dtype == QuantDType::kInt4;
}

// Round half to even, then clamp to [lo, hi].
int round_clamp(float y, int lo, int hi) {
  const float c = std::clamp(y, static_cast<float>(lo) - 1.0f, static_cast<float>(hi) + 1.0f);
  const float whole = std::floor(c);
  const float frac = c - whole;
  float r = whole;
  if (frac > 0.5f || (frac == 0.5f && std::fmod(whole, 2.0f) != 0.0f)) r += 1.0f;
  return std::clamp(static_cast<int>(r), lo, hi);
}

// The unbiased e8m0 exponent of a block with max |x| = amax (see the header).
int e8m0_block_exponent(float amax, float qmax, int emax_elem, E8M0Rounding rounding) {
  if (!(amax > 0.0f)) return -127;
  int e;
  if (rounding == E8M0Rounding::kFloor) {
    e = std::ilogb(amax) - emax_elem;
  } else {
    e = std::ilogb(amax) - std::ilogb(qmax);
    while (e < 127 && std::ldexp(qmax, e) < amax)
      ++e;
    while (e > -127 && std::ldexp(qmax, e - 1) >= amax)
      --e;
  }
  return std::clamp(e, -127, 127);
}

// Per-block quantization parameters: y = x * mul / div, then encode; zp for asymmetric ints.
struct BlockParams {
  float divisor = 1.0f;  // fp32 and asymmetric scales: y = x / divisor
  int exponent = 0;      // e8m0: y = x * 2^-exponent
  float multiplier = 1;  // ue4m3: y = x * multiplier (0 => all codes 0)
  int zero_point = 0;
};

class Quantizer {
 public:
  explicit Quantizer(const QuantScheme& scheme) : s_(scheme), format_(float_format(scheme.dtype)) {}

  uint8_t encode(float y, int zero_point) const {
    if (format_) return quant::encode(*format_, y);
    // NOTE: integer codes of NaN are the code of 0 (the header's rule); the float->int cast in
    // round_clamp is undefined for NaN.
    if (std::isnan(y)) y = 0.0f;
    if (!s_.symmetric) {
      // q = clamp(rne(x / s) + zp, 0, qmax): round first, as PyTorch's fake-quantize does, so an
      // odd zero point does not flip ties (rne(y + zp) != rne(y) + zp at halves).
      const int qmax = s_.dtype == QuantDType::kInt8 ? 255 : 15;
      return static_cast<uint8_t>(
          std::clamp(round_clamp(y, -qmax - 1, qmax + 1) + zero_point, 0, qmax));
    }
    if (s_.dtype == QuantDType::kInt8) return static_cast<uint8_t>(encode_int8(y));
    return static_cast<uint8_t>(round_clamp(y, -8, 7) + 8);  // uint4b8
  }

  float decode(uint8_t code, int zero_point) const {
    if (format_) return quant::decode(*format_, code);
    if (!s_.symmetric) return static_cast<float>(static_cast<int>(code) - zero_point);
    if (s_.dtype == QuantDType::kInt8) return static_cast<float>(static_cast<int8_t>(code));
    return static_cast<float>(static_cast<int>(code) - 8);
  }

 private:
  QuantScheme s_;
  std::optional<Format> format_;
};

void pack_row(QuantDType dtype, std::span<const uint8_t> codes, std::span<uint8_t> out) {
  switch (dtype) {
    case QuantDType::kFp4E2M1:
    case QuantDType::kInt4:
      pack_4bit(codes, out);
      break;
    case QuantDType::kFp6E3M2:
    case QuantDType::kFp6E2M3:
      pack_6bit(codes, out);
      break;
    default:
      std::copy(codes.begin(), codes.end(), out.begin());
      break;
  }
}

void unpack_row(QuantDType dtype, std::span<const uint8_t> packed, std::span<uint8_t> codes) {
  switch (dtype) {
    case QuantDType::kFp4E2M1:
    case QuantDType::kInt4:
      unpack_4bit(packed, codes);
      break;
    case QuantDType::kFp6E3M2:
    case QuantDType::kFp6E2M3:
      unpack_6bit(packed, codes);
      break;
    default:
      std::copy(packed.begin(), packed.end(), codes.begin());
      break;
  }
}

void check_problem(std::span<const float> data, int64_t rows, int64_t cols,
                   const QuantScheme& scheme) {
  MOEKIT_CHECK(rows >= 0 && cols >= 0, "quantize: rows={} cols={} must be >= 0", rows, cols);
  MOEKIT_CHECK(static_cast<int64_t>(data.size()) == rows * cols,
               "quantize: data has {} elements, expected rows*cols = {}*{} = {}", data.size(), rows,
               cols, rows * cols);
  const std::string reason = unsupported_reason(scheme);
  MOEKIT_CHECK(reason.empty(), "quantize: scheme {} unsupported: {}", scheme.to_string(), reason);
}

// The shared body of quantize() and quantize_with_scales(). given: fp32 scales (kF32) or the
// global scale (kUE4M3); nullopt derives them.
QuantizedTensor quantize_impl(std::span<const float> data, int64_t rows, int64_t cols,
                              const QuantScheme& scheme,
                              std::optional<std::span<const float>> given) {
  const Grid grid = make_grid(scheme.block, rows, cols);
  const Quantizer quantizer(scheme);
  const float qmax = element_qmax(scheme);
  const auto elem_format = float_format(scheme.dtype);
  const int emax_elem = elem_format ? format_info(*elem_format).emax : 0;

  QuantizedTensor q;
  q.scheme = scheme;
  q.rows = rows;
  q.cols = cols;
  q.scale_rows = grid.scale_rows;
  q.scale_cols = grid.scale_cols;
  const auto num_scales = static_cast<size_t>(grid.scale_rows * grid.scale_cols);
  if (scheme.scale_dtype == ScaleDType::kF32) {
    q.scales.resize(num_scales);
  } else {
    q.scale_codes.resize(num_scales);
  }
  if (!scheme.symmetric) q.zero_points.resize(num_scales);

  if (scheme.scale_dtype == ScaleDType::kUE4M3) {
    if (given) {
      q.global_scale = (*given)[0];
    } else {
      float amax = 0.0f;
      for (float x : data)
        amax = std::max(amax, std::fabs(x));
      q.global_scale = 448.0f * qmax / std::max(amax, kAmaxFloor);
    }
  }

  std::vector<uint8_t> codes(data.size());  // [rows, cols] unpacked
  for (int64_t bi = 0; bi < grid.scale_rows; ++bi) {
    for (int64_t bj = 0; bj < grid.scale_cols; ++bj) {
      const int64_t r0 = bi * grid.block_rows, r1 = std::min(rows, r0 + grid.block_rows);
      const int64_t c0 = bj * grid.block_cols, c1 = std::min(cols, c0 + grid.block_cols);
      float amax = 0.0f, lo = 0.0f, hi = 0.0f;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          const float x = data[static_cast<size_t>(r * cols + c)];
          amax = std::max(amax, std::fabs(x));
          lo = std::min(lo, x);
          hi = std::max(hi, x);
        }
      }

      const auto idx = static_cast<size_t>(bi * grid.scale_cols + bj);
      BlockParams p;
      switch (scheme.scale_dtype) {
        case ScaleDType::kF32:
          if (given) {
            p.divisor = (*given)[idx];
          } else if (scheme.symmetric) {
            p.divisor = std::max(amax, kAmaxFloor) / qmax;
          } else {
            p.divisor = std::max(hi - lo, kAmaxFloor) / qmax;
            p.zero_point = round_clamp(-lo / p.divisor, 0, static_cast<int>(qmax));
            q.zero_points[idx] = static_cast<uint8_t>(p.zero_point);
          }
          q.scales[idx] = p.divisor;
          break;
        case ScaleDType::kUE8M0:
          p.exponent = e8m0_block_exponent(amax, qmax, emax_elem, scheme.e8m0_rounding);
          q.scale_codes[idx] = static_cast<uint8_t>(p.exponent + 127);
          break;
        case ScaleDType::kUE4M3: {
          const uint8_t sf_code = encode_ue4m3(amax / qmax * q.global_scale);
          const float sf = decode_ue4m3(sf_code);
          q.scale_codes[idx] = sf_code;
          p.multiplier = sf > 0.0f ? q.global_scale / sf : 0.0f;
          break;
        }
        case ScaleDType::kActivation:
          break;  // rejected by unsupported_reason()
      }

      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          const auto i = static_cast<size_t>(r * cols + c);
          const float x = data[i];
          float y = x;
          switch (scheme.scale_dtype) {
            case ScaleDType::kF32:
              y = x / p.divisor;
              break;
            case ScaleDType::kUE8M0:
              y = std::ldexp(x, -p.exponent);
              break;
            case ScaleDType::kUE4M3:
              y = x * p.multiplier;
              break;
            case ScaleDType::kActivation:
              break;
          }
          codes[i] = quantizer.encode(y, p.zero_point);
        }
      }
    }
  }

  const int64_t row_bytes = code_row_bytes(scheme.dtype, cols);
  q.codes.resize(static_cast<size_t>(rows * row_bytes));
  const std::span<const uint8_t> all_codes(codes);
  for (int64_t r = 0; r < rows; ++r) {
    pack_row(scheme.dtype,
             all_codes.subspan(static_cast<size_t>(r * cols), static_cast<size_t>(cols)),
             std::span(q.codes).subspan(static_cast<size_t>(r * row_bytes),
                                        static_cast<size_t>(row_bytes)));
  }
  return q;
}

}  // namespace

// ---- QuantScheme --------------------------------------------------------------------------------

std::string QuantScheme::to_string() const {
  std::string s =
      fmt::format("{} {} block({},{}) {}", quant_dtype_name(dtype), scale_dtype_name(scale_dtype),
                  block.rows, block.cols, symmetric ? "sym" : "asym");
  if (scale_dtype == ScaleDType::kUE8M0) {
    s += e8m0_rounding == E8M0Rounding::kFloor ? " floor" : " ceil";
  }
  return s;
}

QuantScheme QuantScheme::fp8_per_tensor() {
  return {};
}

QuantScheme QuantScheme::fp8_per_token() {
  QuantScheme s;
  s.block = BlockShape::per_row();
  return s;
}

QuantScheme QuantScheme::fp8_per_channel() {
  return fp8_per_token();
}

QuantScheme QuantScheme::fp8_per_token_group(int64_t group) {
  QuantScheme s;
  s.block = BlockShape::row_groups(group);
  return s;
}

QuantScheme QuantScheme::fp8_block(int64_t block_rows, int64_t block_cols, ScaleDType scale_dtype) {
  QuantScheme s;
  s.block = BlockShape::blocks(block_rows, block_cols);
  s.scale_dtype = scale_dtype;
  s.e8m0_rounding = E8M0Rounding::kCeil;
  return s;
}

QuantScheme QuantScheme::mx(QuantDType dtype, E8M0Rounding rounding) {
  QuantScheme s;
  s.dtype = dtype;
  s.scale_dtype = ScaleDType::kUE8M0;
  s.block = BlockShape::row_groups(32);
  s.e8m0_rounding = rounding;
  return s;
}

QuantScheme QuantScheme::nvfp4() {
  QuantScheme s;
  s.dtype = QuantDType::kFp4E2M1;
  s.scale_dtype = ScaleDType::kUE4M3;
  s.block = BlockShape::row_groups(16);
  return s;
}

QuantScheme QuantScheme::int8_per_tensor(bool symmetric) {
  QuantScheme s;
  s.dtype = QuantDType::kInt8;
  s.symmetric = symmetric;
  return s;
}

QuantScheme QuantScheme::int8_per_token(bool symmetric) {
  QuantScheme s = int8_per_tensor(symmetric);
  s.block = BlockShape::per_row();
  return s;
}

QuantScheme QuantScheme::int8_per_channel() {
  return int8_per_token(true);
}

QuantScheme QuantScheme::int_weight_groups(QuantDType dtype, int64_t group, bool symmetric) {
  QuantScheme s;
  s.dtype = dtype;
  s.block = group < 0 ? BlockShape::per_row() : BlockShape::row_groups(group);
  s.symmetric = symmetric;
  return s;
}

// ---- queries ------------------------------------------------------------------------------------

std::string unsupported_reason(const QuantScheme& scheme) {
  const BlockShape& b = scheme.block;
  if (scheme.dtype == QuantDType::kNone) return "dtype=none is not a quantized type";
  if (b.rows == 0 || b.rows < -1 || b.cols == 0 || b.cols < -1) {
    return fmt::format("block=({},{}) needs each extent >= 1 or -1 (whole)", b.rows, b.cols);
  }
  const bool is_float = float_format(scheme.dtype).has_value();
  switch (scheme.scale_dtype) {
    case ScaleDType::kF32:
      break;
    case ScaleDType::kUE8M0:
    case ScaleDType::kUE4M3:
      if (!is_float) {
        return fmt::format("scale={} needs a floating-point element type, got {}",
                           scale_dtype_name(scheme.scale_dtype), quant_dtype_name(scheme.dtype));
      }
      break;
    case ScaleDType::kActivation:
      return "scale=activation (bf16/f16) is not produced here; use f32 scales and round them";
  }
  if (!scheme.symmetric) {
    if (!is_int(scheme.dtype)) {
      return fmt::format("asymmetric (zero-point) quantization needs int8 or int4, got {}",
                         quant_dtype_name(scheme.dtype));
    }
    if (scheme.scale_dtype != ScaleDType::kF32) return "asymmetric quantization needs f32 scales";
  }
  return "";
}

float element_qmax(const QuantScheme& scheme) {
  if (const auto f = float_format(scheme.dtype)) return format_info(*f).max_finite;
  if (scheme.dtype == QuantDType::kInt8) return scheme.symmetric ? 127.0f : 255.0f;
  if (scheme.dtype == QuantDType::kInt4) return scheme.symmetric ? 7.0f : 15.0f;
  return 0.0f;
}

int64_t code_row_bytes(QuantDType dtype, int64_t cols) {
  const auto n = static_cast<size_t>(cols);
  switch (dtype) {
    case QuantDType::kFp4E2M1:
    case QuantDType::kInt4:
      return static_cast<int64_t>(packed_size_4bit(n));
    case QuantDType::kFp6E3M2:
    case QuantDType::kFp6E2M3:
      return static_cast<int64_t>(packed_size_6bit(n));
    default:
      return cols;
  }
}

float QuantizedTensor::scale_value(int64_t i, int64_t j) const {
  MOEKIT_CHECK(i >= 0 && i < scale_rows && j >= 0 && j < scale_cols,
               "scale_value: block ({}, {}) outside the scale grid [{}, {}]", i, j, scale_rows,
               scale_cols);
  const auto idx = static_cast<size_t>(i * scale_cols + j);
  switch (scheme.scale_dtype) {
    case ScaleDType::kF32:
      return scales[idx];
    case ScaleDType::kUE8M0:
      return decode_e8m0(scale_codes[idx]);
    case ScaleDType::kUE4M3:
      return decode_ue4m3(scale_codes[idx]) / global_scale;
    case ScaleDType::kActivation:
      break;
  }
  return 0.0f;
}

uint8_t QuantizedTensor::code_at(int64_t r, int64_t c) const {
  MOEKIT_CHECK(r >= 0 && r < rows && c >= 0 && c < cols,
               "code_at: element ({}, {}) outside [{}, {}]", r, c, rows, cols);
  const int64_t row_bytes = code_row_bytes(scheme.dtype, cols);
  const uint8_t* row = codes.data() + r * row_bytes;
  switch (scheme.dtype) {
    case QuantDType::kFp4E2M1:
    case QuantDType::kInt4:
      return static_cast<uint8_t>((row[c / 2] >> (4 * (c % 2))) & 0xfu);
    case QuantDType::kFp6E3M2:
    case QuantDType::kFp6E2M3: {
      const uint32_t word = row[c / 4 * 3] | (static_cast<uint32_t>(row[c / 4 * 3 + 1]) << 8) |
                            (static_cast<uint32_t>(row[c / 4 * 3 + 2]) << 16);
      return static_cast<uint8_t>((word >> (6 * (c % 4))) & 0x3fu);
    }
    default:
      return row[c];
  }
}

// ---- quantize / dequantize ----------------------------------------------------------------------

QuantizedTensor quantize(std::span<const float> data, int64_t rows, int64_t cols,
                         const QuantScheme& scheme) {
  check_problem(data, rows, cols, scheme);
  return quantize_impl(data, rows, cols, scheme, std::nullopt);
}

QuantizedTensor quantize_with_scales(std::span<const float> data, int64_t rows, int64_t cols,
                                     const QuantScheme& scheme, std::span<const float> scales) {
  check_problem(data, rows, cols, scheme);
  MOEKIT_CHECK(scheme.symmetric,
               "quantize_with_scales: scheme {} is asymmetric; zero points are "
               "derived from the data, use quantize()",
               scheme.to_string());
  MOEKIT_CHECK(scheme.scale_dtype != ScaleDType::kUE8M0,
               "quantize_with_scales: scheme {} has e8m0 scales, which are derived from the data; "
               "use quantize()",
               scheme.to_string());
  const Grid grid = make_grid(scheme.block, rows, cols);
  const size_t expected = scheme.scale_dtype == ScaleDType::kUE4M3
                              ? 1
                              : static_cast<size_t>(grid.scale_rows * grid.scale_cols);
  MOEKIT_CHECK(scales.size() == expected,
               "quantize_with_scales: scales has {} values, scheme {} on [{}, {}] needs {}",
               scales.size(), scheme.to_string(), rows, cols, expected);
  for (size_t i = 0; i < scales.size(); ++i) {
    MOEKIT_CHECK(std::isfinite(scales[i]) && scales[i] > 0.0f,
                 "quantize_with_scales: scales[{}]={} must be finite and > 0", i, scales[i]);
  }
  return quantize_impl(data, rows, cols, scheme, scales);
}

void dequantize(const QuantizedTensor& q, std::span<float> out) {
  MOEKIT_CHECK(static_cast<int64_t>(out.size()) == q.rows * q.cols,
               "dequantize: out has {} elements, expected rows*cols = {}*{}", out.size(), q.rows,
               q.cols);
  const Grid grid = make_grid(q.scheme.block, q.rows, q.cols);
  const int64_t row_bytes = code_row_bytes(q.scheme.dtype, q.cols);
  MOEKIT_CHECK(static_cast<int64_t>(q.codes.size()) == q.rows * row_bytes,
               "dequantize: codes has {} bytes, expected {}", q.codes.size(), q.rows * row_bytes);
  const Quantizer quantizer(q.scheme);
  std::vector<uint8_t> row_codes(static_cast<size_t>(q.cols));
  for (int64_t r = 0; r < q.rows; ++r) {
    unpack_row(q.scheme.dtype,
               std::span(q.codes).subspan(static_cast<size_t>(r * row_bytes),
                                          static_cast<size_t>(row_bytes)),
               row_codes);
    const int64_t bi = r / grid.block_rows;
    for (int64_t c = 0; c < q.cols; ++c) {
      const int64_t bj = c / grid.block_cols;
      const auto idx = static_cast<size_t>(bi * grid.scale_cols + bj);
      const int zp = q.zero_points.empty() ? 0 : q.zero_points[idx];
      const float v = quantizer.decode(row_codes[static_cast<size_t>(c)], zp);
      float x = 0.0f;
      switch (q.scheme.scale_dtype) {
        case ScaleDType::kF32:
          x = v * q.scales[idx];
          break;
        case ScaleDType::kUE8M0:
          x = v * decode_e8m0(q.scale_codes[idx]);
          break;  // exact
        case ScaleDType::kUE4M3:
          x = v * decode_ue4m3(q.scale_codes[idx]) / q.global_scale;
          break;
        case ScaleDType::kActivation:
          break;
      }
      out[static_cast<size_t>(r * q.cols + c)] = x;
    }
  }
}

std::vector<float> dequantize(const QuantizedTensor& q) {
  std::vector<float> out(static_cast<size_t>(q.rows * q.cols));
  dequantize(q, out);
  return out;
}

}  // namespace moekit::quant
