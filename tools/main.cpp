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

  CLI11_PARSE(app, argc, argv);
  try {
    if (*run) return run_command(run_deployment, tokens, seed, check_rows, routing);
    if (*explain) return explain_command(explain_deployment);
  } catch (const moekit::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
