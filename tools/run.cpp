// `moekit run`: one MoE layer on seeded random data (or a checkpoint's layer,
// tools/checkpoint.cpp), checked against an independent float64 recomputation of sampled output
// rows (layer/reference.h).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <random>

#include "cli_common.h"
#include "moekit/core/error.h"
#include "moekit/core/tolerance.h"
#include "moekit/layer/reference.h"

namespace moekit::cli {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int forward_and_check(MoELayer& layer, const Tensor& x_host, const Tensor& logits_host,
                      int check_rows) {
  const Device device = layer.options().device.device();
  const int64_t tokens = x_host.size(0);
  const int64_t H = layer.moe_config().hidden_dim;
  const DType dtype = layer.options().dtype;
  const Tensor x = device.is_cpu() ? x_host : x_host.to(device);
  const Tensor logits = device.is_cpu() ? logits_host : logits_host.to(device);

  // Route once (the check reuses this routing), then time the layer.
  const RunContext route_ctx{layer.default_stream(), nullptr};
  const RoutingResult routing = layer.router().select_experts(x, logits, route_ctx);
  synchronize(route_ctx.stream);
  const auto t0 = std::chrono::steady_clock::now();
  Progress progress("forward");
  const int64_t chunk =
      device.is_cpu() && tokens > 256 ? (tokens + 19) / 20 : std::max<int64_t>(tokens, 1);
  Tensor out_host = Tensor::empty({tokens, H}, dtype);
  for (int64_t begin = 0; begin < tokens || (tokens == 0 && begin == 0); begin += chunk) {
    const int64_t end = std::min(tokens, begin + chunk);
    const Tensor part = layer.forward(x.slice(0, begin, end), logits.slice(0, begin, end));
    const Tensor part_host = part.device().is_cpu() ? part : part.to(Device::cpu());
    if (end > begin) {
      std::memcpy(static_cast<char*>(out_host.data()) + begin * H * element_size(dtype),
                  part_host.data(), part_host.nbytes());
    }
    progress.update(tokens == 0 ? 1.0 : static_cast<double>(end) / static_cast<double>(tokens));
    if (tokens == 0) break;
  }
  progress.done();
  const double forward_s = seconds_since(t0);

  std::vector<int64_t> rows;
  const int64_t n_check = std::min<int64_t>(check_rows, tokens);
  for (int64_t r = 0; r < n_check; ++r)
    rows.push_back(n_check == 1 ? 0 : r * (tokens - 1) / (n_check - 1));
  const RoutingResult routing_host{routing.topk_weights.to(Device::cpu()),
                                   routing.topk_ids.to(Device::cpu())};
  std::vector<double> ref;
  with_elapsed_display("float64 check",
                       [&] { ref = reference_forward(layer, x_host, routing_host, rows); });
  const double rel = relative_error(out_host, ref, rows);
  const Tolerance& tol = tolerance(layer.tolerance_name());
  const bool ok = !std::isnan(rel) && rel <= tol.rel_l2;
  std::cout << fmt::format("forward  {:.3f} ms for {} tokens ({})\n", forward_s * 1e3, tokens,
                           layer.kernel().fused_experts().name());
  std::cout << fmt::format(
      "check    {} rows vs float64 recomputation: relative error {:.3e} (tolerance {:.1e} for {}) "
      "-> {}\n",
      rows.size(), rel, tol.rel_l2, tol.name, ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}

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
  std::unique_ptr<MoELayer> layer;
  with_elapsed_display("building the layer", [&] {
    layer = std::make_unique<MoELayer>(model, std::move(weights), options);
  });
  std::cout << "\n" << layer->plan().to_string() << "\n";

  Tensor x = Tensor::empty({tokens, model.hidden_size}, options.dtype);
  {
    std::mt19937_64 rng(seed + 17);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (int64_t i = 0; i < x.numel(); ++i)
      store_float(x.data(), options.dtype, i, u(rng));
  }
  const Tensor logits =
      make_logits(tokens, model.num_experts, model.top_k, routing_dist, seed + 29);
  return forward_and_check(*layer, x, logits, check_rows);
}

}  // namespace moekit::cli
