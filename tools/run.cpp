// `moekit run`: one MoE layer on seeded random data (or a checkpoint's layer,
// tools/checkpoint.cpp), checked against an independent float64 recomputation of sampled output
// rows (layer/reference.h).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <random>

#include "cli_common.h"
#include "moekit/comm/mpi.h"
#include "moekit/comm/nccl.h"
#include "moekit/core/error.h"
#include "moekit/core/tolerance.h"
#include "moekit/layer/reference.h"
#include "moekit/prepare_finalize/factory.h"

namespace moekit::cli {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Bytes of host memory the kernel could still give this process (MemAvailable), if known.
std::optional<double> host_bytes_available() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit) {
    if (key == "MemAvailable:") return kb * 1024.0;
  }
  return std::nullopt;
}

// Refuses, before any work, a run whose weights and buffers cannot fit in this machine's memory
// (instead of being killed a minute later), with the figures.
void check_run_fits(const ModelPreset& model, const MoELayerOptions& options, int64_t tokens) {
  const MoEConfig moe = MoELayer::make_moe_config(model, options);
  const double es = static_cast<double>(element_size(options.dtype));
  const double H = static_cast<double>(moe.hidden_dim);
  const double I = static_cast<double>(moe.intermediate_size_per_partition());
  const double N = moe.is_act_and_mul() ? 2 * I : I;
  const double experts = static_cast<double>(moe.num_local_experts) * (N * H + H * I) * es;
  const double Is = static_cast<double>(MoELayer::shared_width(model, options.parallel));
  const double shared = (moe.is_act_and_mul() ? 3 : 2) * Is * H * es;
  // The workspaces of the reference experts (the largest of the backends): GEMM1 out, activation
  // out, unreduced output, for max_num_tokens tokens from each rank that may send them here.
  const ParallelConfig& p = options.parallel;
  const double senders = p.use_ep ? p.ep_size : 1;
  const double rows = static_cast<double>(options.max_num_tokens) * moe.experts_per_token * senders;
  double workspace = rows * (std::max(N, H) + N / 2 + H) * es;
  if (p.use_megakernel()) {
    // The peer experts' exchange buffer: rows in and partials back for every rank's tokens,
    // their ids and weights (experts/cuda/ep_peer.h).
    const double tokens_in = static_cast<double>(options.max_num_tokens) * senders;
    workspace += tokens_in * (2 * H * es + 8.0 * moe.experts_per_token);
  }
  const double io =
      static_cast<double>(std::max<int64_t>(tokens, 1)) * (3 * H * es + 4.0 * moe.num_experts);
  const bool on_cpu = options.device.type == DeviceType::kCPU;
  if (!on_cpu && options.device.present) {
    const double free = static_cast<double>(cuda_memory_free(options.device.index));
    MOEKIT_CHECK(experts + shared + workspace <= 0.95 * free,
                 "this run needs about {:.1f} GB of device memory ({:.1f} GB of {} expert weights "
                 "in {}, {:.1f} GB of workspaces) but {} has {:.1f} GB free: use --ep with --tp to "
                 "hold one rank's experts, or a smaller --max-tokens",
                 (experts + shared + workspace) / 1e9, (experts + shared) / 1e9, model.name,
                 dtype_name(options.dtype), workspace / 1e9, options.device.to_string(),
                 free / 1e9);
  }
  const double host_need = io + (on_cpu ? experts + shared + workspace : 0.0);
  const auto available = host_bytes_available();
  if (!available) return;
  MOEKIT_CHECK(host_need <= 0.9 * *available,
               "this run needs about {:.1f} GB of host memory ({:.1f} GB of {} expert weights in "
               "{}{}, {:.1f} GB of workspaces and buffers) but {:.1f} GB is available "
               "(MemAvailable): use a smaller model (--model small, small-deepseek), --ep with "
               "--tp to hold one rank's experts, or a GPU",
               host_need / 1e9, (experts + shared) / 1e9, model.name, dtype_name(options.dtype),
               on_cpu ? "" : " on the GPU", (workspace + io) / 1e9, *available / 1e9);
}

}  // namespace

bool attach_communicator(const DeploymentOptions& deployment, MoELayerOptions& options) {
  const std::optional<All2AllBackend> key = dispatch_key(options.parallel);
  if (!key.has_value()) return false;
  const int ranks = options.parallel.ep_size;
  MOEKIT_CHECK(mpi_available(),
               "{} exchanges tokens between {} ranks, one process each under mpirun, but {}",
               options.parallel.to_string(), ranks, mpi_unavailable_reason());
  if (*key == All2AllBackend::kMegakernel) {
    // The megakernel experts exchange the tokens through the GPUs' memory themselves; MPI only
    // carries their buffers' handles. One GPU per rank (the rank modulo the visible GPUs; ranks
    // may share one).
    options.communicator = mpi_world_communicator();
    if (options.device.type == DeviceType::kCUDA && cuda_device_count() > 0) {
      options.device.index = options.communicator->rank() % cuda_device_count();
    }
  } else {
    // CPU ranks exchange over MPI, GPU ranks over NCCL (bootstrapped over MPI), one GPU per rank
    // (the MPI rank modulo the visible GPUs).
    options.communicator = options.device.type == DeviceType::kCUDA ? nccl_world_communicator()
                                                                    : mpi_world_communicator();
    options.device.index = options.communicator->device().index;
  }
  const int rank = options.communicator->rank();
  MOEKIT_CHECK(options.communicator->world_size() == ranks,
               "{} needs {} ranks: launch it with `mpirun -np {} moekit ...` (this job has {} "
               "process{})",
               options.parallel.to_string(), ranks, ranks, options.communicator->world_size(),
               options.communicator->world_size() == 1 ? "" : "es");
  options.parallel = ParallelConfig::make(deployment.tp_size, deployment.dp_size,
                                          rank / deployment.tp_size, rank % deployment.tp_size,
                                          deployment.enable_ep, options.parallel.all2all_backend);
  return true;
}

std::shared_ptr<Communicator> attach_tp_communicator(const DeploymentOptions& deployment,
                                                     MoELayerOptions& options) {
  const ParallelConfig& p = options.parallel;
  // mpirun (OpenMPI, or a PMI launcher) tells its processes the job's size.
  const bool under_mpirun = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr ||
                            std::getenv("PMI_SIZE") != nullptr ||
                            std::getenv("PMIX_RANK") != nullptr;
  if (p.tp_size <= 1 || p.use_ep || p.dp_size > 1 || !under_mpirun) return nullptr;
  MOEKIT_CHECK(mpi_available(), "a tensor-parallel job of {} ranks under mpirun needs MPI, but {}",
               p.tp_size, mpi_unavailable_reason());
  std::shared_ptr<Communicator> comm = mpi_world_communicator();
  MOEKIT_CHECK(comm->world_size() == p.tp_size,
               "--tp {} under mpirun needs {} processes, one per tensor-parallel rank (this job "
               "has {}): `mpirun -np {} moekit ...`",
               p.tp_size, p.tp_size, comm->world_size(), p.tp_size);
  MOEKIT_CHECK(deployment.tp_rank == 0 || deployment.tp_rank == comm->rank(),
               "--tp-rank {} under mpirun: the rank comes from MPI (this process is rank {})",
               deployment.tp_rank, comm->rank());
  options.parallel = ParallelConfig::make(p.tp_size, 1, 0, comm->rank(), false, p.all2all_backend);
  return comm;
}

int forward_and_check(MoELayer& layer, const Tensor& x_host, const Tensor& logits_host,
                      int check_rows, const ExpertSource& all_experts, const std::string& prefix,
                      Communicator* tp_sum) {
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
  // (One forward per rank when ranks exchange tokens: every rank must take part in each.)
  const bool exchange = layer.kernel().output_is_reduced();
  const int64_t chunk = device.is_cpu() && tokens > 256 && !exchange ? (tokens + 19) / 20
                                                                     : std::max<int64_t>(tokens, 1);
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
  with_elapsed_display("float64 check", [&] {
    ref = reference_forward(layer, x_host, routing_host, rows, all_experts);
  });
  Tensor checked = out_host;
  if (tp_sum != nullptr) {  // the sums over the tensor-parallel ranks, output and recomputation
    checked = out_host.to_dtype(DType::kF32);
    tp_sum->all_reduce(checked, Stream{});
    Tensor r = Tensor::empty({static_cast<int64_t>(ref.size())}, DType::kF64);
    if (!ref.empty()) std::memcpy(r.data(), ref.data(), r.nbytes());
    tp_sum->all_reduce(r, Stream{});
    if (!ref.empty()) std::memcpy(ref.data(), r.data(), r.nbytes());
  }
  const double rel = relative_error(checked, ref, rows);
  const Tolerance& tol = tolerance(layer.tolerance_name());
  const bool ok = !std::isnan(rel) && rel <= tol.rel_l2;
  std::cout << fmt::format("{}forward  {:.3f} ms for {} tokens ({})\n", prefix, forward_s * 1e3,
                           tokens, layer.kernel().fused_experts().name());
  std::cout << fmt::format(
      "{}check    {} rows{} vs float64 recomputation{}: relative error {:.3e} (tolerance {:.1e} "
      "for {}) -> {}\n",
      prefix, rows.size(),
      tp_sum != nullptr ? fmt::format(" summed over {} tensor-parallel ranks", tp_sum->world_size())
                        : std::string(),
      tp_sum != nullptr ? " (each rank's, summed)" : "", rel, tol.rel_l2, tol.name,
      ok ? "OK" : "FAILED");
  std::cout.flush();
  return ok ? 0 : 1;
}

int run_command(const DeploymentOptions& deployment, int64_t tokens, uint64_t seed, int check_rows,
                const std::string& routing_dist) {
  const ModelPreset model = deployment.model_preset();
  MoELayerOptions options = deployment.layer_options();
  const bool low_latency = options.parallel.all2all_backend == All2AllBackend::kBatchedLowLatency;
  if (low_latency && deployment.max_tokens_option->count() == 0) {
    options.max_num_tokens = std::max<int64_t>(tokens, 1);  // the per-rank buffer capacity
  }
  options.max_num_tokens = std::max<int64_t>(options.max_num_tokens, std::max<int64_t>(tokens, 1));
  // DP + EP: one process per rank under mpirun; this process's rank comes from MPI.
  const bool exchange = attach_communicator(deployment, options);
  // TP under mpirun: the ranks take the same tokens, their partial outputs are summed.
  const std::shared_ptr<Communicator> tp = attach_tp_communicator(deployment, options);
  std::string prefix;
  uint64_t token_seed = seed;  // each DP rank brings its own tokens
  if (exchange) {
    const int rank = options.communicator->rank();
    prefix = fmt::format("rank {}/{}: ", rank, options.communicator->world_size());
    token_seed = seed + 1000 * static_cast<uint64_t>(rank);
  }
  if (tp) prefix = fmt::format("rank {}/{}: ", tp->rank(), tp->world_size());
  const bool lead = (!exchange || options.parallel.ep_rank == 0) && (!tp || tp->rank() == 0);
  if (lead) {
    std::cout << "model    " << model.summary() << "\n";
    std::cout << "device   " << options.device.to_string() << ", " << tokens << " tokens"
              << (exchange ? " per rank" : "") << ", " << dtype_name(options.dtype) << "\n";
  }
  check_run_fits(model, options, tokens);

  auto t0 = std::chrono::steady_clock::now();
  MoELayerWeights weights;
  with_elapsed_display("random weights",
                       [&] { weights = MoELayer::random_weights(model, options, seed); });
  const double weight_bytes = static_cast<double>(weights.w13.nbytes() + weights.w2.nbytes());
  if (lead) {
    std::cout << fmt::format("weights  {:.2f} GB of random expert weights in {:.1f} s{}\n",
                             weight_bytes / 1e9, seconds_since(t0), exchange ? " (rank 0)" : "");
  }
  std::unique_ptr<MoELayer> layer;
  with_elapsed_display("building the layer", [&] {
    layer = std::make_unique<MoELayer>(model, std::move(weights), options);
  });
  if (lead) std::cout << "\n" << layer->plan().to_string() << "\n" << std::flush;

  Tensor x = Tensor::empty({tokens, model.hidden_size}, options.dtype);
  {
    std::mt19937_64 rng(token_seed + 17);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (int64_t i = 0; i < x.numel(); ++i)
      store_float(x.data(), options.dtype, i, u(rng));
  }
  const Tensor logits =
      make_logits(tokens, model.num_experts, model.top_k, routing_dist, token_seed + 29);
  if (!exchange) return forward_and_check(*layer, x, logits, check_rows, {}, prefix, tp.get());
  // The reference reads every rank's experts (regenerated: rank r's are a slice of the seed's
  // single-rank model), so each rank checks its rows against a single-process recomputation.
  const ExpertSource all_experts = [&](int64_t e) {
    return MoELayer::random_expert(model, options, seed, e);
  };
  options.communicator->barrier();
  return forward_and_check(*layer, x, logits, check_rows, all_experts, prefix);
}

}  // namespace moekit::cli
