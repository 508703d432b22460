// `moekit soak`: forward_into on the GPU for a set time with random batch sizes in [0, max] and
// random and degenerate routing — every token on one expert, NaN logit rows, an expert map with
// holes (an EP rank's layer) — checking a sampled row against the float64 recomputation every few
// steps and that device memory stays constant. Not part of the test suite (it takes minutes).
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <iostream>
#include <limits>
#include <random>

#include "cli_common.h"
#include "core/elementwise.h"
#include "moekit/core/error.h"
#include "moekit/core/tolerance.h"
#include "moekit/layer/reference.h"

namespace moekit::cli {
namespace {

enum class RoutingKind { kRandom, kSkewed, kOneExpert, kNanRows, kBalanced };
constexpr RoutingKind kKinds[] = {RoutingKind::kRandom, RoutingKind::kSkewed,
                                  RoutingKind::kOneExpert, RoutingKind::kNanRows,
                                  RoutingKind::kBalanced};

const char* kind_name(RoutingKind k) {
  switch (k) {
    case RoutingKind::kRandom:
      return "random";
    case RoutingKind::kSkewed:
      return "skewed";
    case RoutingKind::kOneExpert:
      return "one-expert";
    case RoutingKind::kNanRows:
      return "nan-rows";
    case RoutingKind::kBalanced:
      return "balanced";
  }
  return "?";
}

// Router logits (M, E) on the host for one kind of routing.
Tensor soak_logits(int64_t M, const ModelPreset& model, RoutingKind kind, uint64_t seed) {
  const std::string dist = kind == RoutingKind::kSkewed     ? "skewed"
                           : kind == RoutingKind::kBalanced ? "balanced"
                                                            : "random";
  Tensor logits = make_logits(M, model.num_experts, model.top_k, dist, seed);
  auto* v = logits.data_as<float>();
  std::mt19937_64 rng(seed + 1);
  const int64_t E = model.num_experts;
  if (kind == RoutingKind::kOneExpert) {  // one expert outranks all others for every token
    const int64_t hot = static_cast<int64_t>(rng() % static_cast<uint64_t>(E));
    for (int64_t m = 0; m < M; ++m)
      v[m * E + hot] += 100.0f;
  } else if (kind == RoutingKind::kNanRows) {  // about one row in eight is all NaN
    for (int64_t m = 0; m < M; ++m) {
      if (rng() % 8 == 0) {
        for (int64_t e = 0; e < E; ++e)
          v[m * E + e] = std::numeric_limits<float>::quiet_NaN();
      }
    }
  }
  return logits;
}

}  // namespace

int soak_command(const DeploymentOptions& deployment, double minutes, int check_every,
                 uint64_t seed) {
  MOEKIT_CHECK(cuda_device_count() > 0, "moekit soak needs a GPU: {}", cuda_unavailable_reason());
  const ModelPreset model = deployment.model_preset();
  MoELayerOptions options = deployment.layer_options();
  options.device = default_device_info();
  const int64_t max_m = options.max_num_tokens;
  WorkspaceManager workspace(options.device.device());
  options.workspace = &workspace;
  // The whole layer, and an expert-parallel rank's layer (EP over 2 ranks inside one data-parallel
  // group: rank 1 holds the second half of the experts; the expert map sends the rest to -1).
  std::vector<std::unique_ptr<MoELayer>> layers;
  layers.push_back(
      std::make_unique<MoELayer>(model, MoELayer::random_weights(model, options, seed), options));
  MoELayerOptions ep = options;
  ep.parallel = ParallelConfig::make(2, 1, 0, 1, /*enable_ep=*/true);
  layers.push_back(
      std::make_unique<MoELayer>(model, MoELayer::random_weights(model, ep, seed + 1), ep));
  const Device d = options.device.device();
  const int64_t H = model.hidden_size;
  Tensor x_dev = Tensor::empty({max_m, H}, options.dtype, d);
  Tensor logits_dev = Tensor::empty({max_m, model.num_experts}, DType::kF32, d);
  Tensor out_dev = Tensor::empty({max_m, H}, options.dtype, d);
  CudaStream stream_owner(d.index);
  const RunContext ctx{stream_owner.get(), &workspace};
  const Tolerance& tol = tolerance(layers[0]->tolerance_name());

  std::cout << fmt::format(
      "soak     {} for {:.1f} min on {}: M in [0, {}], routing random / skewed / one-expert / "
      "nan-rows / balanced, whole layer and EP rank 1 of 2, check every {} steps (tolerance "
      "{:.1e})\n",
      model.summary(), minutes, options.device.to_string(), max_m, check_every, tol.rel_l2);
  std::mt19937_64 rng(seed);
  auto forward = [&](MoELayer& layer, int64_t M, const Tensor& x_host, const Tensor& logits) {
    Tensor x = x_dev.slice(0, 0, M), lg = logits_dev.slice(0, 0, M), out = out_dev.slice(0, 0, M);
    synchronize(ctx.stream);  // the previous step no longer reads the input buffers
    x.copy_from(x_host);
    lg.copy_from(logits);
    layer.forward_into(out, x, lg, ctx);
    return out;
  };
  // Warm-up (first launches set up kernels), then the memory baseline.
  {
    Tensor x = Tensor::empty({max_m, H}, options.dtype);
    fill_uniform(x, seed + 3, 1.0f, Stream{});
    for (auto& layer : layers)
      forward(*layer, max_m, x, soak_logits(max_m, model, RoutingKind::kRandom, seed + 4));
    synchronize(ctx.stream);
  }
  const size_t baseline = cuda_memory_in_use(d.index);
  const auto t0 = std::chrono::steady_clock::now();
  const auto until = t0 + std::chrono::duration<double>(minutes * 60.0);
  int64_t steps = 0, tokens = 0, checks = 0, failures = 0;
  double worst = 0.0;
  while (std::chrono::steady_clock::now() < until) {
    const int64_t M = static_cast<int64_t>(rng() % static_cast<uint64_t>(max_m + 1));
    const RoutingKind kind = kKinds[rng() % std::size(kKinds)];
    const size_t which = rng() % layers.size();
    MoELayer& layer = *layers[which];
    Tensor x_host = Tensor::empty({M, H}, options.dtype);
    if (M > 0) fill_uniform(x_host, seed + 100 + static_cast<uint64_t>(steps), 1.0f, Stream{});
    const Tensor logits = soak_logits(M, model, kind, seed + 200 + static_cast<uint64_t>(steps));
    const Tensor out = forward(layer, M, x_host, logits);
    ++steps;
    tokens += M;
    if (steps % check_every != 0) continue;
    synchronize(ctx.stream);
    ++checks;
    const size_t in_use = cuda_memory_in_use(d.index);
    double err = 0.0;
    int64_t row = -1;
    if (M > 0) {
      row = static_cast<int64_t>(rng() % static_cast<uint64_t>(M));
      const Tensor x_row = x_host.slice(0, row, row + 1).clone();
      const Tensor logits_row = logits.slice(0, row, row + 1).clone();
      // The library's CPU router on the same logits row (the GPU router follows its convention).
      const RoutingResult r = layer.router().select_experts(x_row, logits_row);
      const std::vector<double> ref = reference_forward(layer, x_row, r, {0});
      const Tensor got = out.slice(0, row, row + 1).to(Device::cpu());
      err = relative_error(got, ref, {0});
      // A row whose routed weight sits on other ranks' experts (one-expert routing on the EP
      // layer) has an output far below the dtype's resolution (weights of e^-100): measure it
      // against the size of a typical output row instead of its own vanishing norm.
      double ref_sq = 0.0, diff_sq = 0.0;
      const std::vector<float> g = got.to_float_vector();
      for (size_t i = 0; i < ref.size(); ++i) {
        ref_sq += ref[i] * ref[i];
        diff_sq += (g[i] - ref[i]) * (g[i] - ref[i]);
      }
      const double floor = 1e-3 * std::sqrt(static_cast<double>(H));
      if (!std::isnan(err) && std::sqrt(ref_sq) < floor) err = std::sqrt(diff_sq) / floor;
    }
    const bool ok = !std::isnan(err) && err <= tol.rel_l2 && in_use == baseline;
    worst = std::max(worst, std::isnan(err) ? INFINITY : err);
    if (!ok) ++failures;
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::cout << fmt::format(
        "step {:>6}  {:>7.1f} s  M={:<6} {:<10} {:<5} row {:<6} rel err {:.2e}  device memory "
        "{:.3f} GB{}{}\n",
        steps, elapsed, M, kind_name(kind), which == 0 ? "whole" : "ep1", row, err, in_use / 1e9,
        in_use == baseline ? "" : fmt::format(" (baseline {:.3f})", baseline / 1e9),
        ok ? "" : "  FAILED");
  }
  const bool ok = failures == 0 && checks > 0;
  std::cout << fmt::format(
      "soak {}: {} steps, {} tokens, {} checks, worst rel err {:.2e}, device memory {:.3f} GB "
      "{}\n",
      ok ? "OK" : "FAILED", steps, tokens, checks, worst, baseline / 1e9,
      failures == 0 ? "constant" : fmt::format("({} failed checks)", failures));
  return ok ? 0 : 1;
}

}  // namespace moekit::cli
