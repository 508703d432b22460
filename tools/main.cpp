// moekit: the command line. `moekit run` runs one MoE layer on random data and checks it against a
// float64 recomputation; `moekit explain` prints the oracle's decision table; `moekit bench` times
// the layer and its stages on a GPU.
#include <CLI/CLI.hpp>

#include <iostream>

#include "cli_common.h"
#include "moekit/core/error.h"

int main(int argc, char** argv) {
  using namespace moekit::cli;
  CLI::App app{"moekit: a modular fused Mixture-of-Experts layer for LLM inference"};
  app.require_subcommand(1);

  DeploymentOptions run_deployment;
  int64_t tokens = 16;
  uint64_t seed = 0;
  int check_rows = 8;
  std::string routing = "random";
  CLI::App* run = app.add_subcommand(
      "run",
      "Build one MoE layer with seeded random weights, route a batch, run it, and compare "
      "sampled output rows with a float64 recomputation");
  run_deployment.add_to(*run);
  run->add_option("-m,--tokens", tokens, "tokens in the batch (M)")->check(CLI::NonNegativeNumber);
  run->add_option("--seed", seed, "random seed of weights and inputs");
  run->add_option("--check-rows", check_rows, "output rows compared with the float64 recomputation")
      ->check(CLI::NonNegativeNumber);
  run->add_option("--routing", routing, "router logits: random, balanced or skewed")
      ->check(CLI::IsMember({"random", "balanced", "skewed"}));

  DeploymentOptions explain_deployment;
  CLI::App* explain = app.add_subcommand(
      "explain", "Print the oracle's decision table for a deployment without running anything");
  explain_deployment.add_to(*explain);

  DeploymentOptions bench_deployment;
  std::vector<std::string> bench_models = {"mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3",
                                           "gpt-oss-120b"};
  std::vector<int64_t> bench_tokens = {1, 16, 64, 256, 1024, 4096, 16384};
  std::string bench_routing = "random";
  int bench_reps = 20;
  std::string bench_json;
  CLI::App* bench = app.add_subcommand(
      "bench",
      "Time the layer and each stage on the GPU (CUDA events over CUDA-graph replays, "
      "weights rotated past L2) and compare with the device's measured peaks");
  bench_deployment.add_to(*bench);
  bench->add_option("--models", bench_models, "model presets to time")->capture_default_str();
  bench->add_option("--tokens", bench_tokens, "batch sizes M")->capture_default_str();
  bench->add_option("--routing", bench_routing, "random, balanced or skewed")
      ->check(CLI::IsMember({"random", "balanced", "skewed"}))
      ->capture_default_str();
  bench->add_option("--reps", bench_reps, "timed graph replays per case (median)")
      ->check(CLI::PositiveNumber);
  bench->add_option("--json", bench_json, "also write the results as JSON to this file");

  CLI11_PARSE(app, argc, argv);
  try {
    if (*run) return run_command(run_deployment, tokens, seed, check_rows, routing);
    if (*explain) return explain_command(explain_deployment);
    if (*bench) {
      return bench_command(bench_deployment, bench_models, bench_tokens, bench_routing, bench_reps,
                           bench_json);
    }
  } catch (const moekit::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
