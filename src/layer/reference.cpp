#include "moekit/layer/reference.h"

#include <cmath>
#include <limits>
#include <map>
#include <optional>

#include "moekit/config/quant_factories.h"
#include "moekit/core/checks.h"
#include "moekit/core/error.h"
#include "moekit/quant/moe_input_quant.h"
#include "moekit/quant/quantize.h"

namespace moekit {
namespace {

Tensor to_host(const Tensor& t) {
  return !t.defined() || t.device().is_cpu() ? t : t.to(Device::cpu());
}

QuantDesc desc_on_host(const QuantDesc& d) {
  QuantDesc h = d;
  for (Tensor* t : {&h.scale, &h.alpha_or_gscale, &h.zp, &h.bias})
    *t = to_host(*t);
  return h;
}

std::vector<float> floats_or_empty(const Tensor& t) {
  return t.defined() ? to_host(t).to_float_vector() : std::vector<float>{};
}

}  // namespace

std::vector<double> reference_forward(const MoELayer& layer, const Tensor& x,
                                      const RoutingResult& routing,
                                      const std::vector<int64_t>& rows,
                                      const ExpertSource& all_experts) {
  const MoEConfig& moe = layer.moe_config();
  const int64_t H = moe.hidden_dim, I = moe.intermediate_size_per_partition();
  const Activation act = moe.activation;
  const int64_t N = is_gated(act) ? 2 * I : I;
  expect_shape(x, "x", {kAnyDim, H});
  expect_device(x, "x", Device::cpu());
  const DType dt = x.dtype();
  const int64_t k = routing.topk_ids.size(1);
  const std::vector<int64_t> ids = to_host(routing.topk_ids).to_int_vector();
  const std::vector<float> tw = to_host(routing.topk_weights).to_float_vector();
  const std::vector<float> xv = x.to_float_vector();
  QuantConfig q = layer.quant_config();
  for (QuantDesc* d : {&q.a1, &q.a2})
    *d = desc_on_host(*d);
  ActivationParams params = moe.activation_params();
  if (q.gemm1_alpha) params.alpha = *q.gemm1_alpha;
  if (q.gemm1_beta) params.beta = *q.gemm1_beta;
  if (q.gemm1_clamp_limit) params.clamp_limit = q.gemm1_clamp_limit;
  const bool on_input = layer.router().apply_router_weight_on_input();
  MOEKIT_CHECK(!all_experts || !layer.is_quantized(),
               "reference_forward: an expert source serves unquantized layers (this one is {})",
               layer.scheme());
  const int64_t first = all_experts ? 0 : layer.first_local_expert();
  const int64_t experts_here = all_experts ? moe.num_experts : moe.num_local_experts;

  struct Expert {
    std::vector<float> w13, w2, b13, b2;
  };
  std::map<int64_t, Expert> experts;  // only the experts the rows use
  auto expert = [&](int64_t e) -> const Expert& {
    auto it = experts.find(e);
    if (it == experts.end()) {
      const ExpertWeights w = all_experts ? all_experts(e) : layer.expert_reference(e);
      it = experts
               .emplace(e, Expert{w.w13.to_float_vector(), w.w2.to_float_vector(),
                                  floats_or_empty(w.w13_bias), floats_or_empty(w.w2_bias)})
               .first;
    }
    return it->second;
  };
  auto gscale = [](const QuantDesc& d, int64_t e) -> std::optional<float> {
    if (!d.alpha_or_gscale.defined()) return std::nullopt;
    const std::vector<float> g = d.alpha_or_gscale.to_float_vector();
    return g.size() > 1 ? g[static_cast<size_t>(e)] : g[0];
  };
  auto qdq = [&](std::vector<float>& v, int64_t cols, const QuantDesc& d, int64_t e) {
    if (d.dtype == QuantDType::kNone) return;
    if (auto g = gscale(d, e)) {
      quant_dequant_rows(v, 1, cols, d, *g);
    } else {
      quant_dequant_rows(v, 1, cols, d);
    }
  };
  // Pass 1: the intermediates of every (row, slot), so a per-tensor dynamic a2 sees them all.
  struct Slot {
    int64_t row, e;
    double weight;
    std::vector<float> a;
  };
  std::vector<Slot> slots;
  for (size_t ri = 0; ri < rows.size(); ++ri) {
    const int64_t m = rows[ri];
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = ids[static_cast<size_t>(m * k + j)] - first;
      if (ids[static_cast<size_t>(m * k + j)] < 0 || e < 0 || e >= experts_here) continue;
      const Expert& ex = expert(e);
      const double wt = tw[static_cast<size_t>(m * k + j)];
      std::vector<float> h(xv.begin() + m * H, xv.begin() + (m + 1) * H);
      if (on_input) {
        for (float& v : h)
          v = round_to_dtype(static_cast<float>(v * wt), dt);
      }
      qdq(h, H, q.a1, e);
      std::vector<float> g(static_cast<size_t>(N));
      for (int64_t n = 0; n < N; ++n) {
        double acc = ex.b13.empty() ? 0.0 : ex.b13[n];
        for (int64_t c = 0; c < H; ++c)
          acc += static_cast<double>(ex.w13[n * H + c]) * h[c];
        g[n] = round_to_dtype(static_cast<float>(acc), dt);
      }
      std::vector<float> a(static_cast<size_t>(I));
      apply_activation_row(act, params, g.data(), a.data(), I);
      for (float& v : a)
        v = round_to_dtype(v, dt);
      slots.push_back({static_cast<int64_t>(ri), e, on_input ? 1.0 : wt, std::move(a)});
    }
  }
  const bool a2_tensor_dynamic = q.a2.dtype != QuantDType::kNone && q.a2.shape.is_per_tensor() &&
                                 !q.a2.scale.defined() && !q.a2.alpha_or_gscale.defined();
  if (a2_tensor_dynamic && !slots.empty()) {
    std::vector<float> all;
    for (const Slot& s : slots)
      all.insert(all.end(), s.a.begin(), s.a.end());
    quant_dequant_rows(all, static_cast<int64_t>(slots.size()), I, q.a2);
    for (size_t i = 0; i < slots.size(); ++i)
      std::copy(all.begin() + static_cast<int64_t>(i) * I,
                all.begin() + static_cast<int64_t>(i + 1) * I, slots[i].a.begin());
  } else {
    for (Slot& s : slots)
      qdq(s.a, I, q.a2, s.e);
  }
  std::vector<double> out(rows.size() * static_cast<size_t>(H), 0.0);
  for (const Slot& s : slots) {
    const Expert& ex = expert(s.e);
    for (int64_t c = 0; c < H; ++c) {
      double acc = ex.b2.empty() ? 0.0 : ex.b2[c];
      for (int64_t i = 0; i < I; ++i)
        acc += static_cast<double>(ex.w2[c * I + i]) * s.a[i];
      out[s.row * H + c] += s.weight * acc;
    }
  }
  // Shared experts, on the rank that adds them (MoELayer::forward's rule).
  const bool adds_shared =
      !(moe.parallel.use_ep && moe.parallel.dp_size == 1) || moe.parallel.ep_rank == 0;
  if (layer.has_shared_experts() && adds_shared) {
    const SharedExpertWeights sw = layer.shared_reference();
    const std::vector<float> s13 = floats_or_empty(sw.w13);
    const std::vector<float> s2 = floats_or_empty(sw.w2);
    const std::vector<float> gate = floats_or_empty(sw.gate);
    const int64_t Is = sw.w2.size(1);
    const int64_t Ns = is_gated(act) ? 2 * Is : Is;
    for (size_t ri = 0; ri < rows.size(); ++ri) {
      const int64_t m = rows[ri];
      std::vector<float> g(static_cast<size_t>(Ns));
      for (int64_t n = 0; n < Ns; ++n) {
        double acc = 0.0;
        for (int64_t c = 0; c < H; ++c)
          acc += static_cast<double>(s13[n * H + c]) * xv[m * H + c];
        g[n] = round_to_dtype(static_cast<float>(acc), dt);
      }
      std::vector<float> a(static_cast<size_t>(Is));
      apply_activation_row(act, params, g.data(), a.data(), Is);
      // Qwen2-MoE's per-token gate: sigmoid(x . gate).
      double scale = 1.0;
      if (!gate.empty()) {
        double dot = 0.0;
        for (int64_t c = 0; c < H; ++c)
          dot += static_cast<double>(gate[c]) * xv[m * H + c];
        scale = 1.0 / (1.0 + std::exp(-dot));
      }
      for (int64_t c = 0; c < H; ++c) {
        double acc = 0.0;
        for (int64_t i = 0; i < Is; ++i)
          acc += static_cast<double>(s2[c * Is + i]) * round_to_dtype(a[i], dt);
        out[ri * H + c] += scale * acc;
      }
    }
  }
  return out;
}

double relative_error(const Tensor& out, const std::vector<double>& ref,
                      const std::vector<int64_t>& rows) {
  expect_dim(out, "out", 2);
  expect_device(out, "out", Device::cpu());
  const int64_t H = out.size(1);
  MOEKIT_CHECK(ref.size() == rows.size() * static_cast<size_t>(H),
               "relative_error: {} reference values for {} rows of {}", ref.size(), rows.size(), H);
  const std::vector<float> o = out.to_float_vector();
  double num = 0.0, den = 0.0;
  for (size_t ri = 0; ri < rows.size(); ++ri) {
    for (int64_t h = 0; h < H; ++h) {
      const double a = o[static_cast<size_t>(rows[ri] * H + h)];
      const double b = ref[ri * static_cast<size_t>(H) + static_cast<size_t>(h)];
      if (!std::isfinite(a) || !std::isfinite(b)) return std::numeric_limits<double>::quiet_NaN();
      num += (a - b) * (a - b);
      den += b * b;
    }
  }
  if (den > 0) return std::sqrt(num / den);
  return num > 0 ? std::numeric_limits<double>::infinity() : 0.0;
}

}  // namespace moekit
