// `moekit bench-ep`: an expert-parallel layer (DP + EP, one process per rank under mpirun) with
// dispatch, experts and combine timed apart, beside the communicator's all_to_all_v of the bytes
// an ideal dispatch + combine moves (every token slot to a uniformly random rank and back), in the
// same run. Stage times are host timestamps taken after synchronising the stream at each stage
// boundary (so GPU stages do not overlap here: the sum is an upper bound of a forward), median
// over the repetitions, the slowest rank's.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <map>
#include <random>
#include <vector>

#include "cli_common.h"
#include "moekit/core/error.h"

namespace moekit::cli {
namespace {

using Clock = std::chrono::steady_clock;

// The time of each stage since the previous boundary, for one forward.
class StageClock final : public StageObserver {
 public:
  void start(Stream stream) {
    synchronize_if_any(stream);
    last_ = Clock::now();
    us_.clear();
  }
  void stage_done(std::string_view stage, Stream stream) const override {
    synchronize_if_any(stream);
    const auto now = Clock::now();
    us_[std::string(stage)] += std::chrono::duration<double, std::micro>(now - last_).count();
    last_ = now;
  }
  const std::map<std::string, double>& us() const { return us_; }

 private:
  static void synchronize_if_any(Stream stream) {
    if (stream.handle != nullptr) synchronize(stream);
  }
  mutable Clock::time_point last_;
  mutable std::map<std::string, double> us_;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The slowest rank's value (microseconds, to 0.01).
double slowest(Communicator& comm, double us) {
  const std::vector<int64_t> all = comm.all_gather_host(static_cast<int64_t>(us * 100.0));
  return static_cast<double>(*std::max_element(all.begin(), all.end())) / 100.0;
}

}  // namespace

int bench_ep_command(const DeploymentOptions& deployment, const std::vector<int64_t>& tokens,
                     int reps) {
  const ModelPreset model = deployment.model_preset();
  MoELayerOptions options = deployment.layer_options();
  const int64_t most = *std::max_element(tokens.begin(), tokens.end());
  if (deployment.max_tokens_option->count() == 0)
    options.max_num_tokens = std::max<int64_t>(most, 1);
  MOEKIT_CHECK(options.max_num_tokens >= most, "--tokens up to {} but --max-tokens is {}", most,
               options.max_num_tokens);
  MOEKIT_CHECK(attach_communicator(deployment, options),
               "bench-ep times a deployment that exchanges tokens between ranks: give --ep --dp N "
               "and launch under mpirun -np N (got {})",
               options.parallel.to_string());
  Communicator& comm = *options.communicator;
  const bool lead = comm.rank() == 0;
  MoELayer layer(model, MoELayer::random_weights(model, options, 1), options);
  const Device device = options.device.device();
  const Stream stream = layer.default_stream();
  if (lead) {
    std::cout << "model    " << model.summary() << "\n";
    std::cout << fmt::format("ranks    {} x {} over {}, {} prepare/finalize, {} experts\n",
                             comm.world_size(), options.device.to_string(), comm.name(),
                             layer.plan().prepare_finalize->name,
                             layer.kernel().fused_experts().name());
    std::cout << fmt::format("  {:>6} {:>11} {:>11} {:>11} {:>11} {:>13} {:>9}\n", "tokens",
                             "dispatch us", "experts us", "combine us", "layer us", "all2all us",
                             "a2a/ep");
  }
  const int64_t H = model.hidden_size, W = comm.world_size();
  for (const int64_t M : tokens) {
    Tensor x_host = Tensor::empty({M, H}, options.dtype);
    {
      std::mt19937_64 rng(11 + static_cast<uint64_t>(comm.rank()));
      std::uniform_real_distribution<float> u(-1.f, 1.f);
      for (int64_t i = 0; i < x_host.numel(); ++i)
        store_float(x_host.data(), options.dtype, i, u(rng));
    }
    const Tensor x = device.is_cpu() ? x_host : x_host.to(device);
    const Tensor logits_host = make_logits(M, model.num_experts, model.top_k, "random",
                                           7 + static_cast<uint64_t>(comm.rank()));
    const Tensor logits = device.is_cpu() ? logits_host : logits_host.to(device);
    Tensor out = Tensor::empty({M, H}, options.dtype, device);
    StageClock clock;
    RunContext ctx{stream, nullptr, &clock};
    std::map<std::string, std::vector<double>> samples;
    std::vector<double> total;
    for (int r = 0; r < reps + 2; ++r) {
      comm.barrier();
      clock.start(stream);
      const auto t0 = Clock::now();
      layer.forward_into(out, x, logits, ctx);
      if (stream.handle != nullptr) synchronize(stream);
      if (r < 2) continue;  // warm-up
      total.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      for (const auto& [stage, us] : clock.us())
        samples[stage].push_back(us);
    }
    auto stage = [&](const char* name) { return slowest(comm, median(samples[name])); };
    const double dispatch = stage("dispatch");
    const double combine = stage("finalize");
    const double layer_us = slowest(comm, median(total));
    double experts = 0.0;
    for (const auto& [name, v] : samples) {
      if (name != "dispatch" && name != "finalize" && name != "router" && name != "shared_add" &&
          name != "shared_experts") {
        experts += median(v);
      }
    }
    experts = slowest(comm, experts);
    // Baseline: each token slot's row to a uniform rank and back, as one all_to_all_v each way.
    const int64_t rows = M * model.top_k;
    std::vector<int64_t> counts(static_cast<size_t>(W), rows / W);
    counts[0] += rows % W;
    const Tensor send = Tensor::zeros({rows, H}, options.dtype, device);
    Tensor recv = Tensor::empty({rows, H}, options.dtype, device);
    Tensor back = Tensor::empty({rows, H}, options.dtype, device);
    std::vector<double> a2a;
    for (int r = 0; r < reps + 2; ++r) {
      comm.barrier();
      const auto t0 = Clock::now();
      comm.all_to_all_v(send, counts, recv, counts, stream);
      comm.all_to_all_v(recv, counts, back, counts, stream);
      if (stream.handle != nullptr) synchronize(stream);
      if (r >= 2)
        a2a.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    const double baseline = slowest(comm, median(a2a));
    if (lead) {
      std::cout << fmt::format(
          "  {:>6} {:>11.1f} {:>11.1f} {:>11.1f} {:>11.1f} {:>13.1f} {:>9.2f}\n", M, dispatch,
          experts, combine, layer_us, baseline, baseline / std::max(dispatch + combine, 1e-3));
    }
  }
  if (lead) {
    std::cout << "stages: host time between synchronised stage boundaries, median of " << reps
              << " forwards, the slowest rank; all2all: all_to_all_v of M * top_k rows of H to "
                 "uniform ranks and back; a2a/ep = all2all / (dispatch + combine)\n";
  }
  return 0;
}

}  // namespace moekit::cli
