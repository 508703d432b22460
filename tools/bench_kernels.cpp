// `moekit bench-kernels`: the decode support kernels (router, align) and the grouped GEMM timed
// alone, outside the layer (the layer and its stages: `moekit bench`). Built only with CUDA: main
// reaches it under `if constexpr (kCudaBuild)`.
//
// Method (kept from the test-suite benchmarks it replaces, so bench/*_notes.md stay comparable):
//   router / align: inputs are random bf16 logits in [-4, 4] (never zero), align fed by the
//     router's ids; one CUDA graph holds 20 back-to-back launches; 5 warm-up replays, then the
//     median of `reps` replays / 20: one launch's cost including the gap between graph nodes. No
//     L2 rotation: at decode sizes the inputs are a few KB and stay in L2 in a real step too.
//   gemm: GEMM1 of the model (N = 2 * intermediate, K = hidden) on uniform routings; 4 routings
//     cycled (so weights are not L2-resident), 8 launches per graph, median of `reps` replays; each
//     tile of the table (or the one named), plain and with silu fused; weights prepared once as
//     the experts do (prepare_grouped_gemm_weights).
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cli_common.h"
#include "core/cuda/cuda_check.cuh"
#include "experts/cuda/moe_permute.h"
#include "experts/cuda/sm90_grouped_gemm.h"
#include "moekit/core/half.h"
#include "router/cuda/topk_router.h"

namespace moekit::cli {
namespace {

namespace mc = moekit::cuda;

// Owning device allocation of n elements (at least one, so a pointer exists for empty tensors).
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) {
    void* raw = nullptr;
    MOEKIT_CUDA_CHECK(cudaMalloc(&raw, std::max<size_t>(n, 1) * sizeof(T)));
    p_ = static_cast<T*>(raw);
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) {
    if (!host.empty()) {
      MOEKIT_CUDA_CHECK(
          cudaMemcpy(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    }
  }
  ~DeviceArray() { cudaFree(p_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
  T* get() const { return p_; }

 private:
  T* p_ = nullptr;
};

// Captures body() (which queues `launches` launches on stream) into one graph, replays it `warmup`
// times, then returns the median of `reps` timed replays in microseconds per launch.
template <typename Body>
double time_graph_us(cudaStream_t stream, int launches, int warmup, int reps, Body body) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  MOEKIT_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  body();
  MOEKIT_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  MOEKIT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t t0, t1;
  MOEKIT_CUDA_CHECK(cudaEventCreate(&t0));
  MOEKIT_CUDA_CHECK(cudaEventCreate(&t1));
  for (int r = 0; r < warmup; ++r)
    MOEKIT_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  std::vector<float> ms(static_cast<size_t>(reps));
  for (int r = 0; r < reps; ++r) {
    MOEKIT_CUDA_CHECK(cudaEventRecord(t0, stream));
    MOEKIT_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    MOEKIT_CUDA_CHECK(cudaEventRecord(t1, stream));
    MOEKIT_CUDA_CHECK(cudaEventSynchronize(t1));
    MOEKIT_CUDA_CHECK(cudaEventElapsedTime(&ms[r], t0, t1));
  }
  std::sort(ms.begin(), ms.end());
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return ms[ms.size() / 2] * 1000.0 / launches;
}

std::vector<uint16_t> random_bf16(size_t n, std::mt19937_64& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<uint16_t> v(n);
  for (auto& x : v) {
    do {
      x = float_to_bf16_bits(d(rng));
    } while (bf16_bits_to_float(x) == 0.0f);
  }
  return v;
}

std::vector<uint16_t> random_logits(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  return random_bf16(n, rng, -4.0f, 4.0f);
}

// ---- router and align ---------------------------------------------------------------------------

struct RouterModel {
  const char* name;
  int E, k, G, tg;
  mc::RouterScoring scoring;
  bool bias;
  float scale;
};
constexpr RouterModel kRouterModels[] = {
    {"qwen3-30b-a3b", 128, 8, 0, 0, mc::RouterScoring::kSoftmax, false, 1.0f},
    {"deepseek-v3", 256, 8, 8, 4, mc::RouterScoring::kSigmoid, true, 2.5f}};

// Device buffers and launch parameters of one router + align problem.
struct RouterAlignCase {
  DeviceArray<uint16_t> logits;
  DeviceArray<float> bias, weights;
  DeviceArray<int32_t> ids, counts, offsets, permuted, slot_to_row, total;
  DeviceArray<uint8_t> align_ws;
  mc::TopkRouterParams rp;
  mc::MoeAlignParams ap;

  RouterAlignCase(const RouterModel& md, int64_t M, uint64_t seed)
      : logits(random_logits(static_cast<size_t>(M * md.E), seed)),
        bias(std::vector<float>(md.E, 0.125f)),
        weights(static_cast<size_t>(M * md.k)),
        ids(static_cast<size_t>(M * md.k)),
        counts(md.E),
        offsets(md.E + 1),
        permuted(static_cast<size_t>(mc::moe_align_capacity(M, md.k, md.E, 128))),
        slot_to_row(static_cast<size_t>(M * md.k)),
        total(1),
        align_ws(mc::moe_align_workspace_bytes(M, md.k, md.E)) {
    rp.logits = logits.get();
    rp.logits_type = mc::ElemType::kBF16;
    rp.logits_row_stride = md.E;
    rp.num_tokens = M;
    rp.num_experts = md.E;
    rp.top_k = md.k;
    rp.scoring = md.scoring;
    rp.e_score_correction_bias = md.bias ? bias.get() : nullptr;
    rp.num_expert_group = md.G;
    rp.topk_group = md.tg;
    rp.renormalize = true;
    rp.routed_scaling_factor = md.scale;
    rp.topk_weights = weights.get();
    rp.topk_ids = ids.get();
    ap.topk_ids = ids.get();
    ap.num_tokens = M;
    ap.top_k = md.k;
    ap.num_global_experts = md.E;
    ap.num_local_experts = md.E;
    ap.row_align = 128;
    ap.expert_counts = counts.get();
    ap.expert_offsets = offsets.get();
    ap.permuted_rows = permuted.get();
    ap.slot_to_row = slot_to_row.get();
    ap.total_rows = total.get();
    ap.workspace = align_ws.get();
    ap.workspace_bytes = mc::moe_align_workspace_bytes(M, md.k, md.E);
  }
};

void bench_router_align(const std::vector<int64_t>& tokens, int reps, cudaStream_t stream) {
  constexpr int kLaunches = 20;
  std::cout << "\n| model | M | router us | align us (row_align 1) | align us (row_align 128) | "
               "router+align us (128) |\n|---|---|---|---|---|---|\n";
  for (const RouterModel& md : kRouterModels) {
    for (int64_t M : tokens) {
      RouterAlignCase c(md, M, 7 + M);
      MOEKIT_CUDA_CHECK(mc::launch_topk_router(c.rp, stream));  // ids for the align-only runs
      MOEKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
      double us[4];
      for (int variant = 0; variant < 4; ++variant) {
        c.ap.row_align = variant == 1 ? 1 : 128;
        us[variant] = time_graph_us(stream, kLaunches, 5, reps, [&] {
          for (int r = 0; r < kLaunches; ++r) {
            if (variant == 0 || variant == 3)
              MOEKIT_CUDA_CHECK(mc::launch_topk_router(c.rp, stream));
            if (variant != 0) MOEKIT_CUDA_CHECK(mc::launch_moe_align(c.ap, stream));
          }
        });
      }
      std::cout << fmt::format("| {} | {} | {:.2f} | {:.2f} | {:.2f} | {:.2f} |\n", md.name, M,
                               us[0], us[1], us[2], us[3]);
    }
  }
  // One graph holding one router + align pair: the latency a single decode step sees.
  std::cout << fmt::format("\nsingle router+align graph (row_align 128), median of {} launches:\n",
                           reps);
  for (const RouterModel& md : kRouterModels) {
    for (int64_t M : {1, 64}) {
      RouterAlignCase c(md, M, 9 + M);
      const double us = time_graph_us(stream, 1, 5, reps, [&] {
        MOEKIT_CUDA_CHECK(mc::launch_topk_router(c.rp, stream));
        MOEKIT_CUDA_CHECK(mc::launch_moe_align(c.ap, stream));
      });
      std::cout << fmt::format("  {} M={}: {:.2f} us\n", md.name, M, us);
    }
  }
}

// ---- grouped GEMM -------------------------------------------------------------------------------

struct GemmModel {
  const char* name;
  int experts, top_k, hidden, inter;
};
constexpr GemmModel kGemmModels[] = {{"qwen3-30b-a3b", 128, 8, 2048, 768},
                                     {"deepseek-v3", 256, 8, 7168, 2048}};

void bench_gemm1(const std::vector<int64_t>& tokens, int reps, const std::string& tile_name,
                 cudaStream_t stream) {
  std::vector<int> tiles;
  for (int t = 0; t < mc::sm90::kNumTiles; ++t) {
    if (mc::sm90::kTileTable[t].family != mc::sm90::TileFamily::k16Bit) continue;  // bf16 GEMMs
    if (tile_name == "all" || tile_name == mc::sm90::kTileTable[t].name) tiles.push_back(t);
  }
  MOEKIT_CHECK(!tiles.empty(), "--tile {} is not 'all' or a tile of the table ({})", tile_name,
               mc::sm90::tile_names());
  constexpr int kRoutings = 4;  // distinct routings cycled so that weights are not L2-resident
  constexpr int kLaunches = 8;
  std::cout << "\n| model | M | rows | tile | epilogue | us | TFLOP/s | weight TB/s | all bytes "
               "TB/s |\n|---|---|---|---|---|---|---|---|---|\n";
  for (const GemmModel& m : kGemmModels) {
    const int E = m.experts, K = m.hidden, N = 2 * m.inter;
    const size_t w_elems = static_cast<size_t>(E) * N * K;
    DeviceArray<uint16_t> w(w_elems);
    {  // random bits, replicated on the device
      std::mt19937_64 rng(7);
      const size_t chunk = std::min<size_t>(w_elems, size_t{32} << 20);
      const std::vector<uint16_t> host = random_bf16(chunk, rng, -1.0f, 1.0f);
      MOEKIT_CUDA_CHECK(cudaMemcpy(w.get(), host.data(), chunk * 2, cudaMemcpyHostToDevice));
      for (size_t done = chunk; done < w_elems;) {
        const size_t n = std::min(done, w_elems - done);
        MOEKIT_CUDA_CHECK(cudaMemcpy(w.get() + done, w.get(), n * 2, cudaMemcpyDeviceToDevice));
        done += n;
      }
    }
    mc::GroupedGemmArgs shape;
    shape.w = w.get();
    shape.num_experts = E;
    shape.n = N;
    shape.k = K;
    mc::sm90::WeightLaunchCache cache;
    MOEKIT_CUDA_CHECK(mc::prepare_grouped_gemm_weights(shape, &cache));
    for (int64_t M : tokens) {
      const int64_t rows = M * m.top_k;
      std::mt19937_64 rng(static_cast<uint64_t>(M));
      DeviceArray<uint16_t> a(random_bf16(static_cast<size_t>(M) * K, rng, -1.0f, 1.0f));
      DeviceArray<uint16_t> c(static_cast<size_t>(std::max<int64_t>(rows, 1)) * N);
      std::vector<DeviceArray<int32_t>> d_offsets, d_gather;
      double touched_experts = 0;
      for (int r = 0; r < kRoutings; ++r) {
        std::vector<std::vector<int32_t>> per_expert(E);
        std::vector<int> ids(E);
        for (int64_t t = 0; t < M; ++t) {
          std::iota(ids.begin(), ids.end(), 0);
          for (int j = 0; j < m.top_k; ++j) {  // k distinct experts, uniform
            std::swap(ids[j], ids[j + rng() % (E - j)]);
            per_expert[ids[j]].push_back(static_cast<int32_t>(t));
          }
        }
        std::vector<int32_t> offsets(E + 1, 0), gather;
        for (int e = 0; e < E; ++e) {
          offsets[e + 1] = offsets[e] + static_cast<int32_t>(per_expert[e].size());
          gather.insert(gather.end(), per_expert[e].begin(), per_expert[e].end());
          touched_experts += per_expert[e].empty() ? 0 : 1;
        }
        d_offsets.emplace_back(offsets);
        d_gather.emplace_back(gather);
      }
      touched_experts /= kRoutings;
      for (int tile : tiles) {
        for (bool fused : {false, true}) {  // silu-and-mul fused into the epilogue: N/2 columns
          mc::GroupedGemmArgs g = shape;
          g.a = a.get();
          g.lda = K;
          g.c = c.get();
          g.ldc = fused ? N / 2 : N;
          g.fused_act = fused ? mc::FusedActivation::kSiluMul : mc::FusedActivation::kNone;
          g.num_rows_upper_bound = rows;
          mc::GroupedGemmParams params;
          params.tile = tile;
          params.cache = &cache;
          auto launch = [&](int i) {
            g.expert_offsets = d_offsets[i % kRoutings].get();
            g.gather_rows = d_gather[i % kRoutings].get();
            MOEKIT_CUDA_CHECK(mc::run_grouped_gemm(g, stream, params));
          };
          const double us = time_graph_us(stream, kLaunches, 1, reps, [&] {
            for (int i = 0; i < kLaunches; ++i)
              launch(i);
          });
          const double flops = 2.0 * rows * N * K;
          const double wbytes = touched_experts * N * K * 2.0;
          const double all_bytes = wbytes + rows * (K + (fused ? N / 2 : N)) * 2.0;
          std::cout << fmt::format(
              "| {} | {} | {} | {} | {} | {:.1f} | {:.1f} | {:.2f} | {:.2f} |\n", m.name, M, rows,
              mc::sm90::kTileTable[tile].name, fused ? "silu fused" : "plain", us,
              flops / us * 1e-6, wbytes / us * 1e-6, all_bytes / us * 1e-6);
        }
      }
      std::string why;
      mc::GroupedGemmArgs g = shape;
      g.num_rows_upper_bound = rows;
      const int picked = mc::select_grouped_gemm_tile(g, &why);
      std::cout << fmt::format("|   auto picks {}: {} |\n", mc::sm90::kTileTable[picked].name, why);
    }
  }
}

}  // namespace

int bench_kernels_command(const BenchKernelsOptions& options) {
  if (cuda_device_count() == 0) {
    std::cerr << "moekit bench-kernels needs a GPU: " << cuda_unavailable_reason() << "\n";
    return 2;
  }
  CudaStream stream_owner(0);
  const auto stream = static_cast<cudaStream_t>(stream_owner.get().handle);
  std::cout << "device  " << default_device_info().to_string() << "\n";
  for (const std::string& k : options.kernels) {
    if (k == "router-align") {
      bench_router_align(options.tokens, options.reps, stream);
    } else if (k == "gemm1") {
      bench_gemm1(options.tokens, options.reps, options.tile, stream);
    } else {
      std::cerr << "unknown kernel group '" << k << "' (router-align, gemm1)\n";
      return 2;
    }
  }
  return 0;
}

}  // namespace moekit::cli
