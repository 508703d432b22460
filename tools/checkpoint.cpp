// Checkpoint commands: `moekit run --checkpoint DIR --layer N` (one MoE layer of a HuggingFace
// checkpoint, checked against a float64 recomputation on its dequantized weights), `moekit
// explain --quant SCHEME | --checkpoint DIR` (the quantized oracle's decisions) and `moekit
// make-fixture` (small quantized checkpoints).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <random>

#include "cli_common.h"
#include "moekit/config/quant_factories.h"
#include "moekit/core/error.h"
#include "moekit/io/fixtures.h"
#include "moekit/layer/checkpoint.h"
#include "moekit/oracle/plan.h"
#include "moekit/quantization/quark/quark_moe.h"

namespace moekit::cli {
namespace {

void print_quark_method(const quark::QuarkMoEMethod& m) {
  std::cout << fmt::format("method       {} (weight {}, activation {})\n", m.name(),
                           quant_key_to_string(m.weight_quant_key()),
                           quant_key_to_string(m.activation_quant_key()));
}

}  // namespace

int run_checkpoint_command(const DeploymentOptions& deployment, const std::string& dir, int layer,
                           int64_t tokens, uint64_t seed, int check_rows,
                           const std::string& routing) {
  MoELayerOptions options = deployment.layer_options();
  options.max_num_tokens = std::max<int64_t>(options.max_num_tokens, std::max<int64_t>(tokens, 1));
  options.check_finite_weights = true;  // a NaN weight would make the float64 check meaningless
  // TP under mpirun: each rank loads its slice; the check sums the ranks' outputs.
  const std::shared_ptr<Communicator> tp = attach_tp_communicator(deployment, options);
  const std::string prefix = tp ? fmt::format("rank {}/{}: ", tp->rank(), tp->world_size()) : "";
  const auto t0 = std::chrono::steady_clock::now();
  CheckpointInfo info;
  MoELayer moe = load_moe_layer(dir, layer, options, &info);
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!tp || tp->rank() == 0) {
    std::cout << "model    " << moe.model().summary() << "\n";
    std::cout << fmt::format("layer    {} of {} ({}: {}), loaded in {:.2f} s\n", layer, dir,
                             info.method, moe.scheme(), load_s);
    std::cout << "\n" << moe.plan().to_string() << "\n";
  }

  const int64_t H = moe.model().hidden_size;
  Tensor x = Tensor::empty({tokens, H}, options.dtype);
  {
    std::mt19937_64 rng(seed + 17);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (int64_t i = 0; i < x.numel(); ++i)
      store_float(x.data(), options.dtype, i, u(rng));
  }
  // The checkpoint's own router computes the logits; synthetic ones only when asked for.
  const bool has_router = moe.weights().router_weight.defined();
  MOEKIT_CHECK(!has_router || routing.empty(),
               "--routing {} cannot be used with this checkpoint: layer {} has a router (gate) "
               "weight, which computes the logits",
               routing, layer);
  MOEKIT_CHECK(has_router || !routing.empty(),
               "layer {} of {} has no router (gate) weight: pass --routing random|balanced|skewed "
               "to run it with synthetic router logits",
               layer, dir);
  if (!has_router) std::cout << "routing  synthetic " << routing << " router logits\n";
  const Tensor logits = has_router ? moe.router_logits(x)
                                   : make_logits(tokens, moe.model().num_experts, moe.model().top_k,
                                                 routing, seed + 29);
  return forward_and_check(moe, x, logits, check_rows, {}, prefix, tp.get());
}

int explain_quant_command(const DeploymentOptions& deployment, const std::string& scheme,
                          const std::string& checkpoint_dir) {
  const bool from_checkpoint = !checkpoint_dir.empty();
  const ModelPreset model = from_checkpoint
                                ? preset_from_hf_config(std::filesystem::path(checkpoint_dir))
                                : deployment.model_preset();
  const MoELayerOptions options = deployment.planning_options();
  const MoEConfig moe = MoELayer::make_moe_config(model, options);
  std::cout << "model        " << model.summary() << "\n";
  std::cout << "deployment   " << moe.to_string() << "\n";
  std::cout << device_note(options.device);
  std::optional<quark::QuarkConfig> qc;
  if (from_checkpoint) {
    qc = read_quark_config(checkpoint_dir);
  } else if (const std::string json = io::fixture_quantization_config(scheme); !json.empty()) {
    qc = quark::QuarkConfig::parse(json);
  }
  const std::string layer_name = fmt::format("model.layers.{}.mlp.experts", model.first_moe_layer);
  PlanOptions plan_options;
  plan_options.log = false;
  plan_options.preview = true;
  if (!qc || qc->is_excluded(layer_name)) {
    std::cout << "quantization unquantized\n\n";
    const MoEPlan plan = plan_moe(moe, QuantConfig::unquantized(), plan_options);
    std::cout << plan.to_string();
    return plan.ok() ? 0 : 1;
  }
  const quark::QuarkMoETarget target = quark::get_moe_method_target(*qc, layer_name);
  const auto method = quark::get_moe_method(*qc, moe, target);
  std::cout << "quantization " << (from_checkpoint ? checkpoint_dir : scheme)
            << " (through the Quark MoE methods)\n";
  print_quark_method(*method);
  std::cout << "\n" << method->plan().to_string();
  return method->plan().ok() ? 0 : 1;
}

int make_fixture_command(const std::string& scheme, const std::string& out,
                         const std::string& model, uint64_t seed, int shards) {
  std::vector<std::string> schemes = {scheme};
  if (scheme == "all") schemes = io::fixture_schemes();
  for (const std::string& s : schemes) {
    const std::filesystem::path dir =
        scheme == "all" ? std::filesystem::path(out) / s : std::filesystem::path(out);
    // "all": every scheme the model takes, and gpt-oss's format (on tiny-gpt-oss) beside the
    // Quark schemes of a per-expert model.
    std::string m = model;
    if (scheme == "all" && !io::fixture_scheme_fits(s, model)) {
      if (!io::fixture_scheme_fits(s, "tiny-gpt-oss") ||
          !io::fixture_scheme_fits("fp8_per_tensor", model)) {
        continue;
      }
      m = "tiny-gpt-oss";
    }
    io::FixtureOptions o;
    o.scheme = s;
    o.model = m;
    o.seed = seed;
    o.num_shards = shards;
    io::write_fixture_checkpoint(dir, o);
    std::cout << fmt::format("wrote {} checkpoint ({}) to {}\n", s, m, dir.string());
  }
  return 0;
}

}  // namespace moekit::cli
