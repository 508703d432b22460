// `moekit run`: one MoE layer on seeded random data, checked against an independent float64
// recomputation of sampled output rows.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <map>
#include <random>

#include "cli_common.h"
#include "moekit/core/error.h"
#include "moekit/core/tolerance.h"

namespace moekit::cli {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double act_gated(Activation a, double g, double u, const ActivationParams& p) {
  auto silu = [](double x) { return x / (1.0 + std::exp(-x)); };
  auto gelu = [](double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); };
  auto gelu_t = [](double x) {
    return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
  };
  const double lim = p.clamp_limit.value_or(7.0);
  switch (a) {
    case Activation::kSilu:
      if (p.clamp_limit) return silu(std::min(g, lim)) * std::clamp(u, -lim, lim);
      return silu(g) * u;
    case Activation::kGelu:
      return gelu(g) * u;
    case Activation::kGeluTanh:
      return gelu_t(g) * u;
    case Activation::kSwigluOai: {
      const double gc = std::min(g, lim);
      return (std::clamp(u, -lim, lim) + p.beta) * gc / (1.0 + std::exp(-p.alpha * gc));
    }
    case Activation::kSwigluStep:
      return std::min(silu(g), lim) * std::clamp(u, -lim, lim);
    case Activation::kRelu2:
      return std::max(g, 0.0) * std::max(g, 0.0) * u;
    case Activation::kSiluNoMul:
      return silu(g);
    case Activation::kGeluNoMul:
      return gelu(g);
    case Activation::kGeluTanhNoMul:
      return gelu_t(g);
    case Activation::kRelu2NoMul:
      return std::max(g, 0.0) * std::max(g, 0.0);
  }
  return 0.0;
}

// y = W2 @ act(W13 @ x + b13) + b2 in float64, for one expert (weights as float vectors).
std::vector<double> mlp_f64(const std::vector<double>& x, const float* w13, const float* w2,
                            const float* b13, const float* b2, int64_t H, int64_t I, Activation act,
                            const ActivationParams& params) {
  const bool gated = is_gated(act);
  const int64_t N = gated ? 2 * I : I;
  std::vector<double> g(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    double s = b13 ? b13[n] : 0.0;
    for (int64_t h = 0; h < H; ++h)
      s += static_cast<double>(w13[n * H + h]) * x[h];
    g[n] = s;
  }
  std::vector<double> a(static_cast<size_t>(I));
  for (int64_t i = 0; i < I; ++i) {
    if (act == Activation::kSwigluOai) {
      a[i] = act_gated(act, g[2 * i], g[2 * i + 1], params);
    } else {
      a[i] = act_gated(act, g[i], gated ? g[I + i] : 0.0, params);
    }
  }
  std::vector<double> y(static_cast<size_t>(H));
  for (int64_t h = 0; h < H; ++h) {
    double s = b2 ? b2[h] : 0.0;
    for (int64_t i = 0; i < I; ++i)
      s += static_cast<double>(w2[h * I + i]) * a[i];
    y[h] = s;
  }
  return y;
}

std::vector<float> host_floats(const Tensor& t) {
  return t.defined() ? t.to_float_vector() : std::vector<float>{};
}

}  // namespace

int run_command(const DeploymentOptions& deployment, int64_t tokens, uint64_t seed, int check_rows,
                const std::string& routing_dist) {
  const ModelPreset model = deployment.model_preset();
  MoELayerOptions options = deployment.layer_options();
  options.max_num_tokens = std::max<int64_t>(options.max_num_tokens, std::max<int64_t>(tokens, 1));
  std::cout << "model    " << model.summary() << "\n";
  std::cout << "device   " << options.device.to_string() << ", " << tokens << " tokens, "
            << dtype_name(options.dtype) << "\n";

  auto t0 = std::chrono::steady_clock::now();
  MoELayerWeights weights;
  with_elapsed_display("random weights",
                       [&] { weights = MoELayer::random_weights(model, options, seed); });
  const double weight_bytes = static_cast<double>(weights.w13.nbytes() + weights.w2.nbytes());
  std::cout << fmt::format("weights  {:.2f} GB of random expert weights in {:.1f} s\n",
                           weight_bytes / 1e9, seconds_since(t0));
  std::unique_ptr<MoELayer> layer_owner;
  with_elapsed_display("building the layer",
                       [&] { layer_owner = std::make_unique<MoELayer>(model, weights, options); });
  MoELayer& layer = *layer_owner;
  std::cout << "\n" << layer.selection().to_string() << "\n";

  const Device device = options.device.device();
  const int64_t H = model.hidden_size;
  Tensor x_host = Tensor::empty({tokens, H}, options.dtype);
  {
    std::mt19937_64 rng(seed + 17);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (int64_t i = 0; i < x_host.numel(); ++i)
      store_float(x_host.data(), options.dtype, i, u(rng));
  }
  const Tensor logits_host =
      make_logits(tokens, model.num_experts, model.top_k, routing_dist, seed + 29);
  const Tensor x = device.is_cpu() ? x_host : x_host.to(device);
  const Tensor logits = device.is_cpu() ? logits_host : logits_host.to(device);

  // Route once (the check reuses this routing), then time the layer.
  const RunContext route_ctx{layer.default_stream(), nullptr};
  const RoutingResult routing = layer.router().select_experts(x, logits, route_ctx);
  synchronize(route_ctx.stream);
  t0 = std::chrono::steady_clock::now();
  Progress progress("forward");
  const int64_t chunk =
      device.is_cpu() && tokens > 256 ? (tokens + 19) / 20 : std::max<int64_t>(tokens, 1);
  Tensor out_host = Tensor::empty({tokens, H}, options.dtype);
  for (int64_t begin = 0; begin < tokens || (tokens == 0 && begin == 0); begin += chunk) {
    const int64_t end = std::min(tokens, begin + chunk);
    const Tensor part = layer.forward(x.slice(0, begin, end), logits.slice(0, begin, end));
    const Tensor part_host = part.device().is_cpu() ? part : part.to(Device::cpu());
    if (end > begin) {
      std::memcpy(static_cast<char*>(out_host.data()) + begin * H * element_size(options.dtype),
                  part_host.data(), part_host.nbytes());
    }
    progress.update(tokens == 0 ? 1.0 : static_cast<double>(end) / static_cast<double>(tokens));
    if (tokens == 0) break;
  }
  progress.done();
  const double forward_s = seconds_since(t0);

  // Independent float64 recomputation of sampled rows from the same routing.
  const std::vector<int64_t> ids = routing.topk_ids.to_int_vector();
  const std::vector<float> tw = routing.topk_weights.to_float_vector();
  // Only the experts the sampled rows use are brought to the host (a deepseek-v3 layer is 22 GB).
  std::map<int64_t, std::pair<std::vector<float>, std::vector<float>>> expert_cache;
  auto expert_weights = [&](int64_t e) -> const std::pair<std::vector<float>, std::vector<float>>& {
    auto it = expert_cache.find(e);
    if (it == expert_cache.end()) {
      it = expert_cache
               .emplace(e, std::make_pair(host_floats(layer.weights().w13.select(e)),
                                          host_floats(layer.weights().w2.select(e))))
               .first;
    }
    return it->second;
  };
  const std::vector<float> b13 = host_floats(layer.weights().w13_bias);
  const std::vector<float> b2 = host_floats(layer.weights().w2_bias);
  const std::vector<float> sw13 = host_floats(layer.weights().shared_w13);
  const std::vector<float> sw2 = host_floats(layer.weights().shared_w2);
  const std::vector<float> xs = x_host.to_float_vector();
  const std::vector<float> outs = out_host.to_float_vector();
  const int64_t I = layer.moe_config().intermediate_size_per_partition();
  const int64_t N = is_gated(model.activation) ? 2 * I : I;
  const ActivationParams params = layer.moe_config().activation_params();
  const int k = model.top_k;
  const int first = layer.first_local_expert();
  const int local = layer.moe_config().num_local_experts;
  const bool weight_on_input = layer.router().apply_router_weight_on_input();

  std::vector<int64_t> rows;
  const int64_t n_check = std::min<int64_t>(check_rows, tokens);
  for (int64_t r = 0; r < n_check; ++r) {
    rows.push_back(n_check == 1 ? 0 : r * (tokens - 1) / (n_check - 1));
  }
  double num = 0, den = 0;
  Progress check_progress("float64 check");
  for (size_t ri = 0; ri < rows.size(); ++ri) {
    const int64_t m = rows[ri];
    std::vector<double> ref(static_cast<size_t>(H), 0.0);
    const std::vector<double> xrow(xs.begin() + m * H, xs.begin() + (m + 1) * H);
    for (int j = 0; j < k; ++j) {
      const int64_t e = ids[m * k + j] - first;
      if (ids[m * k + j] < 0 || e < 0 || e >= local) continue;
      std::vector<double> in = xrow;
      const double w = tw[m * k + j];
      if (weight_on_input) {
        for (double& v : in)
          v *= w;
      }
      const auto y =
          mlp_f64(in, expert_weights(e).first.data(), expert_weights(e).second.data(),
                  b13.empty() ? nullptr : b13.data() + e * N,
                  b2.empty() ? nullptr : b2.data() + e * H, H, I, model.activation, params);
      for (int64_t h = 0; h < H; ++h)
        ref[h] += (weight_on_input ? 1.0 : w) * y[h];
    }
    if (!sw13.empty()) {
      const int64_t Is = static_cast<int64_t>(sw2.size()) / H;
      const auto y =
          mlp_f64(xrow, sw13.data(), sw2.data(), nullptr, nullptr, H, Is, model.activation, params);
      for (int64_t h = 0; h < H; ++h)
        ref[h] += y[h];
    }
    for (int64_t h = 0; h < H; ++h) {
      const double d = outs[m * H + h] - ref[h];
      num += d * d;
      den += ref[h] * ref[h];
    }
    check_progress.update(static_cast<double>(ri + 1) / static_cast<double>(rows.size()));
  }
  check_progress.done();
  const double rel = den > 0 ? std::sqrt(num / den) : (num > 0 ? INFINITY : 0.0);
  const Tolerance& tol = tolerance_for(options.dtype);
  const bool ok = !std::isnan(rel) && rel <= tol.rel_l2;
  std::cout << fmt::format("forward  {:.3f} ms for {} tokens ({})\n", forward_s * 1e3, tokens,
                           layer.kernel().fused_experts().name());
  std::cout << fmt::format(
      "check    {} rows vs float64 recomputation: relative error {:.3e} (tolerance {:.1e} for {}) "
      "-> {}\n",
      rows.size(), rel, tol.rel_l2, tol.name, ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}

}  // namespace moekit::cli
