// `moekit bench`: the whole MoE layer and each of its stages timed with CUDA events over CUDA-graph
// replays, weight sets rotated past L2, the device's copy bandwidth and dense bf16 GEMM rate
// measured in the same run. Reports µs, TB/s on the unique expert-weight bytes touched, TFLOP/s on
// the real tokens, and fractions of the measured peaks, as a table and as JSON.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "bench_work.h"
#include "cli_common.h"
#include "core/elementwise.h"
#include "experts/cuda/sm90/tile_tables.h"
#include "experts/cuda/sm90_experts.h"
#include "moekit/core/error.h"
#include "moekit/experts/sm90_experts.h"
#include "moekit/layer/checkpoint.h"

#ifdef MOEKIT_WITH_CUDA
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#endif

namespace moekit::cli {

#ifdef MOEKIT_WITH_CUDA
namespace {

#define BENCH_CUDA(call)                                                                       \
  do {                                                                                         \
    const cudaError_t e_ = (call);                                                             \
    MOEKIT_CHECK(e_ == cudaSuccess, "CUDA call {} failed: {}", #call, cudaGetErrorString(e_)); \
  } while (false)

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Times `body` (which queues work on `stream`) captured once into a CUDA graph: median of `reps`
// replays, in ms per replay.
template <typename Body>
double time_graph(cudaStream_t stream, int warmup, int reps, Body body) {
  cudaGraph_t graph = nullptr;
  BENCH_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  body();
  BENCH_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  BENCH_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t start, stop;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < warmup; ++i)
    BENCH_CUDA(cudaGraphLaunch(exec, stream));
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    BENCH_CUDA(cudaEventRecord(start, stream));
    BENCH_CUDA(cudaGraphLaunch(exec, stream));
    BENCH_CUDA(cudaEventRecord(stop, stream));
    BENCH_CUDA(cudaEventSynchronize(stop));
    float t = 0;
    BENCH_CUDA(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return median(ms);
}

// Device-to-device copy of 4 GiB with cudaMemcpyAsync: (bytes read + written) / time, TB/s, median
// of 10 (timed with events around each copy, outside any graph).
double measure_copy_tbps(cudaStream_t stream) {
  const size_t bytes = size_t(4) << 30;
  Tensor a = Tensor::empty({static_cast<int64_t>(bytes)}, DType::kUInt8, Device::cuda());
  Tensor b = Tensor::empty({static_cast<int64_t>(bytes)}, DType::kUInt8, Device::cuda());
  BENCH_CUDA(cudaMemsetAsync(b.data(), 0x3c, bytes, stream));
  cudaEvent_t start, stop;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&stop));
  std::vector<double> ms;
  for (int i = 0; i < 12; ++i) {
    BENCH_CUDA(cudaEventRecord(start, stream));
    BENCH_CUDA(cudaMemcpyAsync(a.data(), b.data(), bytes, cudaMemcpyDeviceToDevice, stream));
    BENCH_CUDA(cudaEventRecord(stop, stream));
    BENCH_CUDA(cudaEventSynchronize(stop));
    float t = 0;
    BENCH_CUDA(cudaEventElapsedTime(&t, start, stop));
    if (i >= 2) ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return 2.0 * static_cast<double>(bytes) / (median(ms) * 1e-3) / 1e12;
}

// Dense bf16 GEMM 8192^3 through cuBLASLt, TFLOP/s.
double measure_gemm_tflops(cudaStream_t stream) {
  const int64_t n = 8192;
  Tensor a = Tensor::empty({n, n}, DType::kBF16, Device::cuda());
  Tensor b = Tensor::empty({n, n}, DType::kBF16, Device::cuda());
  Tensor c = Tensor::empty({n, n}, DType::kBF16, Device::cuda());
  a.fill(0.01);
  b.fill(-0.02);
  cublasLtHandle_t lt = nullptr;
  MOEKIT_CHECK(cublasLtCreate(&lt) == CUBLAS_STATUS_SUCCESS, "cublasLtCreate failed");
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  cublasLtMatrixLayout_t la, lb, lc;
  cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, n, n, n);
  cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, n, n, n);
  cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, n, n, n);
  const size_t ws_bytes = size_t(64) << 20;
  Tensor ws = Tensor::empty({static_cast<int64_t>(ws_bytes)}, DType::kUInt8, Device::cuda());
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                       sizeof(ws_bytes));
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &heur, &found);
  MOEKIT_CHECK(found > 0, "cuBLASLt found no bf16 GEMM algorithm");
  const float alpha = 1.f, beta = 0.f;
  const double ms = time_graph(stream, 3, 10, [&] {
    const cublasStatus_t st =
        cublasLtMatmul(lt, desc, &alpha, a.data(), la, b.data(), lb, &beta, c.data(), lc, c.data(),
                       lc, &heur.algo, ws.data(), ws_bytes, stream);
    MOEKIT_CHECK(st == CUBLAS_STATUS_SUCCESS, "cublasLtMatmul failed: {}", static_cast<int>(st));
  });
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(lt);
  return 2.0 * n * n * n / (ms * 1e-3) / 1e12;
}

// Records an event after each stage; the graph replays them, so elapsed times between consecutive
// events are the stage times of the last replay.
class EventObserver final : public StageObserver {
 public:
  void stage_done(std::string_view stage, Stream stream) const override {
    cudaEvent_t e = nullptr;
    BENCH_CUDA(cudaEventCreate(&e));
    // External: inside a stream capture this becomes an event-record node of the graph.
    BENCH_CUDA(cudaEventRecordWithFlags(e, static_cast<cudaStream_t>(stream.handle),
                                        cudaEventRecordExternal));
    events_.push_back({std::string(stage), e});
  }
  void start(cudaStream_t stream) const { stage_done("start", Stream{stream}); }
  mutable std::vector<std::pair<std::string, cudaEvent_t>> events_;
  ~EventObserver() override {
    for (auto& [n, e] : events_)
      cudaEventDestroy(e);
  }
};

struct Case {
  std::string model;
  int64_t M = 0;
  double us = 0, tbps = 0, tflops = 0, frac_bw = 0, frac_flops = 0;
  double touched_bytes = 0, flops = 0;
  int sets = 0, experts_touched = 0;
  std::map<std::string, double> stage_us;
};

}  // namespace
#endif

int bench_command(const DeploymentOptions& deployment, const BenchOptions& bench) {
  const char* command = bench.tune_out.empty() ? "moekit bench" : "moekit tune";
#ifndef MOEKIT_WITH_CUDA
  std::cerr << command << " times the GPU path: moekit was built without CUDA\n";
  return 2;
#else
  if (cuda_device_count() == 0) {
    std::cerr << command << " needs a GPU: " << cuda_unavailable_reason() << "\n";
    return 2;
  }
  const DeviceInfo dev = default_device_info();
  CudaStream stream_owner(0);
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_owner.get().handle);
  std::cout << "device  " << dev.to_string() << ", " << dev.num_sms << " SMs\n";
  const double copy_tbps = measure_copy_tbps(stream);
  const double gemm_tflops = measure_gemm_tflops(stream);
  std::cout << fmt::format(
      "peaks   copy {:.2f} TB/s (read+write), dense bf16 GEMM {:.0f} TFLOP/s "
      "(cuBLASLt 8192^3)\n",
      copy_tbps, gemm_tflops);
  int l2_bytes = 0;
  cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, 0);
  const int64_t max_m = *std::max_element(bench.tokens.begin(), bench.tokens.end());

  // Stages: one forward with an event after each stage, captured once, replayed; the median of
  // each stage's time, us.
  auto stage_times = [&](MoELayer& layer, Tensor& out, const Tensor& x, const Tensor& logits) {
    WorkspaceManager& workspace = *layer.options().workspace;
    EventObserver obs;
    RunContext sctx{Stream{stream}, &workspace, &obs};
    std::map<std::string, std::vector<double>> per_stage;
    cudaGraph_t graph = nullptr;
    BENCH_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    obs.start(stream);
    try {
      layer.forward_into(out, x, logits, sctx);
    } catch (...) {
      cudaStreamEndCapture(stream, &graph);
      if (graph != nullptr) cudaGraphDestroy(graph);
      cudaGetLastError();
      throw;
    }
    BENCH_CUDA(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec = nullptr;
    BENCH_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < bench.reps; ++i) {
      BENCH_CUDA(cudaGraphLaunch(exec, stream));
      BENCH_CUDA(cudaStreamSynchronize(stream));
      for (size_t e = 1; e < obs.events_.size(); ++e) {
        float t = 0;
        if (cudaEventElapsedTime(&t, obs.events_[e - 1].second, obs.events_[e].second) ==
            cudaSuccess) {
          per_stage[obs.events_[e].first].push_back(t * 1e3);
        }
      }
    }
    cudaGetLastError();
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    std::map<std::string, double> us;
    for (auto& [stage, v] : per_stage)
      us[stage] = median(v);
    return us;
  };
  // `moekit tune`: GEMM1 and GEMM2 of this M timed on every tile of the layer's family, the
  // fastest of each into `tuned`.
  cuda::sm90::TileTables tuned;
  auto tune_case = [&](MoELayer& layer, const std::string& model, int64_t M, Tensor& out,
                       const Tensor& x, const Tensor& logits) {
    auto* experts = dynamic_cast<Sm90StandardExpertsBase*>(&layer.kernel().fused_experts());
    MOEKIT_CHECK(experts != nullptr,
                 "moekit tune: {}'s experts ({}) are not the Hopper grouped GEMMs; nothing to tune",
                 model, layer.kernel().fused_experts().name());
    const auto family = cuda::sm90::family_by_name(experts->tile_family());
    const auto keys = sm90::gemm_shape_keys(layer.moe_config(), *family);
    std::vector<std::pair<std::string, double>> times[2];
    std::string skipped;
    experts->allow_decode_pair(false);  // each GEMM timed on its own, also on CUDA-core tiles
    for (const std::string& tile : experts->tile_names()) {
      experts->force_tile(tile);
      try {
        const std::map<std::string, double> st = stage_times(layer, out, x, logits);
        times[0].emplace_back(tile, st.at("gemm1"));
        times[1].emplace_back(tile, st.at("gemm2"));
      } catch (const Error& e) {  // a tile the shape does not fit: say so, time the others
        skipped += fmt::format("; {} cannot run: {}", tile, e.what());
      }
    }
    experts->force_tile("auto");
    experts->allow_decode_pair(true);
    std::string line = fmt::format("  tune M={}:", M);
    for (int g = 0; g < 2; ++g) {
      if (times[g].empty()) continue;
      const auto best =
          std::min_element(times[g].begin(), times[g].end(),
                           [](const auto& a, const auto& b) { return a.second < b.second; });
      cuda::sm90::TunedTile t;
      t.device = dev.name;
      t.key = keys[g];
      t.gemm = g == 0 ? "gemm1" : "gemm2";
      t.m = M;
      t.tile = best->first;
      t.us = best->second;
      t.candidates = times[g];
      t.source = bench.tune_out;
      line += fmt::format(" {} {} ({:.1f} us;", t.gemm, t.tile, t.us);
      for (const auto& [name, us] : times[g]) {
        if (name != t.tile) line += fmt::format(" {} {:.1f}", name, us);
      }
      line += ")";
      tuned.add(std::move(t));
    }
    std::cout << line << skipped << "\n";
  };

  std::vector<Case> cases;
  // --config benches that one model; otherwise each preset of --models.
  for (const ModelPreset& model :
       bench_models(deployment.config_json, bench.models, bench.plain_topk)) {
    MoELayerOptions options = deployment.layer_options();
    options.device = dev;
    options.max_num_tokens = max_m;
    WorkspaceManager workspace(Device::cuda());
    options.workspace = &workspace;
    const int64_t H = model.hidden_size;
    // Bytes and FLOPs of what this rank holds (I / tp, the local experts), not the whole model.
    LayerShard shard = LayerShard::of(model, options);
    // Before the layers exist: the unquantized size bounds the quantized one.
    const double total_weight_bytes =
        shard.bytes_per_element * shard.expert_elements() * shard.num_local_experts;
    // Enough weight sets that each replay reads weights not left in L2 by the previous one, within
    // 60 GB of weights.
    const int max_sets = std::max(1, std::min(8, static_cast<int>(60e9 / total_weight_bytes)));
    std::vector<std::unique_ptr<MoELayer>> layers;
    try {
      for (int s = 0; s < max_sets; ++s) {
        layers.push_back(std::make_unique<MoELayer>(
            random_quantized_layer(model, bench.quant, options, 1000 + s)));
      }
    } catch (const UnsupportedError& e) {  // no kernel for this scheme here: say so, go on
      std::cout << "\n"
                << model.summary() << "\n  skipped (" << bench.quant << "): " << e.what() << "\n";
      continue;
    }
    // Quantized experts: the bytes the layer holds (packed codes + scales) per expert.
    if (layers[0]->is_quantized()) {
      shard.quantized_expert_bytes =
          static_cast<double>(layers[0]->expert_weight_bytes()) / shard.num_local_experts;
    }
    std::cout << "\n"
              << model.summary() << "\n  weights: " << layers[0]->scheme()
              << (layers[0]->moe_config().batch_invariant ? ", batch-invariant mode" : "")
              << "\n  experts: " << layers[0]->kernel().fused_experts().name() << ", " << max_sets
              << " weight set(s) of " << fmt::format("{:.2f}", total_weight_bytes / 1e9) << " GB\n";
    std::cout << fmt::format("  {:>6} {:>10} {:>8} {:>9} {:>7} {:>7}  {}\n", "M", "us", "TB/s",
                             "TFLOP/s", "%bw", "%flops", "stages (us)");
    for (int64_t M : bench.tokens) {
      // Inputs for every set; routing from the logits of set 0 gives the touched experts.
      std::vector<Tensor> xs, logits, outs;
      for (int s = 0; s < max_sets; ++s) {
        const Tensor lg = make_logits(M, model.num_experts, model.top_k, bench.routing, 77 + s);
        Tensor x = Tensor::empty({M, H}, options.dtype, Device::cuda());
        fill_uniform(x, 555 + s, 1.0f, Stream{stream});
        xs.push_back(x);
        logits.push_back(lg.to(Device::cuda()));
        outs.push_back(Tensor::empty({M, H}, options.dtype, Device::cuda()));
      }
      const RoutingResult r =
          layers[0]->router().select_experts(xs[0], logits[0], {Stream{stream}, nullptr});
      BENCH_CUDA(cudaStreamSynchronize(stream));
      const LayerWork work = layer_work(shard, r.topk_ids.to_int_vector(), M);
      const double bytes = work.weight_bytes;
      const double flops = work.flops;
      const int sets = std::clamp(
          static_cast<int>(std::ceil(3.0 * l2_bytes / std::max(bytes, 1.0))), 1, max_sets);
      RunContext ctx{Stream{stream}, &workspace, nullptr};
      const double ms = time_graph(stream, 3, bench.reps, [&] {
        for (int s = 0; s < sets; ++s)
          layers[s]->forward_into(outs[s], xs[s], logits[s], ctx);
      });
      Case c;
      c.model = model.name;
      c.M = M;
      c.sets = sets;
      c.experts_touched = work.experts_touched;
      c.us = ms * 1e3 / sets;
      c.touched_bytes = bytes;
      c.flops = flops;
      c.tbps = bytes / (c.us * 1e-6) / 1e12;
      c.tflops = flops / (c.us * 1e-6) / 1e12;
      c.frac_bw = c.tbps / copy_tbps;
      c.frac_flops = c.tflops / gemm_tflops;
      c.stage_us = stage_times(*layers[0], outs[0], xs[0], logits[0]);
      if (!bench.tune_out.empty()) tune_case(*layers[0], model.name, M, outs[0], xs[0], logits[0]);
      std::string stages;
      for (const char* s : {"router", "shared_slots", "dispatch", "align", "quantize a1", "gemm1",
                            "activation", "quantize a2", "gemm2", "gemm1+gemm2", "reduce",
                            "finalize", "shared_experts", "shared_add"}) {
        if (c.stage_us.count(s)) stages += fmt::format("{} {:.1f}  ", s, c.stage_us[s]);
      }
      std::cout << fmt::format("  {:>6} {:>10.1f} {:>8.2f} {:>9.1f} {:>6.0f}% {:>6.0f}%  {}\n", M,
                               c.us, c.tbps, c.tflops, 100 * c.frac_bw, 100 * c.frac_flops, stages);
      cases.push_back(c);
    }
  }

  if (!bench.tune_out.empty()) {
    std::ofstream(bench.tune_out) << tuned.to_json(dev.name);
    std::cout << "\nwrote " << bench.tune_out << " (" << tuned.entries().size()
              << " entries; MOEKIT_TILE_TABLES=" << bench.tune_out
              << " uses it, data/tile_tables/ ships it)\n";
  }
  if (!bench.json_path.empty()) {
    nlohmann::json j;
    j["device"] = dev.to_string();
    j["routing"] = bench.routing;
    j["plain_topk"] = bench.plain_topk;
    j["dtype"] = deployment.dtype;
    j["quant"] = bench.quant;
    j["batch_invariant"] = deployment.batch_invariant;
    j["peaks"] = {{"copy_tbps", copy_tbps}, {"bf16_gemm_tflops", gemm_tflops}};
    for (const Case& c : cases) {
      j["cases"].push_back({{"model", c.model},
                            {"M", c.M},
                            {"us", c.us},
                            {"tbps", c.tbps},
                            {"tflops", c.tflops},
                            {"frac_copy_bw", c.frac_bw},
                            {"frac_gemm_flops", c.frac_flops},
                            {"touched_bytes", c.touched_bytes},
                            {"flops", c.flops},
                            {"experts_touched", c.experts_touched},
                            {"weight_sets", c.sets},
                            {"stages_us", c.stage_us}});
    }
    std::ofstream(bench.json_path) << j.dump(2) << "\n";
    std::cout << "\nwrote " << bench.json_path << "\n";
  }
  return 0;
#endif
}

}  // namespace moekit::cli
