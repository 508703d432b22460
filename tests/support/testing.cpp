#include "testing.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace moekit::testing {
Tensor random_tensor(const Shape& shape, DType dtype, uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> values(static_cast<size_t>(numel_of(shape)));
  bool any_nonzero = false;
  for (float& v : values) {
    v = round_to_dtype(dist(rng), dtype);
    any_nonzero |= v != 0.f;
  }
  if (!values.empty() && !any_nonzero)
    values[0] = round_to_dtype(hi * 0.5f + lo * 0.5f + 0.25f, dtype);
  return Tensor::from_floats(values, shape, dtype);
}

void drop_some_slots(Tensor& topk_ids) {
  int32_t* id = topk_ids.data_as<int32_t>();
  const int64_t n = topk_ids.numel();
  for (int64_t i = 0; i < n; i += 3)
    id[i] = -1;
  for (int64_t j = 0; j < std::min<int64_t>(topk_ids.size(1), n); ++j)
    id[j] = -1;
}

void random_routing(int64_t M, int topk, int num_experts, uint64_t seed, Tensor* topk_ids,
                    Tensor* topk_weights) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> ids(static_cast<size_t>(M * topk));
  std::vector<float> weights(ids.size());
  std::vector<int> perm(num_experts);
  for (int64_t m = 0; m < M; ++m) {
    for (int e = 0; e < num_experts; ++e)
      perm[e] = e;
    std::shuffle(perm.begin(), perm.end(), rng);
    float sum = 0.f;
    for (int j = 0; j < topk; ++j) {
      ids[m * topk + j] = perm[j];
      weights[m * topk + j] = std::uniform_real_distribution<float>(0.1f, 1.f)(rng);
      sum += weights[m * topk + j];
    }
    for (int j = 0; j < topk; ++j)
      weights[m * topk + j] /= sum;
  }
  *topk_ids = Tensor::from_ints(ids, {M, topk}, DType::kInt32);
  *topk_weights = Tensor::from_floats(weights, {M, topk}, DType::kF32);
}

double relative_l2_error(const std::vector<double>& out, const std::vector<double>& ref) {
  if (out.size() != ref.size()) throw std::invalid_argument("relative_l2_error: size mismatch");
  double num = 0, den = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    // NOTE: a NaN or Inf on either side is an infinite error, never a quiet 0 (NaN compares false
    // both ways, so `err <= tol` and `err > tol` would both be false).
    if (!std::isfinite(out[i]) || !std::isfinite(ref[i])) {
      return std::numeric_limits<double>::infinity();
    }
    const double d = out[i] - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  if (!std::isfinite(num) || !std::isfinite(den)) return std::numeric_limits<double>::infinity();
  if (den == 0) return num == 0 ? 0 : std::numeric_limits<double>::infinity();
  return std::sqrt(num / den);
}

double relative_l2_error(const Tensor& out, const std::vector<double>& ref) {
  const std::vector<float> o = out.to_float_vector();
  return relative_l2_error(std::vector<double>(o.begin(), o.end()), ref);
}

int64_t first_bad_element(const Tensor& out, const std::vector<double>& ref, const Tolerance& tol) {
  const std::vector<float> o = out.to_float_vector();
  if (o.size() != ref.size()) return 0;
  for (size_t i = 0; i < o.size(); ++i) {
    if (!std::isfinite(o[i]) || !std::isfinite(ref[i])) return static_cast<int64_t>(i);
    const double err = std::fabs(static_cast<double>(o[i]) - ref[i]);
    if (!(err <= tol.abs_elem + tol.rel_elem * std::fabs(ref[i]))) return static_cast<int64_t>(i);
  }
  return -1;
}

::testing::AssertionResult contains_all(const std::string& message,
                                        std::initializer_list<std::string_view> needles) {
  for (std::string_view n : needles) {
    if (message.find(n) == std::string::npos) {
      return ::testing::AssertionFailure() << "message \"" << message << "\" lacks \"" << n << "\"";
    }
  }
  return ::testing::AssertionSuccess();
}

bool has_nan(const Tensor& t) {
  for (float v : t.to_float_vector()) {
    if (std::isnan(v)) return true;
  }
  return false;
}

Tensor poisoned(const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  t.fill_bytes(0xFF);
  return t;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  const Tensor ca = a.to(Device::cpu()), cb = b.to(Device::cpu());
  return std::equal(static_cast<const uint8_t*>(ca.data()),
                    static_cast<const uint8_t*>(ca.data()) + ca.nbytes(),
                    static_cast<const uint8_t*>(cb.data()));
}

std::string param_name(std::string name) {
  for (char& ch : name) {
    if (ch == '-') ch = '_';
  }
  return name;
}

}  // namespace moekit::testing
