// Checkpoint commands: `moekit run --checkpoint DIR --layer N` (one MoE layer of a HuggingFace
// checkpoint, checked against a float64 recomputation on its dequantized weights), `moekit
// explain --quant SCHEME | --checkpoint DIR` (the quantized oracle's decisions) and `moekit
// make-fixture` (small quantized checkpoints).
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <iostream>
#include <random>

#include "cli_common.h"
#include "moekit/core/error.h"
#include "moekit/core/tolerance.h"
#include "moekit/io/fixtures.h"
#include "moekit/layer/checkpoint.h"
#include "moekit/oracle/for_scheme.h"
#include "moekit/quantization/quark/quark_moe.h"

namespace moekit::cli {
namespace {

DType parse_dtype_or_throw(const std::string& name) {
  const auto d = parse_dtype(name);
  MOEKIT_CHECK(d.has_value(), "unknown dtype '{}'", name);
  return *d;
}

void print_quark_method(const quark::QuarkMoEMethod& m) {
  std::cout << fmt::format("method       {} (weight {}, activation {})\n", m.name(),
                           quant_key_to_string(m.weight_quant_key()),
                           quant_key_to_string(m.activation_quant_key()));
}

}  // namespace

int run_checkpoint_command(const DeploymentOptions& deployment, const std::string& dir, int layer,
                           int64_t tokens, uint64_t seed, int check_rows) {
  CheckpointLoadOptions options;
  options.dtype = parse_dtype_or_throw(deployment.dtype);
  options.backend = deployment.backend;
  options.max_num_tokens = std::max<int64_t>(deployment.max_num_tokens, tokens);
  const auto t0 = std::chrono::steady_clock::now();
  CheckpointMoELayer moe = load_moe_layer(dir, layer, options);
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "model    " << moe.model().summary() << "\n";
  std::cout << fmt::format("layer    {} of {} ({}), loaded in {:.2f} s\n", layer, dir, moe.scheme(),
                           load_s);
  std::cout << "\n" << moe.selection().to_string() << "\n";

  const int64_t H = moe.model().hidden_size;
  Tensor x = Tensor::empty({tokens, H}, options.dtype);
  {
    std::mt19937_64 rng(seed + 17);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (int64_t i = 0; i < x.numel(); ++i)
      store_float(x.data(), options.dtype, i, u(rng));
  }
  const Tensor logits =
      moe.router_weight().defined()
          ? moe.router_logits(x)
          : make_logits(tokens, moe.model().num_experts, moe.model().top_k, "random", seed + 29);
  const RoutingResult routing = moe.router().select_experts(x, logits);
  const auto t1 = std::chrono::steady_clock::now();
  const Tensor out = moe.forward(x, logits);
  const double fwd_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();

  std::vector<int64_t> rows;
  const int64_t n_check = std::min<int64_t>(check_rows, tokens);
  for (int64_t r = 0; r < n_check; ++r)
    rows.push_back(n_check == 1 ? 0 : r * (tokens - 1) / (n_check - 1));
  const std::vector<double> ref = reference_forward(moe, x, routing, rows);
  const std::vector<float> outs = out.to_float_vector();
  double num = 0, den = 0;
  for (size_t ri = 0; ri < rows.size(); ++ri) {
    for (int64_t h = 0; h < H; ++h) {
      const double d = outs[rows[ri] * H + h] - ref[ri * H + h];
      num += d * d;
      den += ref[ri * H + h] * ref[ri * H + h];
    }
  }
  const double rel = den > 0 ? std::sqrt(num / den) : (num > 0 ? INFINITY : 0.0);
  const Tolerance& tol = tolerance(moe.tolerance_name());
  const bool ok = !std::isnan(rel) && rel <= tol.rel_l2;
  std::cout << fmt::format("forward  {:.3f} ms for {} tokens ({})\n", fwd_s * 1e3, tokens,
                           moe.experts_name());
  std::cout << fmt::format(
      "check    {} rows vs float64 recomputation on the dequantized weights: relative error "
      "{:.3e} (tolerance {:.1e} for {}) -> {}\n",
      rows.size(), rel, tol.rel_l2, tol.name, ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}

int explain_quant_command(const DeploymentOptions& deployment, const std::string& scheme,
                          const std::string& checkpoint_dir) {
  if (!checkpoint_dir.empty()) {
    CheckpointLoadOptions options;
    options.dtype = parse_dtype_or_throw(deployment.dtype);
    options.backend = deployment.backend;
    const ModelPreset model = preset_from_hf_config(std::filesystem::path(checkpoint_dir));
    CheckpointMoELayer moe = load_moe_layer(checkpoint_dir, model.first_moe_layer, options);
    std::cout << "model        " << moe.model().summary() << "\n";
    std::cout << "deployment   " << moe.moe_config().to_string() << "\n";
    std::cout << "quantization " << moe.scheme() << " (" << moe.quant_config().describe() << ")\n";
    if (moe.quark_method()) print_quark_method(*moe.quark_method());
    std::cout << "\n";
    const OracleReport report = explain_for_scheme(moe.moe_config(), moe.quant_config());
    std::cout << report.to_string() << "\n";
    return report.ok() ? 0 : 1;
  }
  const ModelPreset model = deployment.model_preset();
  const MoELayerOptions options = deployment.layer_options();
  const MoEConfig moe = MoELayer::make_moe_config(model, options);
  std::cout << "model        " << model.summary() << "\n";
  std::cout << "deployment   " << moe.to_string() << "\n";
  const std::string json = io::fixture_quantization_config(scheme);
  if (json.empty()) {
    std::cout << "quantization unquantized\n\n";
    const OracleReport report = explain_for_scheme(moe, QuantConfig::unquantized());
    std::cout << report.to_string() << "\n";
    return report.ok() ? 0 : 1;
  }
  const quark::QuarkConfig qc = quark::QuarkConfig::parse(json);
  const quark::QuarkMoETarget target =
      quark::get_moe_method_target(qc, "model.layers.0.mlp.experts");
  const auto method = quark::get_moe_method(qc, moe, target);
  std::cout << "quantization quark " << scheme << "\n";
  print_quark_method(*method);
  std::cout << "\n" << method->selection().to_string() << "\n";
  return method->selection().ok() ? 0 : 1;
}

int make_fixture_command(const std::string& scheme, const std::string& out,
                         const std::string& model, uint64_t seed, int shards) {
  std::vector<std::string> schemes = {scheme};
  if (scheme == "all") schemes = io::fixture_schemes();
  for (const std::string& s : schemes) {
    const std::filesystem::path dir =
        scheme == "all" ? std::filesystem::path(out) / s : std::filesystem::path(out);
    io::FixtureOptions o;
    o.scheme = s;
    o.model = model;
    o.seed = seed;
    o.num_shards = shards;
    io::write_fixture_checkpoint(dir, o);
    std::cout << fmt::format("wrote {} checkpoint ({}) to {}\n", s, model, dir.string());
  }
  return 0;
}

}  // namespace moekit::cli
