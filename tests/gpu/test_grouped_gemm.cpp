// GPU tests of the sm90 grouped expert GEMM (experts/cuda/sm90_grouped_gemm.h) against a CPU
// fp64 reference: awkward schedules (experts with 0 rows, 1 row, partial tiles, every row on one
// expert), gather with padding rows, both schedule forms, both dtypes, both tiles, CUDA-graph
// capture; the fused gated-activation epilogue (every kind, weights converted with
// interleave_gate_up_rows from the standard or pairwise layout); the decode pair (GEMM1 and
// GEMM2 in one launch) against two launches. C is poisoned (0xFF bytes = NaN)
// before each run; every scheduled element must be written and every other element must keep the
// poison.
//
// Timings are not tests: `moekit bench-kernels --kernels gemm1`.
#include <gtest/gtest.h>

#if MOEKIT_WITH_CUDA

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "experts/cuda/sm90/int4_layout.h"
#include "experts/cuda/sm90/mxfp6_layout.h"
#include "experts/cuda/sm90_grouped_gemm.h"
#include "moekit/core/half.h"
#include "moekit/quant/formats.h"

namespace {

using moekit::cuda::ElemType;
using moekit::cuda::FusedActivation;
using moekit::cuda::GroupedGemmArgs;
using moekit::cuda::GroupedGemmParams;
namespace sm90 = moekit::cuda::sm90;

#define CUDA_OK(call)                                                          \
  do {                                                                         \
    const cudaError_t err_ = (call);                                           \
    ASSERT_EQ(err_, cudaSuccess) << #call << ": " << cudaGetErrorString(err_); \
  } while (0)

// Owning device allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes > 0 && cudaMalloc(&ptr_, bytes) != cudaSuccess) ptr_ = nullptr;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

template <typename T>
DeviceBuffer upload(const std::vector<T>& host) {
  DeviceBuffer d(host.size() * sizeof(T));
  if (d.get() != nullptr && !host.empty()) {
    cudaMemcpy(d.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  return d;
}

std::string gpu_unavailable() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess)
    return std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(err);
  if (count == 0) return "no CUDA device";
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return "cudaGetDeviceProperties failed";
  if (prop.major != 9) return std::string("needs sm_90 (Hopper), found ") + prop.name;
  return "";
}

#define REQUIRE_GPU()                                 \
  do {                                                \
    if (auto why = gpu_unavailable(); !why.empty()) { \
      GTEST_SKIP() << why;                            \
    }                                                 \
  } while (0)

float to_f(uint16_t bits, ElemType dt) {
  return dt == ElemType::kBF16 ? moekit::bf16_bits_to_float(bits) : moekit::f16_bits_to_float(bits);
}
uint16_t from_f(float v, ElemType dt) {
  return dt == ElemType::kBF16 ? moekit::float_to_bf16_bits(v) : moekit::float_to_f16_bits(v);
}

enum class BiasKind { kNone, kFp32, kDtype };

// A test problem: schedule + shapes + options.
struct Case {
  ElemType dtype = ElemType::kBF16;
  int n = 64;
  int k = 64;
  std::vector<int> counts;  // rows per expert
  bool gather = false;      // gather rows from a smaller A, ~10% padding rows (-1)
  BiasKind bias = BiasKind::kNone;
  bool batched = false;   // expert_counts + batched_stride instead of offsets
  int lda_pad = 0;        // lda = k + lda_pad
  int ldc_pad = 0;        // ldc = n + ldc_pad
  int trailing_rows = 3;  // unscheduled rows after the schedule (must stay poisoned)
  uint32_t seed = 1;
  // Fused gated activation: W (and bias) are generated in the standard w13 layout (gate rows
  // [0, n/2), up rows [n/2, n)) or the pairwise one (gate 2i, up 2i + 1) and converted with
  // interleave_gate_up_rows / _bias; C has n/2 columns.
  FusedActivation act = FusedActivation::kNone;
  bool pairwise_source = false;
  bool has_clamp = false;
  float limit = 7.0f;
  float alpha = 1.702f;
};

// Host copy of everything a run needs, plus device buffers.
struct Problem {
  Case cs;
  int num_experts = 0;
  int64_t lda = 0, ldc = 0;
  int64_t num_rows = 0;  // rows of C (scheduled + gaps + trailing)
  int64_t a_rows = 0;
  int64_t stride = 0;
  std::vector<int32_t> offsets, counts, gather;
  std::vector<int> row_expert;  // expert of each C row, -1 if unscheduled
  int n_out = 0;                // columns of C
  std::vector<uint16_t> a, w, bias16;
  std::vector<float> af, wf;  // a and w as floats, for the reference
  std::vector<float> bias32;
  DeviceBuffer d_a, d_w, d_bias, d_c, d_offsets, d_counts, d_gather;
  GroupedGemmArgs args;
};

void build(Problem& p, const Case& cs) {
  p.cs = cs;
  p.num_experts = static_cast<int>(cs.counts.size());
  const int E = p.num_experts;
  std::mt19937 rng(cs.seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  p.lda = cs.k + cs.lda_pad;
  const bool fused = cs.act != FusedActivation::kNone;
  p.n_out = fused ? cs.n / 2 : cs.n;
  p.ldc = p.n_out + cs.ldc_pad;
  p.counts.assign(cs.counts.begin(), cs.counts.end());
  p.offsets.assign(E + 1, 0);
  for (int e = 0; e < E; ++e)
    p.offsets[e + 1] = p.offsets[e] + cs.counts[e];
  int64_t scheduled_span = p.offsets[E];
  if (cs.batched) {
    p.stride = *std::max_element(cs.counts.begin(), cs.counts.end()) + 3;
    scheduled_span = p.stride * E;
  }
  p.num_rows = scheduled_span + cs.trailing_rows;
  p.row_expert.assign(p.num_rows, -1);
  for (int e = 0; e < E; ++e) {
    const int64_t begin = cs.batched ? e * p.stride : p.offsets[e];
    for (int i = 0; i < cs.counts[e]; ++i)
      p.row_expert[begin + i] = e;
  }
  p.a_rows = cs.gather ? std::max<int64_t>(1, p.num_rows / 3 + 1) : p.num_rows;
  if (cs.gather) {
    std::uniform_int_distribution<int> pick(0, static_cast<int>(p.a_rows) - 1);
    p.gather.resize(p.num_rows);
    for (auto& g : p.gather)
      g = (rng() % 10 == 0) ? -1 : pick(rng);
  }
  p.a.resize(p.a_rows * p.lda);
  for (auto& x : p.a)
    x = from_f(uni(rng), cs.dtype);
  p.w.resize(static_cast<size_t>(E) * cs.n * cs.k);
  for (auto& x : p.w)
    x = from_f(uni(rng), cs.dtype);
  if (cs.bias == BiasKind::kFp32) {
    p.bias32.resize(static_cast<size_t>(E) * cs.n);
    for (auto& x : p.bias32)
      x = 4.0f * uni(rng);
  } else if (cs.bias == BiasKind::kDtype) {
    p.bias16.resize(static_cast<size_t>(E) * cs.n);
    for (auto& x : p.bias16)
      x = from_f(4.0f * uni(rng), cs.dtype);
  }
  p.af.resize(p.a.size());
  p.wf.resize(p.w.size());
  for (size_t i = 0; i < p.a.size(); ++i)
    p.af[i] = to_f(p.a[i], cs.dtype);
  for (size_t i = 0; i < p.w.size(); ++i)
    p.wf[i] = to_f(p.w[i], cs.dtype);
  p.d_a = upload(p.a);
  if (fused) {  // the device gets the blocks-of-32 layout
    std::vector<uint16_t> wi(p.w.size());
    moekit::cuda::interleave_gate_up_rows(p.w.data(), wi.data(), E, cs.n, cs.k, 2,
                                          cs.pairwise_source);
    p.d_w = upload(wi);
    if (!p.bias32.empty()) {
      std::vector<float> bi(p.bias32.size());
      moekit::cuda::interleave_gate_up_bias(p.bias32.data(), bi.data(), E, cs.n, 4,
                                            cs.pairwise_source);
      p.d_bias = upload(bi);
    }
    if (!p.bias16.empty()) {
      std::vector<uint16_t> bi(p.bias16.size());
      moekit::cuda::interleave_gate_up_bias(p.bias16.data(), bi.data(), E, cs.n, 2,
                                            cs.pairwise_source);
      p.d_bias = upload(bi);
    }
  } else {
    p.d_w = upload(p.w);
    if (!p.bias32.empty()) p.d_bias = upload(p.bias32);
    if (!p.bias16.empty()) p.d_bias = upload(p.bias16);
  }
  p.d_c = DeviceBuffer(static_cast<size_t>(p.num_rows * p.ldc * 2));
  p.d_offsets = upload(p.offsets);
  p.d_counts = upload(p.counts);
  if (cs.gather) p.d_gather = upload(p.gather);

  GroupedGemmArgs& g = p.args;
  g.a = p.d_a.get();
  g.lda = p.lda;
  g.gather_rows = cs.gather ? p.d_gather.as<int32_t>() : nullptr;
  g.w = p.d_w.get();
  g.bias = p.d_bias.get();
  g.bias_is_fp32 = cs.bias == BiasKind::kFp32;
  g.c = p.d_c.get();
  g.ldc = p.ldc;
  g.expert_offsets = cs.batched ? nullptr : p.d_offsets.as<int32_t>();
  g.expert_counts = cs.batched ? p.d_counts.as<int32_t>() : nullptr;
  g.batched_stride = p.stride;
  g.num_experts = E;
  g.num_rows_upper_bound = scheduled_span;
  g.n = cs.n;
  g.k = cs.k;
  g.dtype = cs.dtype;
  g.fused_act = cs.act;
  g.has_clamp_limit = cs.has_clamp;
  g.clamp_limit = cs.limit;
  g.alpha = cs.alpha;
}

// fp64 reference of the fused activations (same formulas as moe_activation.cu).
double ref_act(const Case& cs, double g, double u) {
  const double L = cs.limit;
  auto silu = [](double x) { return x / (1.0 + std::exp(-x)); };
  auto clampd = [](double v, double lim) { return std::min(std::max(v, -lim), lim); };
  switch (cs.act) {
    case FusedActivation::kSiluMul:
      return cs.has_clamp ? silu(std::min(g, L)) * clampd(u, L) : silu(g) * u;
    case FusedActivation::kGeluMul:
      return 0.5 * g * std::erfc(-g / std::sqrt(2.0)) * u;
    case FusedActivation::kGeluTanhMul:
      return 0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g))) * u;
    case FusedActivation::kSwigluOai: {
      const double gc = std::min(g, L);
      return (clampd(u, L) + 1.0) * gc / (1.0 + std::exp(-cs.alpha * gc));
    }
    case FusedActivation::kSwigluStep:
      return std::min(silu(g), L) * clampd(u, L);
    case FusedActivation::kRelu2Mul: {
      const double r = std::max(g, 0.0);
      return r * r * u;
    }
    case FusedActivation::kNone:
      break;
  }
  return g;
}

const char* act_name(FusedActivation a) {
  switch (a) {
    case FusedActivation::kNone:
      return "none";
    case FusedActivation::kSiluMul:
      return "silu";
    case FusedActivation::kGeluMul:
      return "gelu";
    case FusedActivation::kGeluTanhMul:
      return "gelu_tanh";
    case FusedActivation::kSwigluOai:
      return "swigluoai";
    case FusedActivation::kSwigluStep:
      return "swiglustep";
    case FusedActivation::kRelu2Mul:
      return "relu2";
  }
  return "?";
}

// Compares C with the fp64 reference; checks poison where nothing may be written.
void check(const Problem& p, const std::vector<uint16_t>& c, const std::string& label) {
  const Case& cs = p.cs;
  const double rel_tol = cs.dtype == ElemType::kBF16 ? 1e-2 : 2e-3;
  const bool fused = cs.act != FusedActivation::kNone;
  // > half an ulp. Fused: the kernel rounds gate and up to the dtype before the activation (as
  // the unfused path stores them), and so does the reference; an fp32 sum that lands on the other
  // side of a rounding boundary moves the output by up to an ulp of its input.
  const double elem_rel =
      cs.dtype == ElemType::kBF16 ? (fused ? 1.2e-2 : 4.5e-3) : (fused ? 1.5e-3 : 6e-4);
  double err2 = 0, ref2 = 0;
  int64_t bad = 0, unwritten = 0, clobbered = 0, checked = 0;
  std::vector<double> pre(cs.n), ref(p.n_out);
  for (int64_t r = 0; r < p.num_rows; ++r) {
    const int e = p.row_expert[r];
    if (e < 0) {
      for (int64_t j = 0; j < p.ldc; ++j)
        clobbered += c[r * p.ldc + j] != 0xFFFF;
      continue;
    }
    const int64_t src = cs.gather ? p.gather[r] : r;
    for (int j = 0; j < cs.n; ++j) {
      double s = 0;
      if (src >= 0) {
        const float* arow = &p.af[src * p.lda];
        const float* wrow = &p.wf[(static_cast<int64_t>(e) * cs.n + j) * cs.k];
        for (int kk = 0; kk < cs.k; ++kk)
          s += static_cast<double>(arow[kk]) * wrow[kk];
      }
      if (cs.bias == BiasKind::kFp32) s += p.bias32[static_cast<size_t>(e) * cs.n + j];
      if (cs.bias == BiasKind::kDtype)
        s += to_f(p.bias16[static_cast<size_t>(e) * cs.n + j], cs.dtype);
      pre[j] = fused ? to_f(from_f(static_cast<float>(s), cs.dtype), cs.dtype) : s;
    }
    const int half = cs.n / 2;
    for (int j = 0; j < p.n_out; ++j) {
      if (!fused) {
        ref[j] = pre[j];
      } else if (cs.pairwise_source) {
        ref[j] = ref_act(cs, pre[2 * j], pre[2 * j + 1]);
      } else {
        ref[j] = ref_act(cs, pre[j], pre[half + j]);
      }
    }
    // Fused: the activation's slope (up to ~2|g||u| for relu2) scales the fp32 accumulation error.
    const double rms_scale = std::sqrt(static_cast<double>(cs.k) / 9.0) * (fused ? 10.0 : 1.0);
    for (int j = 0; j < p.n_out; ++j) {
      const uint16_t bits = c[r * p.ldc + j];
      if (bits == 0xFFFF) {
        ++unwritten;
        continue;
      }
      const double got = to_f(bits, cs.dtype);
      const double d = got - ref[j];
      err2 += d * d;
      ref2 += ref[j] * ref[j];
      ++checked;
      if (!(std::fabs(d) <= elem_rel * std::fabs(ref[j]) + 1e-4 * rms_scale)) {
        if (bad < 5) {
          ADD_FAILURE() << label << ": C[" << r << "," << j << "] = " << got << ", reference "
                        << ref[j] << " (expert " << e << ", A row " << src << ")";
        }
        ++bad;
      }
    }
    for (int64_t j = p.n_out; j < p.ldc; ++j)
      clobbered += c[r * p.ldc + j] != 0xFFFF;
  }
  EXPECT_EQ(unwritten, 0) << label << ": scheduled elements left unwritten";
  EXPECT_EQ(clobbered, 0) << label << ": elements outside the schedule were written";
  EXPECT_EQ(bad, 0) << label << ": element mismatches out of " << checked;
  const double rel = ref2 > 0 ? std::sqrt(err2 / ref2) : 0.0;
  EXPECT_LT(rel, rel_tol) << label;
  if (ref2 > 0) {
    EXPECT_GT(rel, 0.0) << label << ": suspiciously exact (rounding expected)";
  }
}

std::vector<uint16_t> run_and_fetch(Problem& p, int tile, cudaStream_t stream = 0, int max_ctas = 0,
                                    const sm90::WeightLaunchCache* cache = nullptr) {
  std::vector<uint16_t> c(p.num_rows * p.ldc);
  EXPECT_EQ(cudaMemsetAsync(p.d_c.get(), 0xFF, p.d_c.bytes(), stream), cudaSuccess);
  GroupedGemmParams params;
  params.tile = tile;
  params.max_ctas = max_ctas;
  params.cache = cache;
  const std::string why = moekit::cuda::can_implement(p.args, params);
  EXPECT_EQ(why, "");
  EXPECT_EQ(moekit::cuda::run_grouped_gemm(p.args, stream, params), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(c.data(), p.d_c.get(), c.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  return c;
}

void run_case(const Case& cs, const std::string& name, int max_ctas = 0) {
  Problem p;
  build(p, cs);
  for (int tile = 0; tile < sm90::kNumTiles; ++tile) {
    if (sm90::kTileTable[tile].family != sm90::TileFamily::k16Bit) continue;
    const std::string label = name + " tile " + sm90::kTileTable[tile].name;
    check(p, run_and_fetch(p, tile, 0, max_ctas), label);
  }
}

TEST(GroupedGemm, AwkwardScheduleGatherPaddingFp32Bias) {
  REQUIRE_GPU();
  Case cs;
  cs.counts = {0, 1, 130, 64, 257, 0, 128, 2};
  cs.n = 200;  // not a multiple of either tile width
  cs.k = 136;  // not a multiple of 64
  cs.gather = true;
  cs.bias = BiasKind::kFp32;
  cs.lda_pad = 8;
  cs.ldc_pad = 8;
  run_case(cs, "awkward bf16");
}

TEST(GroupedGemm, Fp16DtypeBiasNoGather) {
  REQUIRE_GPU();
  Case cs;
  cs.dtype = ElemType::kF16;
  cs.counts = {33, 0, 129, 7};
  cs.n = 128;
  cs.k = 72;
  cs.bias = BiasKind::kDtype;
  cs.seed = 2;
  run_case(cs, "fp16");
}

TEST(GroupedGemm, BatchedCounts) {
  REQUIRE_GPU();
  Case cs;
  cs.counts = {0, 80, 17, 1, 64};
  cs.batched = true;  // gaps between experts must stay poisoned
  cs.n = 64;
  cs.k = 256;
  cs.ldc_pad = 16;
  cs.seed = 3;
  run_case(cs, "batched");
}

// C's rows only 4-byte aligned (ldc = n + 2): the staged epilogue of the 128x256 rows stores its
// 16-byte chunks as 4-byte words; plain and fused, the ldc padding staying poisoned.
TEST(GroupedGemm, RowsOfCNotSixteenByteAligned) {
  REQUIRE_GPU();
  for (FusedActivation act : {FusedActivation::kNone, FusedActivation::kSiluMul}) {
    Case cs;
    cs.act = act;
    cs.counts = {3, 0, 200, 129};
    cs.n = 320;
    cs.k = 128;
    cs.ldc_pad = 2;
    cs.bias = BiasKind::kFp32;
    cs.seed = 9;
    run_case(cs, std::string("ldc = n + 2 ") + act_name(act));
  }
}

// The epilogue warps (128x256epi: the consumers hand each tile to two warps of the producer
// warpgroup through shared memory) store exactly what the consumers' own epilogue (128x256)
// stores: plain with bias, fused kinds, f16, C rows 4-byte aligned only, and a grid of 2 CTAs so
// that the handoff tile's barriers go through many phases.
TEST(GroupedGemm, EpilogueWarpsBitwiseTheDirectEpilogue) {
  REQUIRE_GPU();
  const int direct = sm90::find_tile("128x256");
  const int warps = sm90::find_tile("128x256epi");
  ASSERT_GE(direct, 0);
  ASSERT_GE(warps, 0);
  for (FusedActivation act :
       {FusedActivation::kNone, FusedActivation::kSiluMul, FusedActivation::kSwigluOai}) {
    for (ElemType dt : {ElemType::kBF16, ElemType::kF16}) {
      Case cs;
      cs.dtype = dt;
      cs.act = act;
      cs.counts = {3, 0, 300, 129, 1, 260};
      cs.n = 576;
      cs.k = 200;
      cs.gather = true;
      cs.bias = BiasKind::kFp32;
      cs.ldc_pad = dt == ElemType::kF16 ? 2 : 8;
      cs.seed = 21;
      Problem p;
      build(p, cs);
      for (int ctas : {0, 2}) {
        const std::string label = std::string(act_name(act)) +
                                  (dt == ElemType::kF16 ? " f16" : "") + " ctas " +
                                  std::to_string(ctas);
        const auto a = run_and_fetch(p, direct, 0, ctas);
        const auto b = run_and_fetch(p, warps, 0, ctas);
        check(p, b, label);
        EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 2)) << label;
      }
    }
  }
}

TEST(GroupedGemm, EveryRowOnOneExpert) {
  REQUIRE_GPU();
  Case cs;
  cs.counts = {0, 0, 0, 300, 0, 0, 0, 0};
  cs.n = 136;
  cs.k = 512;
  cs.gather = true;
  cs.seed = 4;
  run_case(cs, "one expert");
}

TEST(GroupedGemm, Qwen3LikeGemm2) {
  REQUIRE_GPU();
  Case cs;
  std::mt19937 rng(5);
  for (int e = 0; e < 16; ++e)
    cs.counts.push_back(static_cast<int>(rng() % 90));
  cs.n = 512;
  cs.k = 2048;  // a long K: many pipeline wraps
  cs.gather = true;
  cs.bias = BiasKind::kFp32;
  cs.seed = 5;
  run_case(cs, "qwen3-like");
}

// A tiny persistent grid: every CTA walks many work items, so the shared-memory ring wraps across
// items at every phase (odd K-tile counts) and the producer runs ahead of the epilogue.
TEST(GroupedGemm, FewCtasManyItemsPerCta) {
  REQUIRE_GPU();
  Case cs;
  std::mt19937 rng(8);
  for (int e = 0; e < 12; ++e)
    cs.counts.push_back(static_cast<int>(rng() % 200));
  cs.counts[3] = 0;
  cs.n = 520;  // 3 n-tiles of 256 (last partial), 9 of 64 (last partial)
  cs.k = 328;  // 6 K tiles (last partial): not a multiple of either ring depth
  cs.gather = true;
  cs.bias = BiasKind::kDtype;
  cs.seed = 8;
  for (int ctas : {1, 3}) {
    run_case(cs, "few ctas " + std::to_string(ctas), ctas);
  }
}

// A problem that is checked, never launched: host pointers (16-byte aligned), the offsets
// schedule of `experts` empty experts, k = lda, n = ldc.
GroupedGemmArgs host_args(int experts, int n, int k) {
  alignas(16) static uint16_t dummy[64];
  static int32_t offsets[moekit::cuda::kMaxExperts + 1] = {};
  GroupedGemmArgs g;
  g.a = g.w = g.c = dummy;
  g.expert_offsets = offsets;
  g.num_experts = experts;
  g.n = n;
  g.k = k;
  g.lda = k;
  g.ldc = n;
  return g;
}

// ---- stream-K (GroupedGemmParams::stream_k)
// ------------------------------------------------------

// A zeroed stream-K workspace; every launch must leave its counters zero.
DeviceBuffer stream_k_workspace() {
  DeviceBuffer ws(moekit::cuda::stream_k_workspace_bytes());
  EXPECT_EQ(cudaMemset(ws.get(), 0, ws.bytes()), cudaSuccess);
  return ws;
}
void expect_counters_zero(const DeviceBuffer& ws, const std::string& label) {
  std::vector<int32_t> counters(moekit::cuda::stream_k_counter_words());
  ASSERT_EQ(cudaMemcpy(counters.data(), ws.get(), counters.size() * 4, cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_TRUE(std::all_of(counters.begin(), counters.end(), [](int32_t v) { return v == 0; }))
      << label << ": counters left nonzero";
}

// One stream-K launch of row `tile` (kAlways) with a grid of max_ctas (0: the default), C poisoned.
std::vector<uint16_t> run_stream_k(Problem& p, int tile, int max_ctas, const DeviceBuffer& ws) {
  std::vector<uint16_t> c(p.num_rows * p.ldc);
  EXPECT_EQ(cudaMemset(p.d_c.get(), 0xFF, p.d_c.bytes()), cudaSuccess);
  GroupedGemmParams params;
  params.tile = tile;
  params.max_ctas = max_ctas;
  params.stream_k = moekit::cuda::StreamK::kAlways;
  EXPECT_EQ(moekit::cuda::get_workspace_size(p.args, params), ws.bytes());
  EXPECT_EQ(moekit::cuda::run_grouped_gemm(p.args, nullptr, params, ws.get()), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(c.data(), p.d_c.get(), c.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  return c;
}

// Every stream-K row of the 16-bit family, forced on, with grids of 1, 3, 7, 100 CTAs and the
// default (2 per SM: more CTAs than K steps in the short-K case, so some shares are empty and
// most items are split): against float64, bitwise the same on a second launch, the counters left
// zero; decode-like schedules (1-3 rows on most experts, one of 40), plain and fused GEMM1, a
// partial last n-tile, K of 3 steps (the last partial) and of 32.
TEST(GroupedGemmStreamK, SplitItemsMatchFloat64AndRepeatBitwise) {
  REQUIRE_GPU();
  const DeviceBuffer ws = stream_k_workspace();
  for (int variant = 0; variant < 4; ++variant) {
    Case cs;
    cs.dtype = variant == 3 ? ElemType::kF16 : ElemType::kBF16;
    cs.counts = {1, 0, 3, 1, 2, 40, 1, 0, 2, 1};
    cs.gather = true;
    cs.bias = variant % 2 == 0 ? BiasKind::kFp32 : BiasKind::kNone;
    cs.act = variant >= 2 ? FusedActivation::kSiluMul : FusedActivation::kNone;
    cs.n = variant >= 2 ? 320 : 200;
    cs.k = variant % 2 == 0 ? 136 : 2048;
    cs.seed = 40 + variant;
    Problem p;
    build(p, cs);
    for (int tile = 0; tile < sm90::kNumTiles; ++tile) {
      const sm90::TileConfig& t = sm90::kTileTable[tile];
      if (t.family != sm90::TileFamily::k16Bit || !sm90::stream_k_capable(t)) continue;
      for (int ctas : {0, 1, 3, 7, 100}) {
        const std::string label = "stream-K variant " + std::to_string(variant) + " tile " +
                                  t.name + " ctas " + std::to_string(ctas);
        const auto first = run_stream_k(p, tile, ctas, ws);
        check(p, first, label);
        expect_counters_zero(ws, label);
        const auto again = run_stream_k(p, tile, ctas, ws);
        EXPECT_EQ(0, std::memcmp(first.data(), again.data(), first.size() * 2)) << label;
      }
    }
  }
}

// kBalance takes stream-K only where the SMs' shares are uneven (stream_k_pays), and only with a
// workspace; get_workspace_size is 0 for rows that cannot use one and under kOff (the default).
TEST(GroupedGemmStreamK, AutoPolicyAndWorkspaceSize) {
  EXPECT_TRUE(moekit::cuda::stream_k_pays(192, 132));   // qwen3-30b-a3b GEMM1 at M = 1
  EXPECT_TRUE(moekit::cuda::stream_k_pays(180, 132));   // gpt-oss-120b GEMM2 at M = 1
  EXPECT_FALSE(moekit::cuda::stream_k_pays(256, 132));  // qwen3-30b-a3b GEMM2: 1.03x
  EXPECT_FALSE(moekit::cuda::stream_k_pays(360, 132));  // gpt-oss-120b GEMM1: 1.10x
  EXPECT_FALSE(moekit::cuda::stream_k_pays(128, 132));  // one item per SM at most
  EXPECT_FALSE(moekit::cuda::stream_k_pays(600, 132));  // more than 4 per SM
  EXPECT_FALSE(moekit::cuda::stream_k_pays(0, 132));
  GroupedGemmArgs args = host_args(8, 128, 64);
  args.num_rows_upper_bound = 8;
  GroupedGemmParams params;
  params.tile = sm90::find_tile("16x64");
  ASSERT_GE(params.tile, 0);
  EXPECT_EQ(moekit::cuda::get_workspace_size(args, params), 0u);  // kOff, the default
  params.stream_k = moekit::cuda::StreamK::kBalance;
  EXPECT_EQ(moekit::cuda::get_workspace_size(args, params),
            moekit::cuda::stream_k_workspace_bytes());
  params.tile = sm90::find_tile("64x64");
  ASSERT_GE(params.tile, 0);
  EXPECT_EQ(moekit::cuda::get_workspace_size(args, params), 0u);
}

TEST(GroupedGemm, EmptyScheduleWritesNothing) {
  REQUIRE_GPU();
  Case cs;
  cs.counts = {0, 0, 0};
  cs.trailing_rows = 7;
  Problem p;
  build(p, cs);
  p.args.num_rows_upper_bound = 0;
  const auto c = run_and_fetch(p, -1);
  EXPECT_TRUE(std::all_of(c.begin(), c.end(), [](uint16_t v) { return v == 0xFFFF; }));
}

TEST(GroupedGemm, CapturedInCudaGraphMatchesDirectLaunch) {
  REQUIRE_GPU();
  Case cs;
  cs.counts = {5, 70, 0, 140};
  cs.n = 192;
  cs.k = 320;
  cs.gather = true;
  cs.seed = 6;
  Problem p;
  build(p, cs);
  const auto direct = run_and_fetch(p, -1);

  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CUDA_OK(cudaMemset(p.d_c.get(), 0xFF, p.d_c.bytes()));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const cudaError_t launched = moekit::cuda::run_grouped_gemm(p.args, stream);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  CUDA_OK(launched);
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_OK(cudaGraphLaunch(exec, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  std::vector<uint16_t> graphed(direct.size());
  CUDA_OK(cudaMemcpy(graphed.data(), p.d_c.get(), graphed.size() * 2, cudaMemcpyDeviceToHost));
  EXPECT_EQ(0, std::memcmp(direct.data(), graphed.data(), direct.size() * 2));
  check(p, graphed, "graph");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// The launch state prepared once (SM count, kernel attributes, W's tensor maps) gives the same
// bits as launches that prepare themselves; a cache of other weights is ignored.
TEST(GroupedGemm, PreparedLaunchStateMatchesUnprepared) {
  REQUIRE_GPU();
  Case cs;
  cs.counts = {5, 70, 0, 140, 1};
  cs.n = 320;
  cs.k = 200;
  cs.gather = true;
  cs.bias = BiasKind::kFp32;
  cs.seed = 12;
  Problem p, other;
  build(p, cs);
  cs.seed = 13;
  build(other, cs);
  sm90::WeightLaunchCache cache, other_cache;
  CUDA_OK(moekit::cuda::prepare_grouped_gemm_weights(p.args, &cache));
  CUDA_OK(moekit::cuda::prepare_grouped_gemm_weights(other.args, &other_cache));
  EXPECT_EQ(cache.w, p.args.w);
  EXPECT_GT(cache.sms, 0);
  for (int tile = 0; tile < sm90::kNumTiles; ++tile) {
    if (sm90::kTileTable[tile].family != sm90::TileFamily::k16Bit) continue;
    const std::string label = std::string("prepared tile ") + sm90::kTileTable[tile].name;
    const auto plain = run_and_fetch(p, tile);
    const auto cached = run_and_fetch(p, tile, 0, 0, &cache);
    const auto foreign = run_and_fetch(p, tile, 0, 0, &other_cache);
    check(p, cached, label);
    EXPECT_EQ(0, std::memcmp(plain.data(), cached.data(), plain.size() * 2)) << label;
    EXPECT_EQ(0, std::memcmp(plain.data(), foreign.data(), plain.size() * 2)) << label;
  }
}

// Host-only: needs no GPU.
TEST(GroupedGemm, CanImplementGivesReasons) {
  const GroupedGemmArgs g = host_args(2, 64, 64);
  EXPECT_EQ(moekit::cuda::can_implement(g), "");
  // 0 rows select the swap-AB row, which may use the stream-K workspace (not under the
  // default, kOff).
  EXPECT_EQ(moekit::cuda::get_workspace_size(g), 0u);
  GroupedGemmParams balance;
  balance.stream_k = moekit::cuda::StreamK::kBalance;
  EXPECT_EQ(moekit::cuda::get_workspace_size(g, balance), moekit::cuda::stream_k_workspace_bytes());
  auto bad = g;
  bad.k = 12;
  bad.lda = 16;
  EXPECT_EQ(moekit::cuda::can_implement(bad), "k=12 is not a positive multiple of 8");
  bad = g;
  bad.n = 20;
  EXPECT_NE(moekit::cuda::can_implement(bad).find("n=20"), std::string::npos);
  bad = g;
  bad.num_experts = 0;
  EXPECT_NE(moekit::cuda::can_implement(bad).find("num_experts=0"), std::string::npos);
  bad = g;
  bad.a = static_cast<const uint8_t*>(g.a) + 2;
  EXPECT_EQ(moekit::cuda::can_implement(bad), "a is not 16-byte aligned");
  bad = g;
  bad.expert_offsets = nullptr;
  EXPECT_NE(moekit::cuda::can_implement(bad), "");
  bad = g;
  bad.lda = 60;
  EXPECT_NE(moekit::cuda::can_implement(bad).find("lda=60"), std::string::npos);
  EXPECT_EQ(moekit::cuda::run_grouped_gemm(bad, nullptr), cudaErrorInvalidValue);
  bad = g;
  bad.dtype = ElemType::kF32;
  EXPECT_EQ(moekit::cuda::can_implement(bad), "dtype f32 is not bf16 or f16");
  sm90::WeightLaunchCache cache;
  EXPECT_EQ(moekit::cuda::prepare_grouped_gemm_weights(bad, &cache), cudaErrorInvalidValue);
  EXPECT_EQ(cache.w, nullptr);
  moekit::cuda::GroupedGemmParams params;
  params.tile = sm90::kNumTiles;
  EXPECT_NE(moekit::cuda::can_implement(g, params).find(
                "16x64, 16x64tma, 1x64simt, 32x64, 64x64, 128x256"),
            std::string::npos);
}

// ---- fused gated activation
// ----------------------------------------------------------------------

constexpr FusedActivation kFusedKinds[] = {
    FusedActivation::kSiluMul,   FusedActivation::kGeluMul,    FusedActivation::kGeluTanhMul,
    FusedActivation::kSwigluOai, FusedActivation::kSwigluStep, FusedActivation::kRelu2Mul};

// Every kind x both dtypes x both tiles: awkward schedule (experts with 0 / 1 / partial-tile
// rows), gather with padding rows, bias, padded lda / ldc (the ldc padding must stay poisoned),
// n = 320: 5 gate/up blocks, so the 256-wide tile's second n-tile holds one block.
TEST(GroupedGemmFused, EveryKindBothDtypesBothTiles) {
  REQUIRE_GPU();
  for (ElemType dt : {ElemType::kBF16, ElemType::kF16}) {
    for (int variant = 0; variant < 7; ++variant) {
      Case cs;
      cs.dtype = dt;
      cs.act = variant < 6 ? kFusedKinds[variant] : FusedActivation::kSiluMul;
      cs.has_clamp = variant == 6;  // silu with the clamp limit
      cs.counts = {0, 1, 130, 64, 257, 0, 2};
      cs.n = 320;
      cs.k = 136;
      cs.gather = true;
      cs.bias = dt == ElemType::kBF16 ? BiasKind::kFp32 : BiasKind::kDtype;
      cs.lda_pad = 8;
      cs.ldc_pad = 8;
      cs.seed = 100 + variant;
      run_case(cs, std::string("fused ") + act_name(cs.act) + (cs.has_clamp ? "+clamp" : "") +
                       (dt == ElemType::kBF16 ? " bf16" : " f16"));
    }
  }
}

// Batched schedule (gaps stay poisoned), no bias, a tiny grid (items wrap the ring), partial last
// n-tile of the 256-wide tile (576 = 2 x 256 + one 64-row block), long-ish partial K.
TEST(GroupedGemmFused, BatchedFewCtasNoBias) {
  REQUIRE_GPU();
  for (FusedActivation act : {FusedActivation::kSwigluStep, FusedActivation::kGeluTanhMul}) {
    Case cs;
    cs.act = act;
    cs.counts = {0, 80, 17, 1, 64};
    cs.batched = true;
    cs.n = 576;
    cs.k = 328;
    cs.ldc_pad = 16;
    cs.seed = 9;
    for (int ctas : {0, 3}) {
      run_case(cs, std::string("fused batched ") + act_name(act) + " ctas " + std::to_string(ctas),
               ctas);
    }
  }
}

// gpt-oss checkpoints store gate/up pairwise (gate = row 2i, up = row 2i + 1).
TEST(GroupedGemmFused, SwigluOaiFromPairwiseSource) {
  REQUIRE_GPU();
  Case cs;
  cs.act = FusedActivation::kSwigluOai;
  cs.pairwise_source = true;
  cs.counts = {3, 0, 200, 65};
  cs.n = 192;
  cs.k = 264;
  cs.gather = true;
  cs.bias = BiasKind::kFp32;
  cs.seed = 11;
  run_case(cs, "fused swigluoai pairwise");
}

// Host-only: the row permutation of the helpers.
TEST(GroupedGemmFused, InterleaveHelpersPermuteRows) {
  constexpr int64_t E = 2, N = 128, K = 3;
  std::vector<int32_t> src(E * N * K), dst(E * N * K, -1);
  for (int64_t i = 0; i < E * N * K; ++i)
    src[i] = static_cast<int32_t>(i);
  for (bool pairwise : {false, true}) {
    moekit::cuda::interleave_gate_up_rows(src.data(), dst.data(), E, N, K, 4, pairwise);
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t i = 0; i < N / 2; ++i) {
        const int64_t b = i / 32, t = i % 32;
        const int64_t gate_src = pairwise ? 2 * i : i, up_src = pairwise ? 2 * i + 1 : N / 2 + i;
        for (int64_t kk = 0; kk < K; ++kk) {
          EXPECT_EQ(dst[(e * N + 64 * b + t) * K + kk], src[(e * N + gate_src) * K + kk]);
          EXPECT_EQ(dst[(e * N + 64 * b + 32 + t) * K + kk], src[(e * N + up_src) * K + kk]);
        }
      }
    }
    std::vector<float> bsrc(E * N), bdst(E * N, -1.0f);
    for (int64_t i = 0; i < E * N; ++i)
      bsrc[i] = static_cast<float>(i);
    moekit::cuda::interleave_gate_up_bias(bsrc.data(), bdst.data(), E, N, 4, pairwise);
    EXPECT_EQ(bdst[N + 64 + 5], bsrc[N + (pairwise ? 2 * 37 : 37)]);  // gate of column 37
    EXPECT_EQ(bdst[N + 64 + 32 + 5], bsrc[N + (pairwise ? 2 * 37 + 1 : 64 + 37)]);  // its up
  }
}

// Host-only: the fused arguments' reasons.
TEST(GroupedGemmFused, CanImplementGivesReasons) {
  alignas(16) static uint16_t dummy[64];
  static int32_t offsets[3] = {0, 0, 0};
  GroupedGemmArgs g;
  g.a = dummy;
  g.w = dummy;
  g.c = dummy;
  g.expert_offsets = offsets;
  g.num_experts = 2;
  g.n = 128;
  g.k = 64;
  g.lda = 64;
  g.ldc = 64;  // n / 2 is enough when fused
  g.fused_act = FusedActivation::kSiluMul;
  EXPECT_EQ(moekit::cuda::can_implement(g), "");
  auto bad = g;
  bad.fused_act = FusedActivation::kNone;  // unfused needs ldc >= n
  EXPECT_NE(moekit::cuda::can_implement(bad).find("ldc=64"), std::string::npos);
  bad = g;
  bad.n = 96;
  bad.ldc = 96;
  EXPECT_EQ(moekit::cuda::can_implement(bad),
            "n=96 is not a multiple of 64 (a fused activation needs whole 64-row gate/up blocks)");
  EXPECT_EQ(moekit::cuda::run_grouped_gemm(bad, nullptr), cudaErrorInvalidValue);
  bad = g;
  bad.ldc = 62;
  EXPECT_NE(moekit::cuda::can_implement(bad).find("n/2=64"), std::string::npos);
  bad = g;
  bad.fused_act = FusedActivation::kSwigluOai;
  bad.clamp_limit = 0.0f;
  EXPECT_EQ(moekit::cuda::can_implement(bad), "clamp_limit must be > 0");
  bad = g;
  bad.fused_act = static_cast<FusedActivation>(42);
  EXPECT_EQ(moekit::cuda::can_implement(bad), "fused_act is unknown");
}

// ---- the decode pair: GEMM1 + activation and GEMM2 in one launch
// --------------------------------

// GEMM1 (a Problem with a fused activation) and a GEMM2 that reads GEMM1's activation rows in
// place (the layer's layout): W2 (E, n2, n1 / 2), an fp32 bias, C2 (rows, n2).
struct PairProblem {
  Problem g1;
  int n2 = 0;
  std::vector<uint16_t> w2;
  std::vector<float> b2;
  DeviceBuffer d_w2, d_b2, d_c2, d_done;
  GroupedGemmArgs a2;
};

void build_pair(PairProblem& pp, const Case& c1, int n2) {
  build(pp.g1, c1);
  const int E = pp.g1.num_experts, k2 = c1.n / 2;
  std::mt19937 rng(c1.seed + 1000);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  pp.n2 = n2;
  pp.w2.resize(static_cast<size_t>(E) * n2 * k2);
  for (auto& x : pp.w2)
    x = from_f(uni(rng), c1.dtype);
  pp.b2.resize(static_cast<size_t>(E) * n2);
  for (auto& x : pp.b2)
    x = uni(rng);
  pp.d_w2 = upload(pp.w2);
  pp.d_b2 = upload(pp.b2);
  pp.d_c2 = DeviceBuffer(static_cast<size_t>(pp.g1.num_rows) * n2 * 2);
  pp.d_done = DeviceBuffer(static_cast<size_t>(E) * 4);
  GroupedGemmArgs& a = pp.a2;
  a = pp.g1.args;
  a.fused_act = FusedActivation::kNone;
  a.a = pp.g1.args.c;
  a.lda = pp.g1.ldc;
  a.gather_rows = nullptr;
  a.w = pp.d_w2.get();
  a.bias = pp.d_b2.get();
  a.bias_is_fp32 = true;
  a.c = pp.d_c2.get();
  a.ldc = n2;
  a.n = n2;
  a.k = k2;
}

struct PairOut {
  std::vector<uint16_t> c1, c2;
};

PairOut fetch_pair(const PairProblem& pp) {
  PairOut o;
  o.c1.resize(pp.g1.num_rows * pp.g1.ldc);
  o.c2.resize(pp.g1.num_rows * pp.n2);
  EXPECT_EQ(cudaMemcpy(o.c1.data(), pp.g1.d_c.get(), o.c1.size() * 2, cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(cudaMemcpy(o.c2.data(), pp.d_c2.get(), o.c2.size() * 2, cudaMemcpyDeviceToHost),
            cudaSuccess);
  return o;
}

// Poisons both outputs (and zeroes the counters, as the layer's align launch does) on `stream`.
void reset_pair(const PairProblem& pp, cudaStream_t stream) {
  EXPECT_EQ(cudaMemsetAsync(pp.g1.d_c.get(), 0xFF, pp.g1.d_c.bytes(), stream), cudaSuccess);
  EXPECT_EQ(cudaMemsetAsync(pp.d_c2.get(), 0xFF, pp.d_c2.bytes(), stream), cudaSuccess);
  EXPECT_EQ(cudaMemsetAsync(pp.d_done.get(), 0, pp.d_done.bytes(), stream), cudaSuccess);
}

PairOut run_two_launches(const PairProblem& pp, int row) {
  reset_pair(pp, nullptr);
  GroupedGemmParams params;
  params.tile = row;
  EXPECT_EQ(moekit::cuda::run_grouped_gemm(pp.g1.args, nullptr, params), cudaSuccess);
  EXPECT_EQ(moekit::cuda::run_grouped_gemm(pp.a2, nullptr, params), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return fetch_pair(pp);
}

PairOut run_pair(const PairProblem& pp, int row, const sm90::WeightLaunchCache* cache = nullptr) {
  reset_pair(pp, nullptr);
  EXPECT_EQ(moekit::cuda::can_run_grouped_gemm_pair(pp.g1.args, pp.a2, row), "");
  EXPECT_EQ(moekit::cuda::run_grouped_gemm_pair(pp.g1.args, pp.a2, row, pp.d_done.as<int32_t>(),
                                                nullptr, cache),
            cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return fetch_pair(pp);
}

// GEMM2 of the pair against float64 of the activation rows it read (c1, as written), the
// unscheduled rows still poisoned.
void check_gemm2(const PairProblem& pp, const PairOut& o, const std::string& label) {
  const Problem& p = pp.g1;
  const int k2 = p.cs.n / 2;
  const double elem_rel = p.cs.dtype == ElemType::kBF16 ? 4.5e-3 : 6e-4;
  int64_t bad = 0, unwritten = 0, clobbered = 0, checked = 0;
  for (int64_t r = 0; r < p.num_rows; ++r) {
    const int e = p.row_expert[r];
    for (int j = 0; j < pp.n2; ++j) {
      const uint16_t bits = o.c2[r * pp.n2 + j];
      if (e < 0) {
        clobbered += bits != 0xFFFF;
        continue;
      }
      double s = pp.b2[static_cast<size_t>(e) * pp.n2 + j], mag = std::fabs(s);
      for (int kk = 0; kk < k2; ++kk) {
        const double t = static_cast<double>(to_f(o.c1[r * p.ldc + kk], p.cs.dtype)) *
                         to_f(pp.w2[(static_cast<size_t>(e) * pp.n2 + j) * k2 + kk], p.cs.dtype);
        s += t;
        mag += std::fabs(t);
      }
      if (bits == 0xFFFF) {
        ++unwritten;
        continue;
      }
      ++checked;
      const double got = to_f(bits, p.cs.dtype);
      if (!(std::fabs(got - s) <= elem_rel * std::fabs(s) + 1e-5 * mag)) {
        if (bad < 5) {
          ADD_FAILURE() << label << ": C2[" << r << "," << j << "] = " << got << ", float64 " << s;
        }
        ++bad;
      }
    }
  }
  EXPECT_EQ(unwritten, 0) << label << ": GEMM2 elements left unwritten";
  EXPECT_EQ(clobbered, 0) << label << ": GEMM2 wrote rows outside the schedule";
  EXPECT_EQ(bad, 0) << label << ": GEMM2 mismatches out of " << checked;
  EXPECT_GT(checked, 0) << label;
}

void expect_pair_matches_two_launches(const PairProblem& pp, const std::string& label) {
  const int row = sm90::find_tile("1x64simt");
  const PairOut two = run_two_launches(pp, row);
  const PairOut one = run_pair(pp, row);
  check(pp.g1, one.c1, label + " GEMM1");
  check_gemm2(pp, one, label);
  EXPECT_EQ(0, std::memcmp(two.c1.data(), one.c1.data(), two.c1.size() * 2)) << label;
  EXPECT_EQ(0, std::memcmp(two.c2.data(), one.c2.data(), two.c2.size() * 2)) << label;
}

// Decode-sized schedules (experts with 0-3 rows), gather with padding rows, biases, padded lda /
// ldc, both dtypes and two activations: the pair's outputs are bitwise the two launches', GEMM1
// and GEMM2 match float64, nothing outside the schedule is written.
TEST(GroupedGemmPair, MatchesTwoLaunchesBitwise) {
  REQUIRE_GPU();
  for (ElemType dt : {ElemType::kBF16, ElemType::kF16}) {
    for (FusedActivation act : {FusedActivation::kSiluMul, FusedActivation::kSwigluOai}) {
      Case cs;
      cs.dtype = dt;
      cs.act = act;
      cs.counts = {0, 1, 2, 3, 0, 1, 1};
      cs.n = 320;
      cs.k = 136;
      cs.gather = true;
      cs.bias = BiasKind::kFp32;
      cs.lda_pad = 8;
      cs.ldc_pad = 8;
      cs.seed = 300 + static_cast<uint32_t>(act);
      PairProblem pp;
      build_pair(pp, cs, 200);
      expect_pair_matches_two_launches(
          pp, std::string("pair ") + act_name(act) + (dt == ElemType::kBF16 ? " bf16" : " f16"));
    }
  }
}

// More tasks than the grid has warps (GEMM1 8192, GEMM2 8192 warp tasks over 264 CTAs x 16):
// warps reach GEMM2 tasks whose experts' GEMM1 work other warps are still doing; the prepared
// launch state gives the same bits.
TEST(GroupedGemmPair, MoreTasksThanWarpsWaitAndMatch) {
  REQUIRE_GPU();
  Case cs;
  cs.act = FusedActivation::kSiluMul;
  cs.counts.assign(16, 2);
  cs.n = 1024;
  cs.k = 64;
  cs.seed = 310;
  PairProblem pp;
  build_pair(pp, cs, 1024);
  expect_pair_matches_two_launches(pp, "pair, many tasks");
  sm90::WeightLaunchCache cache;
  CUDA_OK(moekit::cuda::prepare_grouped_gemm_weights(pp.g1.args, &cache));
  const int row = sm90::find_tile("1x64simt");
  EXPECT_GT(cache.pair_blocks[row], 0);
  const PairOut direct = run_pair(pp, row), prepared = run_pair(pp, row, &cache);
  EXPECT_EQ(0, std::memcmp(direct.c2.data(), prepared.c2.data(), direct.c2.size() * 2));
}

// No rows at all (M = 0): the pair writes nothing.
TEST(GroupedGemmPair, EmptyScheduleWritesNothing) {
  REQUIRE_GPU();
  Case cs;
  cs.act = FusedActivation::kSiluMul;
  cs.counts = {0, 0, 0};
  cs.n = 128;
  cs.k = 64;
  PairProblem pp;
  build_pair(pp, cs, 64);
  pp.g1.args.num_rows_upper_bound = pp.a2.num_rows_upper_bound = 0;
  const PairOut o = run_pair(pp, sm90::find_tile("1x64simt"));
  EXPECT_TRUE(std::all_of(o.c1.begin(), o.c1.end(), [](uint16_t v) { return v == 0xFFFF; }));
  EXPECT_TRUE(std::all_of(o.c2.begin(), o.c2.end(), [](uint16_t v) { return v == 0xFFFF; }));
}

// Captured with the counters' reset (the align launch's part in the layer) and replayed twice:
// the same bits as a direct launch each time.
TEST(GroupedGemmPair, GraphReplaysAreBitwiseTheDirectLaunch) {
  REQUIRE_GPU();
  Case cs;
  cs.act = FusedActivation::kGeluMul;
  cs.counts = {1, 0, 2, 1, 1, 0, 3, 1};
  cs.n = 256;
  cs.k = 512;
  cs.gather = true;
  cs.seed = 320;
  PairProblem pp;
  build_pair(pp, cs, 512);
  const int row = sm90::find_tile("1x64simt");
  const PairOut direct = run_pair(pp, row);
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  reset_pair(pp, stream);
  const cudaError_t launched = moekit::cuda::run_grouped_gemm_pair(
      pp.g1.args, pp.a2, row, pp.d_done.as<int32_t>(), stream, nullptr);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  CUDA_OK(launched);
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    const PairOut g = fetch_pair(pp);
    EXPECT_EQ(0, std::memcmp(direct.c1.data(), g.c1.data(), g.c1.size() * 2)) << replay;
    EXPECT_EQ(0, std::memcmp(direct.c2.data(), g.c2.data(), g.c2.size() * 2)) << replay;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// What the pair refuses, by name.
TEST(GroupedGemmPair, CanRunGivesReasons) {
  REQUIRE_GPU();
  Case cs;
  cs.act = FusedActivation::kSiluMul;
  cs.counts = {1, 2};
  cs.n = 128;
  cs.k = 64;
  PairProblem pp;
  build_pair(pp, cs, 64);
  const int simt = sm90::find_tile("1x64simt");
  using moekit::cuda::can_run_grouped_gemm_pair;
  EXPECT_EQ(can_run_grouped_gemm_pair(pp.g1.args, pp.a2, simt), "");
  EXPECT_EQ(can_run_grouped_gemm_pair(pp.g1.args, pp.a2, sm90::find_tile("16x64")),
            "row 0 is not a CUDA-core row of the problems' family");
  GroupedGemmArgs g1 = pp.g1.args, g2 = pp.a2;
  g1.w_packing = moekit::cuda::WPacking::kMxfp4;  // W4A16: slower as a pair, refused
  EXPECT_EQ(can_run_grouped_gemm_pair(g1, g2, simt), "the decode pair runs 16-bit problems only");
  g1 = pp.g1.args;
  g1.fused_act = FusedActivation::kNone;
  g1.ldc = 128;
  EXPECT_EQ(can_run_grouped_gemm_pair(g1, g2, simt), "GEMM1 has no fused activation");
  g1 = pp.g1.args;
  g2.a = pp.g1.args.a;
  EXPECT_NE(can_run_grouped_gemm_pair(g1, g2, simt).find("in place"), std::string::npos);
  g2 = pp.a2;
  g2.k = 32;
  g2.lda = pp.g1.ldc;
  EXPECT_NE(can_run_grouped_gemm_pair(g1, g2, simt).find("n / 2"), std::string::npos);
  g2 = pp.a2;
  g2.expert_offsets = pp.g1.d_counts.as<int32_t>();
  EXPECT_EQ(can_run_grouped_gemm_pair(g1, g2, simt),
            "GEMM1 and GEMM2 do not share one offsets schedule");
  EXPECT_EQ(moekit::cuda::run_grouped_gemm_pair(pp.g1.args, pp.a2, simt, nullptr, nullptr),
            cudaErrorInvalidValue);
}

// ---- fp8: both accumulation families against float64
// ---------------------------------------------

// The e4m3 problem of the 8-bit accuracy tests: A (rows, k) codes, W, C (rows, n) bf16 and the
// offsets schedule of `experts` experts (scales and packing set by the caller).
GroupedGemmArgs e4m3_args(const DeviceBuffer& a, const DeviceBuffer& w, const DeviceBuffer& c,
                          const DeviceBuffer& offsets, int experts, int rows, int n, int k) {
  GroupedGemmArgs g;
  g.a = a.get();
  g.lda = k;
  g.w = w.get();
  g.c = c.get();
  g.ldc = n;
  g.expert_offsets = offsets.as<int32_t>();
  g.num_experts = experts;
  g.num_rows_upper_bound = rows;
  g.n = n;
  g.k = k;
  g.dtype = ElemType::kE4M3;
  g.out_dtype = ElemType::kBF16;
  return g;
}

// C (bf16, ref.size() elements) against ref: relative L2 error and the largest relative error over
// the finite elements; each non-finite one fails (the first five are named, with `label`).
struct CErrors {
  double rel_l2 = 0, max_rel = 0;
};
CErrors compare_bf16_c(const DeviceBuffer& d_c, const std::vector<double>& ref,
                       const std::string& label) {
  std::vector<uint16_t> c(ref.size());
  EXPECT_EQ(cudaMemcpy(c.data(), d_c.get(), c.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  double err2 = 0.0, ref2 = 0.0;
  CErrors out;
  int bad = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    const double got = moekit::bf16_bits_to_float(c[i]);
    if (!std::isfinite(got)) {
      if (bad++ < 5) ADD_FAILURE() << label << " element " << i << ": " << got;
      continue;
    }
    err2 += (got - ref[i]) * (got - ref[i]);
    ref2 += ref[i] * ref[i];
    out.max_rel = std::max(out.max_rel, std::fabs(got - ref[i]) / (std::fabs(ref[i]) + 1e-30));
  }
  EXPECT_EQ(bad, 0) << label;
  out.rel_l2 = std::sqrt(err2 / ref2);
  return out;
}

// Long K (deepseek-v3's hidden size), random e4m3 codes of both signs and many binades, an uneven
// schedule with an empty expert, every fp8 tile: per-row A and per-channel W scales run the
// kFp8Direct rows (accumulated in the tensor cores over all of K); the same codes with 1x128 and
// 128x128 block scales of 1 (the row / channel scales folded into the float64 reference's inputs)
// run the promoting kFp8 rows. Both must match the float64 product of the codes; the direct rows'
// extra error (the tensor cores' accumulator over 7168 elements) is printed and bounded well below
// bf16's rounding of C. C is poisoned: every written element must be finite.
TEST(GroupedGemmFp8, LongKBothFamiliesMatchFloat64) {
  REQUIRE_GPU();
  const std::vector<int> counts = {3, 0, 130, 64};
  const int n = 256, k = 7168, E = static_cast<int>(counts.size());
  const int k_blocks = k / 128;
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  auto random_code = [&] {
    // |x| spread over 2^-6..2^2 times a sign: exercises alignment inside the accumulator.
    const float x = uni(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 8) - 6);
    return moekit::quant::encode_e4m3(x);
  };
  std::vector<int32_t> offsets(counts.size() + 1, 0);
  for (size_t e = 0; e < counts.size(); ++e)
    offsets[e + 1] = offsets[e] + counts[e];
  const int rows = offsets.back();
  std::vector<uint8_t> a(static_cast<size_t>(rows) * k), w(static_cast<size_t>(E) * n * k);
  for (auto& c : a)
    c = random_code();
  for (auto& c : w)
    c = random_code();
  std::vector<float> a_row(rows), w_channel(static_cast<size_t>(E) * n);
  for (auto& f : a_row)
    f = std::ldexp(1.0f + 0.5f * uni(rng), -3);
  for (auto& f : w_channel)
    f = std::ldexp(1.0f + 0.5f * uni(rng), -4);
  const std::vector<float> ones_a(static_cast<size_t>(rows) * k_blocks, 1.0f);
  const std::vector<float> ones_w(static_cast<size_t>(E) * (n / 32) * k_blocks, 1.0f);

  // float64 references: with the scales (direct) and of the bare codes (promoted).
  std::vector<double> ref_scaled(static_cast<size_t>(rows) * n), ref_codes(ref_scaled.size());
  std::vector<double> da(a.size()), dw(w.size());
  for (size_t i = 0; i < a.size(); ++i)
    da[i] = moekit::quant::decode_e4m3(a[i]);
  for (size_t i = 0; i < w.size(); ++i)
    dw[i] = moekit::quant::decode_e4m3(w[i]);
  for (int e = 0; e < E; ++e) {
    for (int r = offsets[e]; r < offsets[e + 1]; ++r) {
      for (int c = 0; c < n; ++c) {
        const double* ar = &da[static_cast<size_t>(r) * k];
        const double* wr = &dw[(static_cast<size_t>(e) * n + c) * k];
        double sum = 0.0;
        for (int kk = 0; kk < k; ++kk)
          sum += ar[kk] * wr[kk];
        const size_t o = static_cast<size_t>(r) * n + c;
        ref_codes[o] = sum;
        ref_scaled[o] = sum * a_row[r] * w_channel[static_cast<size_t>(e) * n + c];
      }
    }
  }

  DeviceBuffer d_a = upload(a), d_w = upload(w), d_offsets = upload(offsets);
  DeviceBuffer d_a_row = upload(a_row), d_w_channel = upload(w_channel);
  DeviceBuffer d_ones_a = upload(ones_a), d_ones_w = upload(ones_w);
  DeviceBuffer d_c(static_cast<size_t>(rows) * n * 2);
  GroupedGemmArgs g = e4m3_args(d_a, d_w, d_c, d_offsets, E, rows, n, k);
  for (const bool promoted : {false, true}) {
    if (promoted) {
      g.a_scale_kind = moekit::cuda::AScale::kRowBlock128;
      g.a_scale = d_ones_a.as<float>();
      g.a_scale_ld = k_blocks;
      g.w_scale_kind = moekit::cuda::WScale::kBlock32x128;
      g.w_scale = d_ones_w.as<float>();
    } else {
      g.a_scale_kind = moekit::cuda::AScale::kRow;
      g.a_scale = d_a_row.as<float>();
      g.w_scale_kind = moekit::cuda::WScale::kChannel;
      g.w_scale = d_w_channel.as<float>();
    }
    const sm90::TileFamily family = moekit::cuda::tile_family_of(g);
    ASSERT_EQ(family, promoted ? sm90::TileFamily::kFp8 : sm90::TileFamily::kFp8Direct);
    const std::vector<double>& ref = promoted ? ref_codes : ref_scaled;
    // max_ctas 3: every CTA walks several work items, so the rings of the rows that load across
    // items (single-role, swap-AB) wrap at a different slot in each item (56 K steps).
    // Runs 2 and 3 of a stream-K row: stream-K forced on (items split over 264 and 3 CTAs).
    const DeviceBuffer ws = stream_k_workspace();
    for (int run = 0; run < 4 * sm90::kNumTiles; ++run) {
      const int tile = run / 4;
      if (sm90::kTileTable[tile].family != family) continue;
      const bool stream_k = run % 4 >= 2;
      if (stream_k && !sm90::stream_k_capable(sm90::kTileTable[tile])) continue;
      GroupedGemmParams params;
      params.tile = tile;
      params.max_ctas = run % 2 == 0 ? 0 : 3;
      params.stream_k = stream_k ? moekit::cuda::StreamK::kAlways : moekit::cuda::StreamK::kOff;
      ASSERT_EQ(moekit::cuda::can_implement(g, params), "");
      CUDA_OK(cudaMemset(d_c.get(), 0xFF, d_c.bytes()));
      CUDA_OK(moekit::cuda::run_grouped_gemm(g, nullptr, params, stream_k ? ws.get() : nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      const CErrors err = compare_bf16_c(d_c, ref, sm90::kTileTable[tile].name);
      const double rel_l2 = err.rel_l2, max_rel = err.max_rel;
      if (stream_k) expect_counters_zero(ws, sm90::kTileTable[tile].name);
      std::cout << "[fp8 accumulation] " << (promoted ? "promoted " : "direct ")
                << sm90::kTileTable[tile].name << (stream_k ? " stream-K" : "") << " ctas "
                << params.max_ctas << " k=" << k << ": rel_l2 " << rel_l2 << ", max rel " << max_rel
                << "\n";
      // Measured on an H200: promoted 1.69e-3 (bf16's rounding of C), direct 2.80e-3 (the
      // tensor cores' accumulator adds ~2.2e-3 in quadrature over k = 7168).
      EXPECT_LE(rel_l2, promoted ? 2e-3 : 3.5e-3) << sm90::kTileTable[tile].name;
    }
  }
}

// ---- W4A8: int4-packed W converted to e4m3 ------------------------------------------------------

// Every row of `family` runs g (C poisoned first) within `bound` relative L2 of ref; the error
// printed after `label` with the row's name and k.
void every_row_vs_float64(const GroupedGemmArgs& g, sm90::TileFamily family, DeviceBuffer& d_c,
                          const std::vector<double>& ref, const std::string& label, int k,
                          double bound) {
  ASSERT_EQ(moekit::cuda::tile_family_of(g), family);
  ASSERT_EQ(moekit::cuda::can_implement(g), "");
  for (int tile = 0; tile < sm90::kNumTiles; ++tile) {
    if (sm90::kTileTable[tile].family != family) continue;
    GroupedGemmParams params;
    params.tile = tile;
    ASSERT_EQ(moekit::cuda::can_implement(g, params), "");
    CUDA_OK(cudaMemset(d_c.get(), 0xFF, d_c.bytes()));
    CUDA_OK(moekit::cuda::run_grouped_gemm(g, nullptr, params));
    CUDA_OK(cudaDeviceSynchronize());
    const std::string name = std::string(sm90::kTileTable[tile].name) + " k=" + std::to_string(k);
    const double rel_l2 = compare_bf16_c(d_c, ref, name).rel_l2;
    std::cout << label << name << ": rel_l2 " << rel_l2 << "\n";
    EXPECT_LE(rel_l2, bound) << name;
  }
}

// The W4A8 and MXFP4 x fp8 tests' schedule: experts of 3, 0, 200, 1 and 17 rows.
std::vector<int32_t> uneven_offsets() {
  std::vector<int32_t> offsets = {0};
  for (const int count : {3, 0, 200, 1, 17})
    offsets.push_back(offsets.back() + count);
  return offsets;
}

// e4m3 codes of values in [-1, 1] times 2^-4 .. 2^1.
void random_e4m3_codes(std::vector<uint8_t>& codes, std::mt19937& rng) {
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  for (auto& c : codes)
    c = moekit::quant::encode_e4m3(uni(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 6) - 4));
}

// Random uint4b8 weights (every nibble value; uploaded as split codes), e4m3 A codes, per-row A
// scales and W scales per channel (kW4A8 rows) or per channel and 128 of K (kGroup128, the
// kW4A8Group rows, which promote each K step), an uneven schedule with an empty expert and experts
// of 1, 3 and 200 rows, a K that ends inside a K step (k = 352: 2 full steps and 96 of 128) and a
// long one (deepseek-v3's 7168), n past the last tile: every row of the family against the float64
// product (int4 values exactly as e4m3, so only the accumulation and bf16's rounding of C differ).
// C is poisoned: every written element must be finite. Bad inputs: 32x128 blocks, 1x128 A groups, k
// not a multiple of 32, 16-bit A, unaligned group scales.
TEST(GroupedGemmW4A8, EveryRowMatchesFloat64) {
  REQUIRE_GPU();
  const std::vector<int32_t> offsets = uneven_offsets();
  const int n = 320, E = static_cast<int>(offsets.size()) - 1, rows = offsets.back();
  std::mt19937 rng(29);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  for (const int k : {352, 7168}) {
    const int groups = (k + 127) / 128;
    std::vector<uint8_t> a(static_cast<size_t>(rows) * k), w(static_cast<size_t>(E) * n * k / 2);
    random_e4m3_codes(a, rng);
    for (auto& c : w)
      c = static_cast<uint8_t>(rng());
    std::vector<float> a_row(rows);
    for (auto& f : a_row)
      f = std::ldexp(1.0f + 0.5f * uni(rng), -3);
    // Products of each row of A with each W row, per group of 128 of K (exact in float64).
    std::vector<double> partial(static_cast<size_t>(rows) * n * groups), da(a.size()), wv(k);
    for (size_t i = 0; i < a.size(); ++i)
      da[i] = moekit::quant::decode_e4m3(a[i]);
    for (int e = 0; e < E; ++e) {
      for (int c = 0; c < n; ++c) {
        const uint8_t* wr = &w[(static_cast<size_t>(e) * n + c) * (k / 2)];
        for (int kk = 0; kk < k; ++kk)
          wv[kk] = static_cast<double>(((wr[kk / 2] >> (4 * (kk % 2))) & 0xF) - 8);
        for (int r = offsets[e]; r < offsets[e + 1]; ++r) {
          const double* ar = &da[static_cast<size_t>(r) * k];
          for (int kk = 0; kk < k; ++kk)
            partial[(static_cast<size_t>(r) * n + c) * groups + kk / 128] += ar[kk] * wv[kk];
        }
      }
    }
    // The kernels read split codes (bits 2 and 3 of each nibble swapped, as the layer's weight
    // layout stores them).
    std::vector<uint8_t> w_split(w.size());
    for (size_t i = 0; i < w.size(); i += 4) {
      uint32_t word;
      std::memcpy(&word, &w[i], 4);
      word = sm90::int4_split_word(word);
      std::memcpy(&w_split[i], &word, 4);
    }
    DeviceBuffer d_a = upload(a), d_w = upload(w_split), d_offsets = upload(offsets);
    DeviceBuffer d_a_row = upload(a_row);
    DeviceBuffer d_c(static_cast<size_t>(rows) * n * 2);
    for (const bool grouped : {false, true}) {
      // W scales: (E, n) per channel; grouped (E, groups, n) in the kernel's K-major layout.
      const size_t per_expert = static_cast<size_t>(grouped ? groups * n : n);
      std::vector<float> w_scale(E * per_expert);
      for (auto& f : w_scale)
        f = std::ldexp(1.0f + 0.5f * uni(rng), -4 - static_cast<int>(rng() % 3));
      std::vector<double> ref(static_cast<size_t>(rows) * n);
      for (int e = 0; e < E; ++e) {
        for (int r = offsets[e]; r < offsets[e + 1]; ++r) {
          for (int c = 0; c < n; ++c) {
            double sum = 0.0;
            for (int j = 0; j < groups; ++j) {
              const double ws = w_scale[e * per_expert + (grouped ? j * n + c : c)];
              sum += partial[(static_cast<size_t>(r) * n + c) * groups + j] * (grouped ? ws : 1.0);
            }
            ref[static_cast<size_t>(r) * n + c] =
                sum * a_row[r] * (grouped ? 1.0 : w_scale[e * per_expert + c]);
          }
        }
      }
      DeviceBuffer d_w_scale = upload(w_scale);
      GroupedGemmArgs g = e4m3_args(d_a, d_w, d_c, d_offsets, E, rows, n, k);
      g.w_packing = moekit::cuda::WPacking::kInt4;
      g.a_scale_kind = moekit::cuda::AScale::kRow;
      g.a_scale = d_a_row.as<float>();
      g.w_scale_kind = grouped ? moekit::cuda::WScale::kGroup128 : moekit::cuda::WScale::kChannel;
      g.w_scale = d_w_scale.as<float>();
      const sm90::TileFamily family =
          grouped ? sm90::TileFamily::kW4A8Group : sm90::TileFamily::kW4A8;
      // bf16's rounding of C (~1.7e-3) and the tensor cores' accumulator (fp8's direct rows:
      // 2.8e-3 in all at k = 7168; promoted per 128 of K: the rounding of C alone, as block-128).
      every_row_vs_float64(g, family, d_c, ref,
                           std::string("[w4a8] ") + (grouped ? "groups of 128 " : "per channel "),
                           k, grouped ? 2e-3 : 3.5e-3);
      if (grouped) {
        GroupedGemmArgs bad = g;
        bad.w_scale = reinterpret_cast<const float*>(d_w_scale.as<uint8_t>() + 4);
        EXPECT_EQ(moekit::cuda::can_implement(bad),
                  "W4A8 group scales (w_scale) must be 16-byte aligned");
        continue;
      }
      GroupedGemmArgs bad = g;
      bad.w_scale_kind = moekit::cuda::WScale::kBlock32x128;
      EXPECT_EQ(moekit::cuda::can_implement(bad),
                "W4A8 W takes a per-expert or per-channel scale, or one per channel and 128 of K");
      bad = g;
      bad.a_scale_kind = moekit::cuda::AScale::kRowBlock128;
      bad.a_scale_ld = (k + 127) / 128;
      EXPECT_EQ(moekit::cuda::can_implement(bad),
                "W4A8 A takes a per-tensor or per-row scale (no 1x128 groups)");
      bad = g;
      bad.k = 336;
      bad.lda = 336;
      EXPECT_EQ(moekit::cuda::can_implement(bad),
                "k=336 is not a multiple of 32 (whole 16-byte chunks of int4)");
      bad = g;
      bad.dtype = ElemType::kBF16;
      EXPECT_EQ(moekit::cuda::can_implement(bad),
                "dtype bf16 is not e4m3 (int4 W runs with fp8 activations)");
    }
  }
}

// ---- MXFP4 W with e4m3 A: e2m1 codes converted to e4m3 with their group scales ------------------

// Random e2m1 codes (every code), e8m0 scales per 32 of K around 2^0 with some rows' groups far
// below their step's largest (2^-9 .. 2^-30: the conversion's table entries, rounded and zero),
// e4m3 A codes with per-row scales, the uneven schedule of the W4A8 test, k = 352 (a last step of
// three groups) and 7168, n past the last tile: both kMxfp4A8 rows against the float64 product of
// the exact values (the rows promote every K step; groups under 2^-11 of their step's largest
// round, far below bf16's rounding of C). C poisoned. Bad inputs: a w_scale beside the words, an
// unaligned w_group_scale, k not a multiple of 32, 16-bit A.
TEST(GroupedGemmMxfp4Fp8, EveryRowMatchesFloat64) {
  REQUIRE_GPU();
  const std::vector<int32_t> offsets = uneven_offsets();
  const int n = 320, E = static_cast<int>(offsets.size()) - 1, rows = offsets.back();
  std::mt19937 rng(31);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  for (const int k : {352, 7168}) {
    const int g32 = k / 32, steps = (k + 127) / 128;
    std::vector<uint8_t> a(static_cast<size_t>(rows) * k), w(static_cast<size_t>(E) * n * k / 2);
    random_e4m3_codes(a, rng);
    for (auto& c : w)
      c = static_cast<uint8_t>(rng());
    // e8m0 codes (E, n, k / 32): 124 .. 130, every 7th row with one group per step 9 .. 30 below.
    std::vector<uint8_t> codes(static_cast<size_t>(E) * n * g32);
    for (size_t i = 0; i < codes.size(); ++i) {
      const size_t row = i / g32;
      codes[i] = static_cast<uint8_t>(124 + rng() % 7);
      if (row % 7 == 3 && i % 4 == row % 4)
        codes[i] = static_cast<uint8_t>(codes[i] - 9 - rng() % 22);
    }
    // The kernel's words (E, steps, n): byte q of word (e, j, c) = group 4 j + q of row c.
    std::vector<uint32_t> words(static_cast<size_t>(E) * steps * n, 0);
    for (int e = 0; e < E; ++e) {
      for (int c = 0; c < n; ++c) {
        for (int q = 0; q < g32; ++q) {
          words[(static_cast<size_t>(e) * steps + q / 4) * n + c] |=
              static_cast<uint32_t>(codes[(static_cast<size_t>(e) * n + c) * g32 + q])
              << (8 * (q % 4));
        }
      }
    }
    std::vector<float> a_row(rows);
    for (auto& f : a_row)
      f = std::ldexp(1.0f + 0.5f * uni(rng), -3);
    std::vector<double> ref(static_cast<size_t>(rows) * n, 0.0), wv(k), da(a.size());
    for (size_t i = 0; i < a.size(); ++i)
      da[i] = moekit::quant::decode_e4m3(a[i]);
    for (int e = 0; e < E; ++e) {
      for (int c = 0; c < n; ++c) {
        const size_t wrow = static_cast<size_t>(e) * n + c;
        for (int kk = 0; kk < k; ++kk) {
          const auto code =
              static_cast<uint8_t>((w[wrow * (k / 2) + kk / 2] >> (4 * (kk % 2))) & 0xF);
          wv[kk] = std::ldexp(static_cast<double>(moekit::quant::decode_fp4_e2m1(code)),
                              codes[wrow * g32 + kk / 32] - 127);
        }
        for (int r = offsets[e]; r < offsets[e + 1]; ++r) {
          double sum = 0.0;
          for (int kk = 0; kk < k; ++kk)
            sum += da[static_cast<size_t>(r) * k + kk] * wv[kk];
          ref[static_cast<size_t>(r) * n + c] = sum * a_row[r];
        }
      }
    }
    DeviceBuffer d_a = upload(a), d_w = upload(w), d_offsets = upload(offsets);
    DeviceBuffer d_a_row = upload(a_row), d_words = upload(words);
    DeviceBuffer d_c(static_cast<size_t>(rows) * n * 2);
    GroupedGemmArgs g = e4m3_args(d_a, d_w, d_c, d_offsets, E, rows, n, k);
    g.w_packing = moekit::cuda::WPacking::kMxfp4Fp8;
    g.a_scale_kind = moekit::cuda::AScale::kRow;
    g.a_scale = d_a_row.as<float>();
    g.w_scale_kind = moekit::cuda::WScale::kNone;
    g.w_scale = nullptr;
    g.w_group_scale = d_words.as<uint8_t>();
    every_row_vs_float64(g, sm90::TileFamily::kMxfp4A8, d_c, ref, "[mxfp4_fp8] ", k, 2e-3);
    GroupedGemmArgs bad = g;
    bad.w_scale = d_a_row.as<float>();
    bad.w_scale_kind = moekit::cuda::WScale::kChannel;
    EXPECT_EQ(moekit::cuda::can_implement(bad),
              "MXFP4 W takes no w_scale beside its e8m0 words (w_group_scale)");
    bad = g;
    bad.w_group_scale = d_words.as<uint8_t>() + 4;
    EXPECT_EQ(moekit::cuda::can_implement(bad),
              "MXFP4 W needs its e8m0 words (w_group_scale), 16-byte aligned");
    bad = g;
    bad.k = 336;
    bad.lda = 336;
    EXPECT_EQ(moekit::cuda::can_implement(bad), "k=336 is not a multiple of 32 (MXFP4 groups)");
    bad = g;
    bad.dtype = ElemType::kBF16;
    EXPECT_EQ(moekit::cuda::can_implement(bad),
              "dtype bf16 is not e4m3 (MXFP4 W of this packing runs with fp8 activations)");
  }
}

// ---- W4A16: MXFP4-packed W ----------------------------------------------------------------------

// One W4A16 problem: bf16 A (rows, k), W as e2m1 pairs (E, n, k / 2) with e8m0 codes (E, n, k /
// 32), the schedule `counts`; C (rows, n) bf16 poisoned before the run.
// NVFP4 (`global` given): ue4m3 codes (E, n, k / 16) and a global scale per expert.
// MXFP6 (`packing` kMxfp6*): w holds standard MXFP6 rows (E, n, 3k / 4), e8m0 codes as MXFP4's.
struct W4Problem {
  int n = 0, k = 0, num_experts = 0, rows = 0;
  moekit::cuda::WPacking packing = moekit::cuda::WPacking::kMxfp4;
  std::vector<int32_t> offsets;
  std::vector<uint16_t> a;  // bf16 bits
  std::vector<uint8_t> w, scale;
  std::vector<float> global;  // NVFP4 only
  DeviceBuffer d_a, d_w, d_scale, d_global, d_c, d_offsets;
  GroupedGemmArgs args;

  bool nvfp4() const { return !global.empty(); }
  bool mxfp6() const {
    return packing == moekit::cuda::WPacking::kMxfp6E2M3 ||
           packing == moekit::cuda::WPacking::kMxfp6E3M2;
  }
  // The exact value of W[e][c][kk] (e2m1 or fp6 x 2^(s - 127); NVFP4: e2m1 x ue4m3 x global).
  double w_value(int e, int c, int kk) const {
    if (mxfp6()) {
      uint8_t codes[sm90::kMxfp6GroupElems];
      sm90::mxfp6_read_group(w.data() + (static_cast<size_t>(e) * n + c) * (3 * k / 4), k, kk / 32,
                             false, codes);
      const uint8_t code = codes[kk % 32];
      const double v = packing == moekit::cuda::WPacking::kMxfp6E2M3
                           ? moekit::quant::decode_fp6_e2m3(code)
                           : moekit::quant::decode_fp6_e3m2(code);
      const uint8_t s = scale[(static_cast<size_t>(e) * n + c) * (k / 32) + kk / 32];
      return v * static_cast<double>(moekit::quant::decode_e8m0(s));
    }
    const uint8_t byte = w[(static_cast<size_t>(e) * n + c) * (k / 2) + kk / 2];
    const uint8_t code = kk % 2 == 0 ? byte & 0xF : byte >> 4;
    const double v = moekit::quant::decode_fp4_e2m1(code);
    if (nvfp4()) {
      const uint8_t s = scale[(static_cast<size_t>(e) * n + c) * (k / 16) + kk / 16];
      return v * moekit::quant::decode_ue4m3(s) * global[static_cast<size_t>(e)];
    }
    const uint8_t s = scale[(static_cast<size_t>(e) * n + c) * (k / 32) + kk / 32];
    return v * static_cast<double>(moekit::quant::decode_e8m0(s));
  }
};

void build_w4(W4Problem& p, std::vector<int> counts, int n, int k, std::vector<uint16_t> a,
              std::vector<uint8_t> w, std::vector<uint8_t> scale, std::vector<float> global = {},
              moekit::cuda::WPacking packing = moekit::cuda::WPacking::kMxfp4) {
  p.packing = packing;
  p.n = n;
  p.k = k;
  p.num_experts = static_cast<int>(counts.size());
  p.offsets.assign(counts.size() + 1, 0);
  for (size_t e = 0; e < counts.size(); ++e)
    p.offsets[e + 1] = p.offsets[e] + counts[e];
  p.rows = p.offsets.back();
  p.a = std::move(a);
  p.w = std::move(w);
  p.scale = std::move(scale);
  p.d_a = upload(p.a);
  // The kernels read each group's codes in their nibble order (MXFP6: each row repacked).
  std::vector<uint8_t> kernel_w = p.w;
  if (p.mxfp6()) {
    sm90::mxfp6_repack_rows(kernel_w.data(), static_cast<int64_t>(counts.size()) * n, k, true);
  } else {
    sm90::mxfp4_reorder_groups(
        kernel_w.data(), static_cast<int64_t>(kernel_w.size()) / sm90::kMxfp4GroupBytes, true);
  }
  p.d_w = upload(kernel_w);
  p.global = std::move(global);
  if (p.nvfp4()) {  // kernel scale codes and global scales x 2^8 (sm90/mxfp4_layout.h)
    std::vector<uint8_t> codes(p.scale.size());
    for (size_t i = 0; i < codes.size(); ++i)
      codes[i] = sm90::nvfp4_kernel_scale(p.scale[i]);
    std::vector<float> g(p.global.size());
    for (size_t e = 0; e < g.size(); ++e)
      g[e] = p.global[e] * sm90::kNvfp4PairExponentScale;
    p.d_scale = upload(codes);
    p.d_global = upload(g);
  } else {
    p.d_scale = upload(p.scale);
  }
  p.d_offsets = upload(p.offsets);
  p.d_c = DeviceBuffer(static_cast<size_t>(std::max(1, p.rows)) * n * 2);
  GroupedGemmArgs& g = p.args;
  g.a = p.d_a.get();
  g.lda = k;
  g.w = p.d_w.get();
  g.c = p.d_c.get();
  g.ldc = n;
  g.expert_offsets = p.d_offsets.as<int32_t>();
  g.num_experts = p.num_experts;
  g.num_rows_upper_bound = p.rows;
  g.n = n;
  g.k = k;
  g.dtype = ElemType::kBF16;
  g.w_packing = p.packing;
  g.w_group_scale = p.d_scale.as<uint8_t>();
  if (p.nvfp4()) {
    g.w_packing = moekit::cuda::WPacking::kNvfp4;
    g.w_scale_kind = moekit::cuda::WScale::kExpert;
    g.w_scale = p.d_global.as<float>();
  }
}

std::vector<uint16_t> run_w4(const W4Problem& p, int tile) {
  std::vector<uint16_t> c(static_cast<size_t>(p.rows) * p.n, 0);
  if (cudaMemset(p.d_c.get(), 0xFF, c.size() * 2) != cudaSuccess) return {};
  GroupedGemmParams params;
  params.tile = tile;
  if (moekit::cuda::run_grouped_gemm(p.args, nullptr, params) != cudaSuccess) return {};
  if (cudaDeviceSynchronize() != cudaSuccess) return {};
  cudaMemcpy(c.data(), p.d_c.get(), c.size() * 2, cudaMemcpyDeviceToHost);
  return c;
}

std::vector<int> w4_tiles() {
  std::vector<int> tiles;
  for (int t = 0; t < sm90::kNumTiles; ++t) {
    if (sm90::kTileTable[t].family == sm90::TileFamily::kW4A16) tiles.push_back(t);
  }
  return tiles;
}

// The rows of the table that take k (the swap-AB row needs whole K steps of 64).
std::vector<int> w4_tiles_for(int k) {
  std::vector<int> tiles;
  for (int t : w4_tiles()) {
    if (sm90::kTileTable[t].kind != sm90::MainloopKind::kSwapAB || k % 64 == 0) tiles.push_back(t);
  }
  return tiles;
}

// A problem whose rows each pick one K element of expert 0 (row r: element r, A one-hot), on each
// of `tiles`: C must be every picked weight's dequantized value exactly. `what` names the case.
void expect_one_hot_exact(const W4Problem& p, const std::vector<int>& tiles,
                          const std::string& what) {
  for (int tile : tiles) {
    const std::string where = what + " " + sm90::kTileTable[tile].name;
    const std::vector<uint16_t> c = run_w4(p, tile);
    ASSERT_EQ(c.size(), static_cast<size_t>(p.rows) * p.n) << where;
    int wrong = 0;
    for (int r = 0; r < p.rows; ++r) {
      for (int col = 0; col < p.n; ++col) {
        const float want = static_cast<float>(p.w_value(0, col, r));
        const float got = moekit::bf16_bits_to_float(c[static_cast<size_t>(r) * p.n + col]);
        if (!(got == want) && wrong++ < 5) {
          ADD_FAILURE() << where << " row " << r << " col " << col << ": got " << got << ", want "
                        << want;
        }
      }
    }
    EXPECT_EQ(wrong, 0) << where;
  }
}

// One-hot rows (k of them: row r picks element r) over n = 128 columns of random codes (`bytes`
// random bytes per row) with the scale codes `scales` repeated.
W4Problem one_hot_problem(int k, int bytes_per_row, const std::vector<uint8_t>& scales,
                          int scales_per_row, uint32_t seed, std::vector<float> global = {},
                          moekit::cuda::WPacking packing = moekit::cuda::WPacking::kMxfp4) {
  const int n = 128;
  std::mt19937 rng(seed);
  std::vector<uint8_t> w(static_cast<size_t>(n) * bytes_per_row),
      sc(static_cast<size_t>(n) * scales_per_row);
  for (auto& b : w)
    b = static_cast<uint8_t>(rng() & 0xFF);
  for (size_t i = 0; i < sc.size(); ++i)
    sc[i] = scales[i % scales.size()];
  std::vector<uint16_t> a(static_cast<size_t>(k) * k, 0);
  for (int r = 0; r < k; ++r)
    a[static_cast<size_t>(r) * k + r] = moekit::float_to_bf16_bits(1.0f);
  W4Problem p;
  build_w4(p, {k}, n, k, a, w, sc, std::move(global), packing);
  return p;
}

// C of each of `tiles` against a float64 recomputation (within 8e-3 of the products' magnitude
// sum), NaN exactly at column nan_col of expert nan_expert (-1: nowhere).
void expect_float64_match(const W4Problem& p, const std::vector<int>& tiles,
                          const std::string& what, int nan_expert = -1, int nan_col = -1) {
  for (int tile : tiles) {
    const std::string where = what + " " + sm90::kTileTable[tile].name;
    const std::vector<uint16_t> c = run_w4(p, tile);
    ASSERT_EQ(c.size(), static_cast<size_t>(p.rows) * p.n) << where;
    int wrong = 0;
    for (int e = 0; e < p.num_experts; ++e) {
      for (int r = p.offsets[e]; r < p.offsets[e + 1]; ++r) {
        for (int col = 0; col < p.n; ++col) {
          double ref = 0.0, mag = 0.0;
          for (int kk = 0; kk < p.k; ++kk) {
            const double t = static_cast<double>(moekit::bf16_bits_to_float(
                                 p.a[static_cast<size_t>(r) * p.k + kk])) *
                             p.w_value(e, col, kk);
            ref += t;
            mag += std::fabs(t);
          }
          const float got = moekit::bf16_bits_to_float(c[static_cast<size_t>(r) * p.n + col]);
          const bool want_nan = e == nan_expert && col == nan_col;
          const bool ok =
              want_nan ? std::isnan(got) : std::isfinite(got) && std::fabs(got - ref) <= 8e-3 * mag;
          if (!ok && wrong++ < 5) {
            ADD_FAILURE() << where << " expert " << e << " row " << r << " col " << col << ": got "
                          << got << ", want " << ref;
          }
        }
      }
    }
    EXPECT_EQ(wrong, 0) << where;
  }
}

// Random A (bf16 in [-1, 1]) for the rows of `counts` and random code bytes (`bytes_per_row` per
// weight row of E = counts.size() experts, n columns); `scales` the scale codes.
W4Problem random_problem(const std::vector<int>& counts, int n, int k, int bytes_per_row,
                         std::vector<uint8_t> scales, uint32_t seed, std::vector<float> global = {},
                         moekit::cuda::WPacking packing = moekit::cuda::WPacking::kMxfp4) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::vector<uint8_t> w(counts.size() * n * static_cast<size_t>(bytes_per_row));
  for (auto& b : w)
    b = static_cast<uint8_t>(rng() & 0xFF);
  int rows = 0;
  for (int c : counts)
    rows += c;
  std::vector<uint16_t> a(static_cast<size_t>(rows) * k);
  for (auto& x : a)
    x = moekit::float_to_bf16_bits(uni(rng));
  W4Problem p;
  build_w4(p, counts, n, k, a, w, std::move(scales), std::move(global), packing);
  return p;
}

// One-hot rows of A pick single weights: C is every (code, scale) pair's dequantized value
// exactly, over every e2m1 code (both nibbles of random bytes) and e8m0 scales from 2^-119 to
// 2^125 (both conversion paths: one multiply up to s = 128, two above). Scales below 2^-119 would
// give subnormal products (bf16 and the tensor cores' inputs keep them, their outputs may not).
TEST(GroupedGemmW4A16, OneHotRowsGiveEveryDequantizedWeightExactly) {
  REQUIRE_GPU();
  // Two n-tiles of 64; k = 96: a partial second K step (32 of 64, not for swap-AB); k = 128: 128
  // rows in 8 swap-AB token blocks.
  for (const int k : {96, 128}) {
    const W4Problem p =
        one_hot_problem(k, k / 2, {8, 60, 100, 126, 127, 128, 129, 130, 200, 252}, k / 32, 21);
    ASSERT_EQ(moekit::cuda::can_implement(p.args), "");
    expect_one_hot_exact(p, w4_tiles_for(k), "k=" + std::to_string(k));
  }
}

// Random A and W over an uneven schedule (an empty expert, partial m-tiles, rows in two m-tiles),
// every tile: C against a float64 recomputation; one NaN scale (e8m0 0xFF) makes exactly its
// column of its expert NaN.
TEST(GroupedGemmW4A16, RandomProblemMatchesFloat64AndPropagatesNaNScale) {
  REQUIRE_GPU();
  // k = 160: a partial K step (not for swap-AB); k = 192: every row, swap-AB with experts of 5,
  // 70 and 133 rows in 1, 5 and 9 token blocks.
  for (const int k : {160, 192}) {
    const std::vector<int> counts = {5, 0, 70, 133};
    const int n = 192, E = static_cast<int>(counts.size());
    std::mt19937 rng(5);
    std::vector<uint8_t> sc(static_cast<size_t>(E) * n * k / 32);
    for (auto& s : sc)
      s = static_cast<uint8_t>(118 + rng() % 12);
    const int nan_expert = 2, nan_col = 7;
    sc[(static_cast<size_t>(nan_expert) * n + nan_col) * (k / 32) + 3] = 0xFF;
    const W4Problem p = random_problem(counts, n, k, k / 2, sc, 6);
    expect_float64_match(p, w4_tiles_for(k), "k=" + std::to_string(k), nan_expert, nan_col);
  }
}

// NVFP4 on the same rows: one-hot rows give every (e2m1 code, ue4m3 scale) pair, over every
// finite non-negative ue4m3 code (subnormal scales included), times a power-of-two global scale
// exactly, on every tile; k = 96 has a partial K step, k = 128 swap-AB's whole steps.
TEST(GroupedGemmNvfp4, OneHotRowsGiveEveryDequantizedWeightExactly) {
  REQUIRE_GPU();
  for (const int k : {96, 128}) {
    std::vector<uint8_t> scales(0x7F);
    for (size_t i = 0; i < scales.size(); ++i)
      scales[i] = static_cast<uint8_t>((i * 37) % 0x7F);  // 0 .. 0x7E, every code
    const W4Problem p = one_hot_problem(k, k / 2, scales, k / 16, 23, {0.5f});
    ASSERT_EQ(moekit::cuda::can_implement(p.args), "");
    expect_one_hot_exact(p, w4_tiles_for(k), "NVFP4 k=" + std::to_string(k));
  }
}

// Random A, W and scales over an uneven schedule with a different global scale per expert, every
// tile, against float64; and can_implement's NVFP4 reasons.
TEST(GroupedGemmNvfp4, RandomProblemMatchesFloat64) {
  REQUIRE_GPU();
  for (const int k : {160, 192}) {
    const std::vector<int> counts = {5, 0, 70, 133};
    const int n = 192, E = static_cast<int>(counts.size());
    std::mt19937 rng(7);
    std::vector<uint8_t> sc(static_cast<size_t>(E) * n * k / 16);
    for (auto& s : sc)
      s = static_cast<uint8_t>(0x30 + rng() % 0x30);
    const W4Problem p = random_problem(counts, n, k, k / 2, sc, 8, {0.37f, 1.3e-3f, 2.5f, 0.011f});
    expect_float64_match(p, w4_tiles_for(k), "NVFP4 k=" + std::to_string(k));
  }
  W4Problem p;
  build_w4(p, {8}, 64, 64, std::vector<uint16_t>(8 * 64, 0), std::vector<uint8_t>(64 * 32, 0),
           std::vector<uint8_t>(64 * 4, 0), {1.0f});
  GroupedGemmArgs g = p.args;
  g.w_scale = nullptr;
  EXPECT_NE(moekit::cuda::can_implement(g).find("global scales"), std::string::npos);
  g = p.args;
  g.w_group_scale = reinterpret_cast<const uint8_t*>(p.d_scale.get()) + 1;
  EXPECT_NE(moekit::cuda::can_implement(g).find("2-byte aligned"), std::string::npos);
}

// The device reorder of MXFP4 codes is the host one, both ways, and the kernel order is a
// permutation of each group (one-hot nibbles land where mxfp4_kernel_element says).
TEST(GroupedGemmW4A16, DeviceReorderMatchesHostBothWays) {
  REQUIRE_GPU();
  std::mt19937 rng(3);
  std::vector<uint8_t> standard(16 * 1000 + 16 * 37);
  for (auto& b : standard)
    b = static_cast<uint8_t>(rng() & 0xFF);
  const int64_t groups = static_cast<int64_t>(standard.size()) / sm90::kMxfp4GroupBytes;
  std::vector<uint8_t> host = standard;
  sm90::mxfp4_reorder_groups(host.data(), groups, true);
  EXPECT_NE(host, standard);
  DeviceBuffer d = upload(standard);
  CUDA_OK(moekit::cuda::reorder_mxfp4_groups(d.get(), groups, true, nullptr));
  std::vector<uint8_t> got(standard.size());
  CUDA_OK(cudaMemcpy(got.data(), d.get(), got.size(), cudaMemcpyDeviceToHost));
  EXPECT_EQ(got, host);
  CUDA_OK(moekit::cuda::reorder_mxfp4_groups(d.get(), groups, false, nullptr));
  CUDA_OK(cudaMemcpy(got.data(), d.get(), got.size(), cudaMemcpyDeviceToHost));
  EXPECT_EQ(got, standard);
  for (int e = 0; e < 32; ++e) {
    std::vector<uint8_t> one(16, 0);
    one[e / 2] = static_cast<uint8_t>(0x7 << (4 * (e % 2)));
    sm90::mxfp4_reorder_groups(one.data(), 1, true);
    int found = -1;
    for (int n = 0; n < 32; ++n) {
      if (((one[n / 2] >> (4 * (n % 2))) & 0xF) != 0) found = found == -1 ? n : 99;
    }
    ASSERT_GE(found, 0) << e;
    EXPECT_EQ(sm90::mxfp4_kernel_element(found), e);
  }
  EXPECT_EQ(
      moekit::cuda::reorder_mxfp4_groups(static_cast<uint8_t*>(d.get()) + 4, 1, true, nullptr),
      cudaErrorInvalidValue);
}

// ---- MXFP6-packed W ----------------------------------------------------------------------------

constexpr moekit::cuda::WPacking kMxfp6Packings[] = {moekit::cuda::WPacking::kMxfp6E2M3,
                                                     moekit::cuda::WPacking::kMxfp6E3M2};

const char* packing_name(moekit::cuda::WPacking p) {
  return p == moekit::cuda::WPacking::kMxfp6E2M3 ? "e2m3" : "e3m2";
}

// One-hot rows of A pick single weights: C is every (fp6 code, e8m0 scale) pair's dequantized
// value exactly, for both elements, over every code (random bytes) and scales from 2^-119 to 2^123
// (both conversion paths: one multiply up to s = 128 (e2m3) / 130 (e3m2), two above), on every
// W4A16 row; k = 128 and 192 (odd K steps for swap-AB's pairs).
TEST(GroupedGemmMxfp6, OneHotRowsGiveEveryDequantizedWeightExactly) {
  REQUIRE_GPU();
  for (const moekit::cuda::WPacking packing : kMxfp6Packings) {
    for (const int k : {128, 192}) {
      const W4Problem p =
          one_hot_problem(k, 3 * k / 4, {8, 60, 100, 126, 127, 128, 129, 130, 131, 132, 200, 250},
                          k / 32, 29, {}, packing);
      ASSERT_EQ(moekit::cuda::can_implement(p.args), "");
      expect_one_hot_exact(p, w4_tiles(),
                           std::string(packing_name(packing)) + " k=" + std::to_string(k));
    }
  }
}

// Random A and W over an uneven schedule (an empty expert, partial m-tiles, rows in several
// m-tiles and swap-AB token blocks), both elements, every W4A16 row: C against a float64
// recomputation; one NaN scale (e8m0 0xFF) makes exactly its column of its expert NaN.
TEST(GroupedGemmMxfp6, RandomProblemMatchesFloat64AndPropagatesNaNScale) {
  REQUIRE_GPU();
  for (const moekit::cuda::WPacking packing : kMxfp6Packings) {
    const int k = 192;
    const std::vector<int> counts = {5, 0, 70, 133};
    const int n = 192, E = static_cast<int>(counts.size());
    std::mt19937 rng(11);
    std::vector<uint8_t> sc(static_cast<size_t>(E) * n * k / 32);
    for (auto& s : sc)
      s = static_cast<uint8_t>(118 + rng() % 16);
    const int nan_expert = 2, nan_col = 7;
    sc[(static_cast<size_t>(nan_expert) * n + nan_col) * (k / 32) + 3] = 0xFF;
    const W4Problem p = random_problem(counts, n, k, 3 * k / 4, sc, 12, {}, packing);
    expect_float64_match(p, w4_tiles(), packing_name(packing), nan_expert, nan_col);
  }
}

// The device repack of MXFP6 rows is the host one, both ways; bad arguments are refused.
TEST(GroupedGemmMxfp6, DeviceRepackMatchesHostBothWays) {
  REQUIRE_GPU();
  std::mt19937 rng(5);
  const int64_t rows = 37, k = 4096 + 64;
  std::vector<uint8_t> standard(static_cast<size_t>(rows * k * 3 / 4));
  for (auto& b : standard)
    b = static_cast<uint8_t>(rng() & 0xFF);
  std::vector<uint8_t> host = standard;
  sm90::mxfp6_repack_rows(host.data(), rows, k, true);
  EXPECT_NE(host, standard);
  DeviceBuffer d = upload(standard);
  CUDA_OK(moekit::cuda::repack_mxfp6_rows(d.get(), rows, k, true, nullptr));
  std::vector<uint8_t> got(standard.size());
  CUDA_OK(cudaMemcpy(got.data(), d.get(), got.size(), cudaMemcpyDeviceToHost));
  EXPECT_EQ(got, host);
  CUDA_OK(moekit::cuda::repack_mxfp6_rows(d.get(), rows, k, false, nullptr));
  CUDA_OK(cudaMemcpy(got.data(), d.get(), got.size(), cudaMemcpyDeviceToHost));
  EXPECT_EQ(got, standard);
  EXPECT_EQ(moekit::cuda::repack_mxfp6_rows(d.get(), rows, 96, true, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(
      moekit::cuda::repack_mxfp6_rows(static_cast<uint8_t*>(d.get()) + 8, 1, 64, true, nullptr),
      cudaErrorInvalidValue);
}

// A W4A16 problem for host-only checks (can_implement, tile selection): one expert, n = 64, k
// elements of `packing`; its pointers are host placeholders (4-byte aligned), never read.
GroupedGemmArgs host_w4_args(moekit::cuda::WPacking packing, int k) {
  alignas(4) static const uint8_t kScaleBytes[4] = {127, 127, 127, 127};
  alignas(16) static int dummy[4] = {};
  GroupedGemmArgs g;
  g.a = g.w = g.c = dummy;
  g.expert_offsets = dummy;
  g.num_experts = 1;
  g.n = 64;
  g.k = k;
  g.lda = k;
  g.ldc = 64;
  g.w_packing = packing;
  g.w_group_scale = kScaleBytes;
  return g;
}

// Host-only: MXFP6's reasons (rows of whole 16-byte chunks: k a multiple of 64).
TEST(GroupedGemmMxfp6, CanImplementGivesReasons) {
  const GroupedGemmArgs g = host_w4_args(moekit::cuda::WPacking::kMxfp6E3M2, 128);
  EXPECT_EQ(moekit::cuda::can_implement(g), "");
  EXPECT_EQ(moekit::cuda::tile_family_of(g), sm90::TileFamily::kW4A16);
  GroupedGemmArgs bad = g;
  bad.k = 96;
  bad.lda = 96;
  EXPECT_EQ(moekit::cuda::can_implement(bad),
            "k=96 is not a multiple of 64 (MXFP6 e3m2 rows of 3k / 4 bytes in whole 16-byte "
            "chunks)");
  bad = g;
  bad.w_packing = moekit::cuda::WPacking::kMxfp6E2M3;
  bad.w_group_scale = nullptr;
  EXPECT_EQ(moekit::cuda::can_implement(bad),
            "MXFP6 e2m3 W needs its e8m0 group scales (w_group_scale)");
  bad = g;
  bad.dtype = ElemType::kF16;
  EXPECT_EQ(moekit::cuda::can_implement(bad),
            "dtype f16 is not bf16 (MXFP6 e3m2 weights run with bf16 activations)");
}

// Host-only: needs no GPU.
TEST(GroupedGemmW4A16, CanImplementGivesReasons) {
  GroupedGemmArgs g = host_w4_args(moekit::cuda::WPacking::kMxfp4, 64);
  const uint8_t* scale_bytes = g.w_group_scale;
  EXPECT_EQ(moekit::cuda::can_implement(g), "");
  GroupedGemmArgs bad = g;
  bad.k = 48;
  bad.lda = 48;
  EXPECT_EQ(moekit::cuda::can_implement(bad), "k=48 is not a multiple of 32 (MXFP4 groups of 32)");
  bad = g;
  bad.w_group_scale = nullptr;
  EXPECT_EQ(moekit::cuda::can_implement(bad),
            "MXFP4 W needs its e8m0 group scales (w_group_scale)");
  bad = g;
  bad.dtype = ElemType::kF16;
  EXPECT_EQ(moekit::cuda::can_implement(bad),
            "dtype f16 is not bf16 (MXFP4 weights run with bf16 activations)");
  // The swap-AB row takes whole K steps only: forced, a reason; auto-selection passes it by.
  const int swapab = sm90::find_tile("16x64", sm90::TileFamily::kW4A16);
  ASSERT_GE(swapab, 0);
  EXPECT_EQ(sm90::kTileTable[swapab].kind, sm90::MainloopKind::kSwapAB);
  GroupedGemmParams forced;
  forced.tile = swapab;
  EXPECT_EQ(moekit::cuda::can_implement(g, forced), "");
  // Up to one row per expert the CUDA-core row (any k % 32 == 0), then swap-AB.
  EXPECT_EQ(moekit::cuda::select_grouped_gemm_tile(g),
            sm90::find_tile("1x64simt", sm90::TileFamily::kW4A16));
  g.num_rows_upper_bound = 4 * static_cast<int64_t>(g.num_experts);
  EXPECT_EQ(moekit::cuda::select_grouped_gemm_tile(g), swapab);
  bad = g;
  bad.k = 96;
  bad.lda = 96;
  EXPECT_EQ(moekit::cuda::can_implement(bad, forced),
            "tile 16x64: k=96 is not a multiple of 64 (whole K steps of packed weights)");
  bad = g;
  bad.w_group_scale = scale_bytes + 1;
  EXPECT_EQ(moekit::cuda::can_implement(bad, forced),
            "tile 16x64: w_group_scale is not 4-byte aligned");
  bad = g;
  bad.k = 96;
  bad.lda = 96;
  std::string why;
  EXPECT_EQ(moekit::cuda::select_grouped_gemm_tile(bad, &why),
            sm90::find_tile("64x64", sm90::TileFamily::kW4A16));
  EXPECT_NE(why.find("not a multiple of 64 (whole K steps of packed weights), so 64x64"),
            std::string::npos)
      << why;
}

}  // namespace

#else  // !MOEKIT_WITH_CUDA

TEST(GroupedGemm, RequiresCuda) {
  GTEST_SKIP() << "moekit was built without CUDA";
}

#endif
