#include "cli_common.h"

#include <fmt/format.h>

#include <unistd.h>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>

#include "moekit/core/error.h"

namespace moekit::cli {

void BenchKernelsOptions::add_to(CLI::App& app) {
  app.add_option("--kernels", kernels, "router-align, gemm1")->capture_default_str();
  app.add_option("--tokens", tokens, "batch sizes M")->capture_default_str();
  app.add_option("--reps", reps, "timed graph replays per case (median)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--tile", tile, "gemm1: a 16-bit tile-table name (the error lists them) or all")
      ->capture_default_str();
}

void DeploymentOptions::add_to(CLI::App& app) {
  model_option = app.add_option("--model", model,
                                "model preset (mixtral-8x7b, qwen3-30b-a3b, deepseek-v3, "
                                "gpt-oss-120b, llama4-scout, tiny, small, small-deepseek, "
                                "small-gpt-oss)")
                     ->capture_default_str();
  config_option = app.add_option("--config", config_json,
                                 "HuggingFace config.json (or its directory) instead of a preset")
                      ->excludes(model_option);
  app.add_option("--dtype", dtype, "activation/weight dtype: bf16, f16, f32")
      ->check(CLI::IsMember({"bf16", "f16", "f32", "bfloat16", "float16", "float32"}))
      ->capture_default_str();
  app.add_option("--device", device, "cpu, auto (the GPU if present), h200, h100, a100, b200")
      ->capture_default_str();
  app.add_option("--backend", backend,
                 "force an experts backend by name (auto: the oracle chooses; also "
                 "MOEKIT_MOE_BACKEND)")
      ->capture_default_str();
  app.add_option("--tp", tp_size, "tensor-parallel size")->check(CLI::PositiveNumber);
  app.add_option("--dp", dp_size, "data-parallel size")->check(CLI::PositiveNumber);
  app.add_option("--dp-rank", dp_rank, "this rank's data-parallel index")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--tp-rank", tp_rank,
                 "this rank's tensor-parallel index (its slice of every expert's intermediate "
                 "size; a checkpoint's tensors are sliced for it)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--ep", enable_ep, "expert parallelism across the tp*dp ranks");
  app.add_option("--all2all", all2all,
                 "EP token exchange: naive, allgather_reducescatter, nccl_all2all, "
                 "batched_low_latency, megakernel")
      ->capture_default_str();
  app.add_flag("--batch-invariant", batch_invariant,
               "a token's output independent of the other tokens in its batch (also "
               "MOEKIT_BATCH_INVARIANT=1)");
  app.add_option("--shared-experts", shared_experts,
                 "auto, folded (extra routed experts every token visits) or separate (their own "
                 "pass)")
      ->capture_default_str();
  max_tokens_option =
      app.add_option("--max-tokens", max_num_tokens,
                     "max tokens per forward (sizes workspaces; with --all2all "
                     "batched_low_latency the per-rank capacity, default the run's tokens)")
          ->check(CLI::PositiveNumber)
          ->capture_default_str();
}

ModelPreset DeploymentOptions::model_preset() const {
  return config_json.empty() ? find_preset(model) : preset_from_hf_config(config_json);
}

MoELayerOptions DeploymentOptions::layer_options() const {
  MoELayerOptions o;
  const auto parsed = parse_dtype(dtype);
  MOEKIT_CHECK(parsed.has_value(), "unknown dtype '{}'", dtype);
  o.dtype = *parsed;
  o.device = device_info_by_name(device);
  All2AllBackend a2a = All2AllBackend::kNaive;
  MOEKIT_CHECK(parse_all2all_backend(all2all, &a2a), "unknown all2all backend '{}'", all2all);
  o.parallel = ParallelConfig::make(tp_size, dp_size, dp_rank, tp_rank, enable_ep, a2a);
  o.backend = backend;
  o.tile_config = tile_config;
  o.batch_invariant = batch_invariant;
  MOEKIT_CHECK(parse_shared_experts_mode(shared_experts, &o.shared_experts),
               "unknown --shared-experts '{}' (auto, folded, separate)", shared_experts);
  o.max_num_tokens = max_num_tokens;
  return o;
}

MoELayerOptions DeploymentOptions::planning_options() const {
  MoELayerOptions o = layer_options();
  if (!o.device.present) o.device.preview = true;
  return o;
}

std::string device_note(const DeviceInfo& device) {
  if (!device.preview) return {};
  return fmt::format(
      "note         preview: {} is not present here{}; the tables show the decision on it\n",
      device.to_string(), built_with_cuda() ? "" : " and this build has no CUDA");
}

Tensor make_logits(int64_t M, int E, int k, const std::string& dist, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> v(static_cast<size_t>(M * E));
  for (int64_t m = 0; m < M; ++m) {
    for (int e = 0; e < E; ++e) {
      float x = normal(rng);
      if (dist == "balanced") {
        const int64_t offset = ((e - m * k) % E + E) % E;
        if (offset < k) x += 8.f;
      } else if (dist == "skewed") {
        x -= 4.f * static_cast<float>(e) / static_cast<float>(E);
      }
      v[m * E + e] = x;
    }
  }
  return Tensor::from_floats(v, {M, E}, DType::kF32);
}

void with_elapsed_display(const std::string& label, const std::function<void()>& work) {
  std::mutex mutex;
  std::condition_variable cv;
  bool finished = false;
  std::thread ticker([&] {
    const auto start = std::chrono::steady_clock::now();
    bool shown = false;
    std::unique_lock<std::mutex> lock(mutex);
    while (!cv.wait_for(lock, std::chrono::milliseconds(250), [&] { return finished; })) {
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (s < 1.0) continue;
      shown = true;
      std::fprintf(stderr, "\r%-28s ... %5.1fs", label.c_str(), s);
      std::fflush(stderr);
    }
    if (shown) std::fprintf(stderr, "\r%-28s ... done\n", label.c_str());
  });
  try {
    work();
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      finished = true;
    }
    cv.notify_all();
    ticker.join();
    throw;
  }
  {
    std::lock_guard<std::mutex> lock(mutex);
    finished = true;
  }
  cv.notify_all();
  ticker.join();
}

Progress::Progress(std::string label)
    : label_(std::move(label)), start_(std::chrono::steady_clock::now()) {}

void Progress::update(double fraction) {
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const int percent = static_cast<int>(fraction * 100.0);
  if (elapsed < 1.0 || percent == last_percent_) return;  // only for work that takes a while
  last_percent_ = percent;
  shown_ = true;
  const int width = 30;
  const int filled = percent * width / 100;
  std::fprintf(stderr, "\r%-28s [%s%s] %3d%% %5.1fs", label_.c_str(),
               std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(), percent,
               elapsed);
  std::fflush(stderr);
}

void Progress::done() {
  if (shown_) {
    update(1.0);
    std::fprintf(stderr, "\n");
  }
}

}  // namespace moekit::cli
