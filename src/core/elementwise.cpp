#include "core/elementwise.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "core/cuda/elementwise.h"
#include "core/cuda_seam.h"
#include "moekit/core/checks.h"

namespace moekit {

void add_inplace(Tensor& out, const Tensor& other, Stream stream, const Tensor& row_scale) {
  MOEKIT_CHECK(out.shape() == other.shape() && out.dtype() == other.dtype(),
               "add_inplace: {} and {} must match", out.describe(), other.describe());
  expect_contiguous(out, "add_inplace output");
  expect_contiguous(other, "add_inplace input");
  expect_device(other, "add_inplace input", out.device());
  const int64_t n = out.numel();
  int64_t row = n;  // elements per scaled row
  if (row_scale.defined()) {
    expect_dim(out, "add_inplace output", 2);
    expect_tensor(row_scale, "row_scale", {out.size(0)}, {DType::kF32}, out.device());
    expect_contiguous(row_scale, "row_scale");
    row = out.size(1);
  }
  if (out.device().is_cuda()) {
    if constexpr (kCudaBuild) {
      add_inplace_cuda(out, other, row_scale, stream);
      return;
    } else {
      throw_no_cuda("add_inplace on a GPU");
    }
  }
  const float* scale = row_scale.defined() ? row_scale.data_as<const float>() : nullptr;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float o = load_float(other.data(), other.dtype(), i);
    store_float(out.data(), out.dtype(), i,
                load_float(out.data(), out.dtype(), i) + (scale ? scale[i / row] * o : o));
  }
}

namespace {

void check_gate_inputs(const Tensor& x, const Tensor& gate_weight) {
  expect_dim(x, "hidden_states", 2);
  expect_contiguous(x, "hidden_states");
  expect_tensor(gate_weight, "shared_gate", {x.size(1)}, {DType::kF32}, x.device());
  expect_contiguous(gate_weight, "shared_gate");
}

// sigmoid(x[m, :] . g) with a double dot product (the CPU side of shared_expert_gate).
float host_gate(const Tensor& x, const float* g, int64_t m) {
  const int64_t H = x.size(1);
  double dot = 0.0;
  for (int64_t h = 0; h < H; ++h)
    dot += static_cast<double>(load_float(x.data(), x.dtype(), m * H + h)) * g[h];
  return static_cast<float>(1.0 / (1.0 + std::exp(-dot)));
}

}  // namespace

void shared_expert_gate(const Tensor& x, const Tensor& gate_weight, Tensor& gate, Stream stream) {
  check_gate_inputs(x, gate_weight);
  expect_tensor(gate, "shared gate values", {x.size(0)}, {DType::kF32}, x.device());
  expect_contiguous(gate, "shared gate values");
  if (x.device().is_cuda()) {
    if constexpr (kCudaBuild) {
      shared_expert_gate_cuda(x, gate_weight, gate, stream);
      return;
    } else {
      throw_no_cuda("shared_expert_gate on a GPU");
    }
  }
  const float* g = gate_weight.data_as<const float>();
  float* out = gate.data_as<float>();
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < x.size(0); ++m)
    out[m] = host_gate(x, g, m);
}

void append_shared_slots(const Tensor& ids, const Tensor& weights, int first_id, int count,
                         const Tensor& x, const Tensor& gate_weight, Tensor& out_ids,
                         Tensor& out_weights, Stream stream) {
  expect_dim(ids, "topk_ids", 2);
  const int64_t M = ids.size(0), k = ids.size(1);
  MOEKIT_CHECK(count >= 1 && first_id >= 0, "append_shared_slots: count={} first_id={}", count,
               first_id);
  const Device device = ids.device();
  expect_tensor(ids, "topk_ids", {M, k}, {DType::kInt32}, device);
  expect_tensor(weights, "topk_weights", {M, k}, {DType::kF32}, device);
  expect_tensor(out_ids, "topk_ids with the shared slots", {M, k + count}, {DType::kInt32}, device);
  expect_tensor(out_weights, "topk_weights with the shared slots", {M, k + count}, {DType::kF32},
                device);
  expect_contiguous(ids, "topk_ids");
  expect_contiguous(weights, "topk_weights");
  expect_contiguous(out_ids, "topk_ids with the shared slots");
  expect_contiguous(out_weights, "topk_weights with the shared slots");
  if (gate_weight.defined()) {
    check_gate_inputs(x, gate_weight);
    expect_shape(x, "hidden_states", {M, gate_weight.size(0)});
  }
  if (device.is_cuda()) {
    if constexpr (kCudaBuild) {
      append_shared_slots_cuda(ids, weights, first_id, count, x, gate_weight, out_ids, out_weights,
                               stream);
      return;
    } else {
      throw_no_cuda("append_shared_slots on a GPU");
    }
  }
  const int32_t* in_ids = ids.data_as<const int32_t>();
  const float* in_w = weights.data_as<const float>();
  int32_t* o_ids = out_ids.data_as<int32_t>();
  float* o_w = out_weights.data_as<float>();
  const float* g = gate_weight.defined() ? gate_weight.data_as<const float>() : nullptr;
  const int64_t k2 = k + count;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t j = 0; j < k; ++j) {
      o_ids[m * k2 + j] = in_ids[m * k + j];
      o_w[m * k2 + j] = in_w[m * k + j];
    }
    const float w = g ? host_gate(x, g, m) : 1.0f;
    for (int j = 0; j < count; ++j) {
      o_ids[m * k2 + k + j] = first_id + j;
      o_w[m * k2 + k + j] = w;
    }
  }
}

void scale_rows(Tensor& out, const Tensor& in, const Tensor& weights, Stream stream) {
  expect_dim(in, "scale_rows input", 2);
  const int64_t M = in.size(0), K = in.size(1);
  expect_shape(out, "scale_rows output", {M, K});
  expect_shape(weights, "topk_weights", {M, 1});
  expect_dtype(weights, "topk_weights", {DType::kF32});
  expect_contiguous(in, "scale_rows input");
  expect_contiguous(out, "scale_rows output");
  expect_contiguous(weights, "topk_weights");
  if (in.device().is_cuda()) {
    if constexpr (kCudaBuild) {
      scale_rows_cuda(out, in, weights, stream);
      return;
    } else {
      throw_no_cuda("scale_rows on a GPU");
    }
  }
  const float* w = weights.data_as<const float>();
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t k = 0; k < K; ++k) {
      store_float(out.data(), out.dtype(), m * K + k,
                  load_float(in.data(), in.dtype(), m * K + k) * w[m]);
    }
  }
}

namespace {
// Source row of destination row r in the blocks-of-32 gate/up layout (see elementwise.h).
int64_t gate_up_source_row(int64_t r, int64_t I, bool pairwise) {
  const int64_t block = r / 64, w = r % 64;
  const int64_t col = block * 32 + (w % 32);
  if (w < 32) return pairwise ? 2 * col : col;
  return pairwise ? 2 * col + 1 : I + col;
}
}  // namespace

void interleave_gate_up_blocks(Tensor& dst, const Tensor& src, bool pairwise, Stream stream) {
  MOEKIT_CHECK(dst.shape() == src.shape() && dst.dtype() == src.dtype() &&
                   dst.device() == src.device() && dst.data() != src.data(),
               "interleave_gate_up_blocks: {} -> {} must be distinct tensors of one shape",
               src.describe(), dst.describe());
  expect_contiguous(src, "w13");
  expect_contiguous(dst, "w13 (kernel format)");
  MOEKIT_CHECK(src.dim() == 2 || src.dim() == 3, "interleave_gate_up_blocks: {} must be 2-d or 3-d",
               src.describe());
  const int64_t n = src.size(1);
  MOEKIT_CHECK(n % 64 == 0, "interleave_gate_up_blocks: 2I={} must be a multiple of 64", n);
  if (src.device().is_cuda()) {
    if constexpr (kCudaBuild) {
      interleave_gate_up_blocks_cuda(dst, src, pairwise, stream);
      return;
    } else {
      throw_no_cuda("interleave_gate_up_blocks on a GPU");
    }
  }
  const int64_t E = src.size(0), K = src.dim() == 3 ? src.size(2) : 1;
  const size_t row_bytes = static_cast<size_t>(K) * element_size(src.dtype());
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = 0; r < n; ++r) {
      std::memcpy(static_cast<char*>(dst.data()) + (e * n + r) * row_bytes,
                  static_cast<const char*>(src.data()) +
                      (e * n + gate_up_source_row(r, n / 2, pairwise)) * row_bytes,
                  row_bytes);
    }
  }
}

float hashed_uniform(uint64_t seed, uint64_t index) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + index + 0x632BE59BD9B4E019ull;  // splitmix64
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

void fill_uniform(Tensor& t, uint64_t seed, float scale, Stream stream, uint64_t first_index) {
  expect_contiguous(t, "fill_uniform target");
  MOEKIT_CHECK(is_floating(t.dtype()), "fill_uniform: dtype {} is not a float type",
               dtype_name(t.dtype()));
  if (t.device().is_cuda()) {
    if constexpr (kCudaBuild) {
      fill_uniform_cuda(t, seed, scale, stream, first_index);
      return;
    } else {
      throw_no_cuda("fill_uniform on a GPU");
    }
  }
  const int64_t n = t.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    store_float(t.data(), t.dtype(), i,
                scale * hashed_uniform(seed, first_index + static_cast<uint64_t>(i)));
  }
}

void convert_ids_to_int32(const Tensor& ids64, Tensor& ids32, Stream stream) {
  expect_dtype(ids64, "topk_ids", {DType::kInt64});
  expect_dtype(ids32, "topk_ids (int32)", {DType::kInt32});
  MOEKIT_CHECK(ids64.shape() == ids32.shape(), "convert_ids_to_int32: {} vs {}", ids64.describe(),
               ids32.describe());
  expect_contiguous(ids64, "topk_ids");
  if (ids64.device().is_cuda()) {
    if constexpr (kCudaBuild) {
      convert_ids_to_int32_cuda(ids64, ids32, stream);
      return;
    } else {
      throw_no_cuda("convert_ids_to_int32 on a GPU");
    }
  }
  const int64_t* src = ids64.data_as<int64_t>();
  int32_t* dst = ids32.data_as<int32_t>();
  for (int64_t i = 0; i < ids64.numel(); ++i) {
    // Values outside int32 become an out-of-range id, rejected or skipped downstream.
    dst[i] = (src[i] < -1 || src[i] > std::numeric_limits<int32_t>::max())
                 ? std::numeric_limits<int32_t>::max()
                 : static_cast<int32_t>(src[i]);
  }
}

}  // namespace moekit
