// moekit: the command line. `moekit run` runs one MoE layer on random data and checks it against a
// float64 recomputation; `moekit explain` prints the oracle's decision table; `moekit bench` times
// the layer and its stages on a GPU; `moekit tune` times each GEMM tile and writes a tile table.
#include <CLI/CLI.hpp>

#include <iostream>

#include "cli_common.h"
#include "core/cuda_seam.h"
#include "moekit/core/error.h"
#include "moekit/core/logging.h"

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
  CLI::Option* run_routing =
      run->add_option("--routing", routing, "router logits: random, balanced or skewed")
          ->check(CLI::IsMember({"random", "balanced", "skewed"}));
  std::string run_checkpoint;
  int run_layer = -1;
  CLI::Option* run_checkpoint_option =
      run->add_option("--checkpoint", run_checkpoint,
                      "HuggingFace checkpoint directory (config.json + *.safetensors): run one of "
                      "its MoE layers instead of random weights")
          ->excludes(run_deployment.model_option)
          ->excludes(run_deployment.config_option);
  run->add_option("--layer", run_layer,
                  "with --checkpoint: the layer index (default: the first MoE layer)")
      ->check(CLI::Range(0, 1 << 20))
      ->needs(run_checkpoint_option);

  DeploymentOptions explain_deployment;
  CLI::App* explain = app.add_subcommand(
      "explain", "Print the oracle's decision table for a deployment without running anything");
  explain_deployment.add_to(*explain);
  std::string explain_quant;
  std::string explain_checkpoint;
  CLI::Option* explain_quant_option = explain->add_option(
      "--quant", explain_quant,
      "quantization scheme (a make-fixture scheme name, e.g. fp8_per_channel, nvfp4, mxfp4_a4, "
      "w4a8_fp8_g128): the Quark method and its oracle's decisions");
  explain
      ->add_option("--checkpoint", explain_checkpoint,
                   "read the model and the scheme from this checkpoint's config.json")
      ->excludes(explain_quant_option)
      ->excludes(explain_deployment.model_option)
      ->excludes(explain_deployment.config_option);

  std::string fixture_scheme;
  std::string fixture_out;
  std::string fixture_model = "tiny";
  uint64_t fixture_seed = 0;
  int fixture_shards = 1;
  CLI::App* fixture = app.add_subcommand(
      "make-fixture", "Write a small HuggingFace-layout checkpoint of one quantization scheme");
  fixture->add_option("--scheme", fixture_scheme, "scheme name, or 'all' (one subdirectory each)")
      ->required();
  fixture->add_option("--out", fixture_out, "output directory")->required();
  fixture
      ->add_option("--model", fixture_model,
                   "tiny, tiny-mixtral, tiny-deepseek, tiny-qwen2-moe, tiny-gpt-oss (gpt-oss's "
                   "fused layout: bf16 and hf_mxfp4) or tiny-llama4 (Llama 4's: bf16)")
      ->capture_default_str();
  fixture->add_option("--seed", fixture_seed, "random seed of the weights");
  fixture
      ->add_option("--shards", fixture_shards,
                   "number of safetensors files (> 1 adds model.safetensors.index.json)")
      ->check(CLI::PositiveNumber);

  // The options `moekit bench` and `moekit tune` share.
  auto add_bench_options = [](CLI::App& cmd, DeploymentOptions& deployment, BenchOptions& options) {
    deployment.add_to(cmd);
    cmd.add_option("--models", options.models, "model presets to time")
        ->capture_default_str()
        ->excludes(deployment.config_option);
    cmd.add_option("--tokens", options.tokens, "batch sizes M")->capture_default_str();
    cmd.add_option("--routing", options.routing, "random, balanced or skewed")
        ->check(CLI::IsMember({"random", "balanced", "skewed"}))
        ->capture_default_str();
    cmd.add_flag("--plain-topk", options.plain_topk,
                 "route every model with softmax top-k + renormalize, as the Triton peer does "
                 "(deepseek-v3's grouped routing touches fewer experts)");
    cmd.add_option("--reps", options.reps, "timed graph replays per case (median)")
        ->check(CLI::PositiveNumber);
    cmd.add_option("--json", options.json_path, "also write the results as JSON to this file");
    cmd.add_option(
           "--quant", options.quant,
           "weights: bf16 (unquantized) or a quantized scheme (fp8_block128, "
           "fp8_per_tensor alias fp8_tensor, fp8_per_channel alias fp8_channel_token, int8_w8a8 "
           "(per-channel weights, per-token "
           "activations), int8_per_tensor, "
           "w4a8_fp8, w4a8_fp8_g128 (int4 groups of 128), nvfp4, mxfp4_w4a16, ...): random weights "
           "of that scheme; TB/s counts its "
           "packed bytes + scales")
        ->capture_default_str();
  };
  DeploymentOptions bench_deployment;
  BenchOptions bench_options;
  CLI::App* bench = app.add_subcommand(
      "bench",
      "Time the layer and each stage on the GPU (CUDA events over CUDA-graph replays, "
      "weights rotated past L2) and compare with the device's measured peaks");
  add_bench_options(*bench, bench_deployment, bench_options);
  std::string bench_tile = "auto";
  bench->add_option("--tile", bench_tile, "force the experts' GEMM tile (auto, or a table name)")
      ->capture_default_str();

  DeploymentOptions tune_deployment;
  BenchOptions tune_options;
  CLI::App* tune = app.add_subcommand(
      "tune",
      "Time GEMM1 and GEMM2 on every tile of the layer's family at each batch size (as bench "
      "does) and write the fastest as a tile table for MOEKIT_TILE_TABLES or data/tile_tables/");
  add_bench_options(*tune, tune_deployment, tune_options);
  tune->add_option("--out", tune_options.tune_out, "the tile table to write (JSON)")->required();

  DeploymentOptions soak_deployment;
  soak_deployment.max_num_tokens = 16384;
  double soak_minutes = 10;
  int soak_check_every = 5;
  uint64_t soak_seed = 1;
  CLI::App* soak = app.add_subcommand(
      "soak",
      "Run forward_into on the GPU for minutes with random batch sizes in [0, --max-tokens] and "
      "random / degenerate routing, checking sampled rows against float64 and device memory");
  soak_deployment.add_to(*soak);
  soak->add_option("--minutes", soak_minutes, "how long to run")->check(CLI::PositiveNumber);
  soak->add_option("--check-every", soak_check_every, "steps between checks")
      ->check(CLI::PositiveNumber);
  soak->add_option("--seed", soak_seed, "random seed");

  DeploymentOptions bench_ep_deployment;
  bench_ep_deployment.model = "small-deepseek";
  bench_ep_deployment.enable_ep = true;
  std::vector<int64_t> bench_ep_tokens = {1, 16, 64, 256};
  int bench_ep_reps = 10;
  CLI::App* bench_ep = app.add_subcommand(
      "bench-ep",
      "Under mpirun (--ep --dp N): time an expert-parallel layer's dispatch, experts and combine "
      "apart, beside the communicator's all_to_all_v of the same token rows");
  bench_ep_deployment.add_to(*bench_ep);
  bench_ep->add_option("--tokens", bench_ep_tokens, "tokens per rank (M)")->capture_default_str();
  bench_ep->add_option("--reps", bench_ep_reps, "timed forwards per size (median)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();

  BenchKernelsOptions bench_kernels_options;
  CLI::App* bench_kernels = app.add_subcommand(
      "bench-kernels",
      "Time the router + align and grouped-GEMM kernels alone on the GPU (CUDA-graph replays)");
  bench_kernels_options.add_to(*bench_kernels);

  // Usage errors (unknown or conflicting flags, bad values) exit with 2, like every other error.
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  std::cout << std::unitbuf;  // progress survives a killed or piped run
  try {
    (void)moekit::log::level();  // an unknown MOEKIT_LOG_LEVEL is an error for every command
    if (*run && !run_checkpoint.empty()) {
      if (run_layer < 0) run_layer = moekit::preset_from_hf_config(run_checkpoint).first_moe_layer;
      return run_checkpoint_command(run_deployment, run_checkpoint, run_layer, tokens, seed,
                                    check_rows, run_routing->count() > 0 ? routing : "");
    }
    if (*run) return run_command(run_deployment, tokens, seed, check_rows, routing);
    if (*explain && (!explain_quant.empty() || !explain_checkpoint.empty())) {
      return explain_quant_command(explain_deployment, explain_quant, explain_checkpoint);
    }
    if (*explain) return explain_command(explain_deployment);
    if (*fixture) {
      return make_fixture_command(fixture_scheme, fixture_out, fixture_model, fixture_seed,
                                  fixture_shards);
    }
    if (*bench_ep) return bench_ep_command(bench_ep_deployment, bench_ep_tokens, bench_ep_reps);
    if (*bench_kernels) {
      if constexpr (moekit::kCudaBuild) {
        return bench_kernels_command(bench_kernels_options);
      } else {
        moekit::throw_no_cuda("moekit bench-kernels");
      }
    }
    if (*soak) return soak_command(soak_deployment, soak_minutes, soak_check_every, soak_seed);
    if (*bench && bench_deployment.enable_ep) {
      // `moekit bench --ep`: the expert-parallel bench (bench-ep) of one model under mpirun; the
      // single-GPU options have no meaning there and are refused rather than ignored.
      const auto given = [&](const char* name) { return bench->get_option(name)->count() > 0; };
      for (const char* name : {"--json", "--quant", "--routing", "--plain-topk", "--tile"}) {
        MOEKIT_CHECK(!given(name),
                     "moekit bench --ep (the expert-parallel bench, as bench-ep) takes --models "
                     "with one preset, --tokens and --reps; {} is for the single-GPU bench",
                     name);
      }
      MOEKIT_CHECK(given("--models") && bench_options.models.size() == 1,
                   "moekit bench --ep times one model: give --models with one preset (got {})",
                   bench_options.models.size());
      bench_deployment.model = bench_options.models.front();
      return bench_ep_command(bench_deployment, bench_options.tokens, bench_options.reps);
    }
    if (*bench) {
      bench_deployment.tile_config = bench_tile;
      return bench_command(bench_deployment, bench_options);
    }
    if (*tune) return bench_command(tune_deployment, tune_options);
  } catch (const moekit::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
