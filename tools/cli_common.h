// Shared pieces of the moekit command line: the deployment options every command takes, and a
// small progress display.
#pragma once

#include <CLI/CLI.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "moekit/layer/moe_layer.h"
#include "moekit/layer/reference.h"

namespace moekit::cli {

struct DeploymentOptions {
  std::string model = "qwen3-30b-a3b";
  std::string config_json;  // a HuggingFace config.json (or its directory) instead of a preset
  std::string dtype = "bf16";
  std::string device = "auto";  // cpu, auto (the GPU if present), h200, h100, ...
  std::string backend = "auto";
  std::string tile_config = "auto";     // `bench --tile`
  bool batch_invariant = false;         // --batch-invariant (MoELayerOptions::batch_invariant)
  std::string shared_experts = "auto";  // --shared-experts (MoELayerOptions::shared_experts)
  int tp_size = 1;
  int dp_size = 1;
  int dp_rank = 0;
  int tp_rank = 0;
  bool enable_ep = false;
  std::string all2all = "naive";
  int64_t max_num_tokens = 8192;
  // The options whose presence other options exclude (set by add_to).
  CLI::Option* model_option = nullptr;
  CLI::Option* config_option = nullptr;
  CLI::Option* max_tokens_option = nullptr;

  void add_to(CLI::App& app);
  ModelPreset model_preset() const;
  MoELayerOptions layer_options() const;
  // layer_options() for planning (`explain`): a named device that is not here becomes a preview,
  // so the table shows the decision on that device.
  MoELayerOptions planning_options() const;
};

// "note ..." lines about the device of a plan (a preview of a device that is not here).
std::string device_note(const DeviceInfo& device);

// Prints "label [#####.....] 50%" on stderr, redrawn in place; only when the work takes a while.
class Progress {
 public:
  explicit Progress(std::string label);
  void update(double fraction);
  void done();

 private:
  std::string label_;
  std::chrono::steady_clock::time_point start_;
  int last_percent_ = -1;
  bool shown_ = false;
};

// Runs `work` while a thread redraws "label ... 3.2 s" on stderr (after the first second), for
// steps that take a while but report no fraction (weight generation, building a layer).
void with_elapsed_display(const std::string& label, const std::function<void()>& work);

// Router logits (M, E) f32 on the CPU: random normal; balanced (token m prefers experts m*k ..
// m*k+k-1); skewed (low expert ids much more likely).
Tensor make_logits(int64_t M, int E, int k, const std::string& dist, uint64_t seed);

// For a deployment that exchanges tokens between ranks (DP + EP): the job's communicator (MPI for
// CPU ranks, NCCL for GPU ranks) into options, this process's rank into options.parallel; false
// (options untouched) for one that does not. Throws when the job's size is not the deployment's.
bool attach_communicator(const DeploymentOptions& deployment, MoELayerOptions& options);
// For a tensor-parallel job under mpirun (--tp N, no --ep, N processes): the job's MPI
// communicator, this process's rank as options.parallel's tp_rank; null (options untouched) for a
// single process, which runs the --tp-rank it was given. Throws when the job's size is not N.
std::shared_ptr<Communicator> attach_tp_communicator(const DeploymentOptions& deployment,
                                                     MoELayerOptions& options);
int run_command(const DeploymentOptions& deployment, int64_t tokens, uint64_t seed, int check_rows,
                const std::string& routing_dist);
// Forwards x (M, H) with logits (M, E) (both on the CPU; moved to the layer's device) and checks
// `check_rows` sampled rows against layer/reference.h. Prints the result; 0 when within the
// scheme's tolerance. `all_experts`: the reference's expert source when the layer's tokens visit
// other ranks' experts (DP + EP); `prefix` starts the result lines ("rank 1/2: "); `tp_sum`: the
// tensor-parallel ranks' communicator: the output and the recomputation checked are their sums
// over the ranks (what the engine's all-reduce makes of the partial outputs).
int forward_and_check(MoELayer& layer, const Tensor& x_host, const Tensor& logits_host,
                      int check_rows, const ExpertSource& all_experts = {},
                      const std::string& prefix = "", Communicator* tp_sum = nullptr);
int explain_command(const DeploymentOptions& deployment);
// tools/bench_ep.cpp: `moekit bench-ep` under mpirun (dispatch / experts / combine, all2all).
int bench_ep_command(const DeploymentOptions& deployment, const std::vector<int64_t>& tokens,
                     int reps);
// tools/checkpoint.cpp: `run --checkpoint DIR --layer N`, `explain --quant S | --checkpoint DIR`,
// `make-fixture`.
// `routing`: the --routing value when the user gave one (synthetic logits for a checkpoint without
// a router weight; an error for one with it), else "".
int run_checkpoint_command(const DeploymentOptions& deployment, const std::string& dir, int layer,
                           int64_t tokens, uint64_t seed, int check_rows,
                           const std::string& routing);
int explain_quant_command(const DeploymentOptions& deployment, const std::string& scheme,
                          const std::string& checkpoint_dir);
int make_fixture_command(const std::string& scheme, const std::string& out,
                         const std::string& model, uint64_t seed, int shards);
// tools/soak.cpp: forward_into for `minutes` with random sizes and routing, a sampled row checked
// every `check_every` steps, device memory watched. 0 when every check passed.
int soak_command(const DeploymentOptions& deployment, double minutes, int check_every,
                 uint64_t seed);
// What `moekit bench` times beside the deployment.
struct BenchOptions {
  std::vector<std::string> models = {"mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3",
                                     "gpt-oss-120b"};
  std::vector<int64_t> tokens = {1, 16, 64, 256, 1024, 4096, 16384};
  std::string routing = "random";  // router logits: random, balanced, skewed
  bool plain_topk = false;         // every model routed with softmax top-k (bench_work.h)
  int reps = 20;
  std::string json_path;       // also write JSON here when set
  std::string quant = "bf16";  // "bf16" or a make-fixture scheme (random_quantized_layer)
  // `moekit tune`: at each M, GEMM1 and GEMM2 timed (stage events) on every tile of the layer's
  // family and the fastest of each written here as a tile table
  // (src/experts/cuda/sm90/tile_tables.h); empty for `moekit bench`.
  std::string tune_out;
};
int bench_command(const DeploymentOptions& deployment, const BenchOptions& bench);
// `moekit bench-kernels`: the router + align ("router-align") and grouped GEMM1 ("gemm1") kernels
// timed alone.
struct BenchKernelsOptions {
  std::vector<std::string> kernels = {"router-align", "gemm1"};
  std::vector<int64_t> tokens = {1, 16, 64, 1024, 16384};
  int reps = 50;             // timed graph replays per case (median)
  std::string tile = "all";  // gemm1: a tile-table name or "all"

  void add_to(CLI::App& app);
};
// tools/bench_kernels.cpp, built only with CUDA: call it under `if constexpr (kCudaBuild)`.
int bench_kernels_command(const BenchKernelsOptions& options);

}  // namespace moekit::cli
