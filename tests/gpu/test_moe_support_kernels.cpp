// GPU tests of the small MoE kernels: top-k router, align/permute, batched scatter/gather,
// activation, unpermute. The router is checked against the library's CPU router
// (make_router(...).select_experts on host copies) and align against the library's CPU layout
// (detail::make_batched_layout); activation and unpermute against straightforward references
// below.
//
// Tolerances (one table): ids compared as sets (and as sequences where the order is defined), data
// movement and the unpermute sum bitwise, router weights to kRouterWeightRelTol, activations to
// one output ulp (kActTol). Outputs are poisoned (0xFF bytes) before every launch. Timings are
// not tests: `moekit bench-kernels --kernels router-align`.
#include <gtest/gtest.h>

#if defined(MOEKIT_WITH_CUDA)

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "experts/cuda/moe_activation.h"
#include "experts/cuda/moe_permute.h"
#include "experts/cuda/moe_unpermute.h"
#include "modular/batched_layout.h"
#include "moekit/core/half.h"
#include "moekit/core/tensor.h"
#include "moekit/router/router.h"
#include "router/cuda/topk_router.h"

namespace mc = moekit::cuda;

namespace {

constexpr double kRouterWeightRelTol = 1e-6;  // vs the CPU router (double, rounded to f32)
struct ActTol {
  double rel, abs;
};
constexpr ActTol kActTolF32{1e-5, 1e-6};
constexpr ActTol kActTolBF16{1.0 / 128, 1e-6};
constexpr ActTol kActTolF16{1.0 / 1024, 1e-6};

bool cuda_device_present() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device present";
  }
};

#define CUDA_OK(expr) ASSERT_EQ(cudaSuccess, (expr)) << #expr

// Device buffer of n elements (at least one, so a pointer exists for empty tensors).
template <typename T>
class DevBuf {
 public:
  explicit DevBuf(size_t n = 0) : n_(n) {
    void* raw = nullptr;
    if (cudaMalloc(&raw, std::max<size_t>(n, 1) * sizeof(T)) == cudaSuccess)
      p_ = static_cast<T*>(raw);
  }
  explicit DevBuf(const std::vector<T>& h) : DevBuf(h.size()) { upload(h); }
  ~DevBuf() {
    if (p_ != nullptr) cudaFree(p_);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  T* get() const { return p_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& h) {
    if (!h.empty()) cudaMemcpy(p_, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  void poison() { cudaMemset(p_, 0xFF, std::max<size_t>(n_, 1) * sizeof(T)); }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    if (n_ > 0) cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

// ---- element types on the host ------------------------------------------------------------------

float round_to(mc::ElemType t, float v) {
  switch (t) {
    case mc::ElemType::kBF16:
      return moekit::round_to_bf16(v);
    case mc::ElemType::kF16:
      return moekit::round_to_f16(v);
    default:
      return v;
  }
}

// Packs floats (already representable) into raw bytes of type t.
std::vector<uint8_t> pack(mc::ElemType t, const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * static_cast<size_t>(mc::elem_bytes(t)));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == mc::ElemType::kF32) {
      std::memcpy(&out[i * 4], &v[i], 4);
    } else {
      const uint16_t b = t == mc::ElemType::kBF16 ? moekit::float_to_bf16_bits(v[i])
                                                  : moekit::float_to_f16_bits(v[i]);
      std::memcpy(&out[i * 2], &b, 2);
    }
  }
  return out;
}

std::vector<float> unpack(mc::ElemType t, const std::vector<uint8_t>& raw) {
  const size_t eb = static_cast<size_t>(mc::elem_bytes(t));
  std::vector<float> out(raw.size() / eb);
  for (size_t i = 0; i < out.size(); ++i) {
    if (t == mc::ElemType::kF32) {
      std::memcpy(&out[i], &raw[i * 4], 4);
    } else {
      uint16_t b;
      std::memcpy(&b, &raw[i * 2], 2);
      out[i] =
          t == mc::ElemType::kBF16 ? moekit::bf16_bits_to_float(b) : moekit::f16_bits_to_float(b);
    }
  }
  return out;
}

// Uniform in [lo, hi), rounded to t, never exactly zero.
float rand_nonzero(std::mt19937_64& rng, mc::ElemType t, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  for (;;) {
    const float v = round_to(t, d(rng));
    if (v != 0.0f) return v;
  }
}

// ---- router: the library's CPU router is the reference -----------------------------------------

struct RouterCase {
  int64_t M = 1;
  int E = 128, k = 8;
  mc::ElemType type = mc::ElemType::kBF16;
  mc::RouterScoring scoring = mc::RouterScoring::kSoftmax;
  bool bias = false;
  int G = 0, tg = 0;
  bool renorm = false;
  float scale = 1.0f;
  int stride_pad = 0;
};

moekit::DType dtype_of(mc::ElemType t) {
  return t == mc::ElemType::kF32    ? moekit::DType::kF32
         : t == mc::ElemType::kBF16 ? moekit::DType::kBF16
                                    : moekit::DType::kF16;
}

// The RouterConfig of a kernel case. NOTE: groups of one expert (G == E) select like plain top-k
// (router.h); the library then runs the ungrouped router, which is the reference for the kernel's
// grouped path on that layout.
moekit::RouterConfig config_of(const RouterCase& c, const std::vector<float>& bias) {
  moekit::RouterConfig rc;
  rc.num_experts = c.E;
  rc.top_k = c.k;
  if (c.scoring == mc::RouterScoring::kLlama4) {
    rc.llama4_top1 = true;
    rc.renormalize = false;
  } else {
    rc.scoring = c.scoring == mc::RouterScoring::kSoftmax ? moekit::ScoringFunc::kSoftmax
                                                          : moekit::ScoringFunc::kSigmoid;
    rc.renormalize = c.renorm;
  }
  if (!bias.empty()) {
    rc.e_score_correction_bias = moekit::Tensor::from_floats(bias, {c.E}, moekit::DType::kF32);
  }
  if (c.G > 1 && c.G < c.E) {
    rc.use_grouped_topk = true;
    rc.num_expert_group = c.G;
    rc.topk_group = c.tg;
  }
  if (c.scale != 1.0f) rc.routed_scaling_factor = c.scale;
  return rc;
}

struct Routing {
  std::vector<int64_t> ids;  // (M, k) in selection order
  std::vector<float> weights;
};

// make_router(config).select_experts on host logits (M, E) of `type` (values representable).
Routing cpu_route(const moekit::RouterConfig& rc, const std::vector<float>& logits, int64_t M,
                  moekit::DType type) {
  const auto router = moekit::make_router(rc);
  const moekit::Tensor t = moekit::Tensor::from_floats(logits, {M, rc.num_experts}, type);
  const moekit::RoutingResult r = router->select_experts(moekit::Tensor{}, t);
  return {r.topk_ids.to_int_vector(), r.topk_weights.to_float_vector()};
}

// Rows whose CPU selection (as a set) changes when every logit moves by +eps*u or -eps*u (u
// uniform in [-1, 1]): near-ties, where the GPU's fp32 and the CPU's double scores may order two
// experts differently. eps = 1e-3 moves a selection score by >= 1e-5 relative over [-4, 4], far
// more than the two paths' rounding differences.
std::vector<bool> near_ties(const moekit::RouterConfig& rc, const std::vector<float>& logits,
                            int64_t M, std::mt19937_64& rng) {
  const int k = rc.top_k;
  const Routing base = cpu_route(rc, logits, M, moekit::DType::kF32);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> up(logits.size()), down(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    const float d = 1e-3f * u(rng);
    up[i] = logits[i] + d;
    down[i] = logits[i] - d;
  }
  const Routing a = cpu_route(rc, up, M, moekit::DType::kF32);
  const Routing b = cpu_route(rc, down, M, moekit::DType::kF32);
  std::vector<bool> tie(static_cast<size_t>(M));
  for (int64_t m = 0; m < M; ++m) {
    auto set_of = [&](const Routing& r) {
      return std::set<int64_t>(r.ids.begin() + m * k, r.ids.begin() + (m + 1) * k);
    };
    tie[m] = set_of(base) != set_of(a) || set_of(base) != set_of(b);
  }
  return tie;
}

// Runs one router case on the GPU against the library's CPU router. `logits` has M*E values
// (row-major, representable in c.type); with `regen` rows that are near-ties are redrawn first.
void check_router(const RouterCase& c, std::vector<float> logits, const std::vector<float>& bias,
                  std::mt19937_64* regen, bool check_order = false) {
  const mc::ElemType et = c.type;
  const moekit::RouterConfig rc = config_of(c, bias);
  if (regen != nullptr) {
    for (int round = 0; round < 100; ++round) {
      const std::vector<bool> tie = near_ties(rc, logits, c.M, *regen);
      if (std::find(tie.begin(), tie.end(), true) == tie.end()) break;
      for (int64_t m = 0; m < c.M; ++m) {
        if (!tie[m]) continue;
        for (int e = 0; e < c.E; ++e)
          logits[m * c.E + e] = rand_nonzero(*regen, et, -4.0f, 4.0f);
      }
    }
  }
  const Routing ref = cpu_route(rc, logits, c.M, dtype_of(et));
  const int64_t stride = c.E + c.stride_pad;
  std::vector<float> strided(static_cast<size_t>(c.M * stride), 1000.0f);  // pad: huge, unread
  for (int64_t m = 0; m < c.M; ++m)
    std::copy(&logits[m * c.E], &logits[m * c.E] + c.E, &strided[m * stride]);
  DevBuf<uint8_t> d_logits(pack(et, strided));
  DevBuf<float> d_bias(bias);
  DevBuf<float> d_w(static_cast<size_t>(c.M * c.k));
  DevBuf<int32_t> d_ids(static_cast<size_t>(c.M * c.k));
  d_w.poison();
  d_ids.poison();
  mc::TopkRouterParams p;
  p.logits = d_logits.get();
  p.logits_type = c.type;
  p.logits_row_stride = stride;
  p.num_tokens = c.M;
  p.num_experts = c.E;
  p.top_k = c.k;
  p.scoring = c.scoring;
  p.e_score_correction_bias = bias.empty() ? nullptr : d_bias.get();
  p.num_expert_group = c.G;
  p.topk_group = c.tg;
  p.renormalize = c.renorm;
  p.routed_scaling_factor = c.scale;
  p.topk_weights = d_w.get();
  p.topk_ids = d_ids.get();
  ASSERT_EQ(mc::topk_router_unsupported_reason(p), nullptr);
  CUDA_OK(mc::launch_topk_router(p, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const auto w = d_w.download();
  const auto ids = d_ids.download();
  double max_rel = 0;
  int64_t bad_rows = 0;
  for (int64_t m = 0; m < c.M && bad_rows < 5; ++m) {
    std::set<int64_t> got;
    bool ok = true;
    for (int j = 0; j < c.k; ++j) {
      const int id = ids[m * c.k + j];
      ok &= id >= 0 && id < c.E && got.insert(id).second;
    }
    const std::set<int64_t> want(ref.ids.begin() + m * c.k, ref.ids.begin() + (m + 1) * c.k);
    ok &= got == want;
    if (check_order) {
      for (int j = 0; j < c.k; ++j)
        ok &= ids[m * c.k + j] == ref.ids[m * c.k + j];
    }
    for (int j = 0; j < c.k && ok; ++j) {
      const int64_t id = ids[m * c.k + j];
      const auto at = std::find(ref.ids.begin() + m * c.k, ref.ids.begin() + (m + 1) * c.k, id);
      const double rw = ref.weights[at - ref.ids.begin()];
      const double gw = w[m * c.k + j];
      if (!std::isfinite(gw)) {
        ok = false;
        break;
      }
      const double diff = std::fabs(gw - rw);
      if (rw != 0.0) max_rel = std::max(max_rel, diff / std::fabs(rw));
      ok &= diff <= kRouterWeightRelTol * std::fabs(rw) + 1e-37;
    }
    if (!ok) {
      ++bad_rows;
      std::string msg = "row " + std::to_string(m) + " gpu:";
      for (int j = 0; j < c.k; ++j)
        msg += " " + std::to_string(ids[m * c.k + j]) + "(" + std::to_string(w[m * c.k + j]) + ")";
      msg += " cpu router:";
      for (int j = 0; j < c.k; ++j) {
        msg += " " + std::to_string(ref.ids[m * c.k + j]) + "(" +
               std::to_string(ref.weights[m * c.k + j]) + ")";
      }
      ADD_FAILURE() << msg;
    }
  }
  EXPECT_EQ(bad_rows, 0);
  ::testing::Test::RecordProperty("max_weight_rel_err", std::to_string(max_rel));
  std::printf("  router M=%lld E=%d k=%d: max weight rel err vs the CPU router %.3g\n",
              static_cast<long long>(c.M), c.E, c.k, max_rel);
}

void run_random_router(const RouterCase& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const mc::ElemType et = c.type;
  std::vector<float> logits(static_cast<size_t>(c.M * c.E));
  for (float& v : logits)
    v = rand_nonzero(rng, et, -4.0f, 4.0f);
  std::vector<float> bias;
  if (c.bias) {
    bias.resize(c.E);
    for (float& v : bias)
      v = rand_nonzero(rng, mc::ElemType::kF32, -1.0f, 1.0f);
  }
  check_router(c, logits, bias, &rng);
}

using RouterTest = GpuTest;

TEST_F(RouterTest, Qwen3SoftmaxRenormAllM) {
  for (int64_t M : {0, 1, 33, 8192, 65537}) {
    RouterCase c;
    c.M = M;
    c.E = 128;
    c.k = 8;
    c.renorm = true;
    run_random_router(c, 100 + M);
  }
}

TEST_F(RouterTest, SoftmaxF32NoRenormStridedRows) {
  RouterCase c;
  c.M = 1000;
  c.type = mc::ElemType::kF32;
  c.stride_pad = 3;
  run_random_router(c, 2);
}

TEST_F(RouterTest, DeepSeekV3GroupedBias) {
  for (auto type : {mc::ElemType::kBF16, mc::ElemType::kF32}) {
    for (int64_t M : {1, 33, 8192}) {
      RouterCase c;
      c.M = M;
      c.E = 256;
      c.k = 8;
      c.type = type;
      c.scoring = mc::RouterScoring::kSigmoid;
      c.bias = true;
      c.G = 8;
      c.tg = 4;
      c.renorm = true;
      c.scale = 2.5f;
      run_random_router(c, 3 + M);
    }
  }
}

TEST_F(RouterTest, GroupedNoBiasSoftmaxF16) {
  RouterCase c;
  c.M = 500;
  c.E = 64;
  c.k = 6;
  c.type = mc::ElemType::kF16;
  c.G = 4;
  c.tg = 2;
  run_random_router(c, 4);
}

TEST_F(RouterTest, GroupsOfOneAndLargeGroups) {
  RouterCase a;
  a.M = 200;
  a.E = 16;
  a.k = 4;
  a.scoring = mc::RouterScoring::kSigmoid;
  a.bias = true;
  a.G = 16;
  a.tg = 5;
  a.renorm = true;
  run_random_router(a, 5);
  RouterCase b;
  b.M = 100;
  b.E = 512;
  b.k = 10;
  b.type = mc::ElemType::kF32;
  b.scoring = mc::RouterScoring::kSigmoid;
  b.bias = true;
  b.G = 16;
  b.tg = 5;
  b.renorm = true;
  run_random_router(b, 6);
}

TEST_F(RouterTest, SigmoidOddExpertCount) {
  RouterCase c;
  c.M = 333;
  c.E = 60;
  c.k = 4;
  c.type = mc::ElemType::kF16;
  c.scoring = mc::RouterScoring::kSigmoid;
  run_random_router(c, 7);
}

TEST_F(RouterTest, MaxExpertsAndTopK) {
  RouterCase c;
  c.M = 300;
  c.E = 1024;
  c.k = 32;
  c.renorm = true;
  run_random_router(c, 8);
}

TEST_F(RouterTest, TopKEqualsE) {
  for (int E : {8, 32}) {
    RouterCase c;
    c.M = 65;
    c.E = E;
    c.k = E;
    c.renorm = true;
    run_random_router(c, 9 + E);
  }
}

TEST_F(RouterTest, Llama4TopOneSigmoid) {
  RouterCase c;
  c.M = 257;
  c.E = 16;
  c.k = 1;
  c.scoring = mc::RouterScoring::kLlama4;
  run_random_router(c, 10);
}

TEST_F(RouterTest, TiesGoToLowerIds) {
  RouterCase c;
  c.M = 3;
  c.E = 96;
  c.k = 8;
  c.type = mc::ElemType::kF32;
  std::vector<float> logits(static_cast<size_t>(c.M * c.E), 1.5f);
  check_router(c, logits, {}, nullptr, /*check_order=*/true);
}

TEST_F(RouterTest, NanAndInfLogits) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const int E = 64;
  std::vector<std::vector<float>> rows;
  std::vector<float> base(E);
  for (int e = 0; e < E; ++e)
    base[e] = static_cast<float>((e * 37) % E) / 8.0f - 3.9375f;
  rows.push_back(std::vector<float>(E, nan));
  rows.push_back(std::vector<float>(E, -inf));
  rows.push_back(std::vector<float>(E, inf));
  auto r = base;
  r[3] = inf;
  r[40] = inf;
  rows.push_back(r);
  r = base;
  for (int e = 0; e < E; e += 2)
    r[e] = nan;
  rows.push_back(r);
  r = std::vector<float>(E, nan);
  r[17] = 0.25f;
  rows.push_back(r);
  r = base;
  r[0] = nan;
  r[1] = -inf;
  r[2] = inf;
  r[5] = nan;
  r[60] = -inf;
  rows.push_back(r);
  std::vector<float> logits;
  for (const auto& row : rows)
    logits.insert(logits.end(), row.begin(), row.end());
  std::vector<float> bias(E);
  for (int e = 0; e < E; ++e)
    bias[e] = static_cast<float>((e * 11) % E) / 64.0f;
  for (auto scoring : {mc::RouterScoring::kSoftmax, mc::RouterScoring::kSigmoid}) {
    for (int grouped = 0; grouped < 2; ++grouped) {
      RouterCase c;
      c.M = static_cast<int64_t>(rows.size());
      c.E = E;
      c.k = 8;
      c.type = mc::ElemType::kF32;
      c.scoring = scoring;
      c.renorm = true;
      if (grouped) {
        c.bias = true;
        c.G = 8;
        c.tg = 3;
      }
      SCOPED_TRACE(testing::Message()
                   << "scoring " << static_cast<int>(scoring) << " grouped " << grouped);
      check_router(c, logits, grouped ? bias : std::vector<float>{}, nullptr);
    }
  }
}

// Group layouts off the fast path (groups not made of a power of two of whole lanes) and
// misaligned bf16 rows (scalar loads).
TEST_F(RouterTest, GroupLayoutsOffTheFastPath) {
  struct Shape {
    int E, k, G, tg;
    bool bias;
    int stride_pad;
    mc::ElemType type;
  };
  const Shape shapes[] = {
      {96, 8, 32, 7, true, 0, mc::ElemType::kBF16},    // gsize 3, 4 experts per lane
      {60, 6, 6, 2, true, 0, mc::ElemType::kF32},      // gsize 10, 2 per lane, 5 lanes a group
      {192, 8, 8, 3, true, 1, mc::ElemType::kBF16},    // gsize 24, 8 per lane, 3 lanes a group
      {256, 8, 8, 4, true, 1, mc::ElemType::kBF16},    // DeepSeek shape, misaligned rows
      {1024, 32, 32, 9, true, 0, mc::ElemType::kF16},  // gsize 32 = one lane a group
      {128, 8, 4, 4, false, 0, mc::ElemType::kBF16},   // every group kept, no bias
  };
  int seed = 40;
  for (const auto& sh : shapes) {
    for (int64_t M : {1, 65}) {
      RouterCase c;
      c.M = M;
      c.E = sh.E;
      c.k = sh.k;
      c.type = sh.type;
      c.scoring = mc::RouterScoring::kSigmoid;
      c.bias = sh.bias;
      c.G = sh.G;
      c.tg = sh.tg;
      c.renorm = true;
      c.stride_pad = sh.stride_pad;
      SCOPED_TRACE(testing::Message() << "E=" << sh.E << " G=" << sh.G << " M=" << M);
      run_random_router(c, ++seed);
    }
  }
}

TEST_F(RouterTest, RejectsBadParams) {
  mc::TopkRouterParams p;
  p.num_tokens = 1;
  p.num_experts = 8;
  p.top_k = 9;
  p.logits_row_stride = 8;
  EXPECT_NE(mc::topk_router_unsupported_reason(p), nullptr);
  EXPECT_EQ(mc::launch_topk_router(p, nullptr), cudaErrorInvalidValue);
  p.top_k = 2;
  p.num_expert_group = 3;
  p.topk_group = 1;
  EXPECT_NE(mc::topk_router_unsupported_reason(p), nullptr);
}

// ---- align / permute ----------------------------------------------------------------------------

struct AlignRef {
  std::vector<int32_t> counts, offsets, permuted, slot_to_row;
};

// The library's CPU layout (detail::make_batched_layout: per local expert, its slots in token
// order, then slot order; ids mapped by detail::LocalExpertMap) as the align kernel's maps:
// offsets are the prefix of the counts rounded up to row_align, padding rows and the tail -1.
// NOTE: LocalExpertMap bounds global ids by the map's size (or, without a map, by E_local); the
// cases here give a map of E_global entries, or none with E_global == E_local.
AlignRef align_ref(const std::vector<int32_t>& ids, const std::vector<int32_t>& map, int Eg, int El,
                   int align, int64_t capacity) {
  EXPECT_TRUE(map.empty() ? Eg == El : static_cast<int>(map.size()) == Eg);
  const std::vector<int64_t> ids64(ids.begin(), ids.end());
  const moekit::Tensor id_t =
      moekit::Tensor::from_ints(ids64, {static_cast<int64_t>(ids.size())}, moekit::DType::kInt32);
  moekit::Tensor map_t;
  if (!map.empty()) {
    map_t = moekit::Tensor::from_ints(std::vector<int64_t>(map.begin(), map.end()),
                                      {static_cast<int64_t>(map.size())}, moekit::DType::kInt32);
  }
  const moekit::detail::LocalExpertMap to_local(map_t, /*rank=*/0, El);
  const moekit::detail::BatchedLayout layout = moekit::detail::make_batched_layout(
      moekit::detail::read_topk_ids(id_t), static_cast<int64_t>(ids.size()), to_local, El);
  AlignRef r;
  r.counts = layout.counts;
  r.offsets.assign(El + 1, 0);
  for (int e = 0; e < El; ++e)
    r.offsets[e + 1] = r.offsets[e] + (r.counts[e] + align - 1) / align * align;
  r.permuted.assign(static_cast<size_t>(capacity), -1);
  r.slot_to_row.assign(ids.size(), -1);
  for (size_t s = 0; s < ids.size(); ++s) {
    if (layout.slot_local[s] < 0) continue;
    const int32_t pos = r.offsets[layout.slot_local[s]] + static_cast<int32_t>(layout.slot_row[s]);
    r.permuted[pos] = static_cast<int32_t>(s);
    r.slot_to_row[s] = pos;
  }
  return r;
}

struct AlignOut {
  AlignRef got;
  std::vector<int32_t> token_rows;
  int32_t total = 0;
};

// Runs launch_moe_align on the GPU (outputs poisoned first).
void run_align(const std::vector<int32_t>& ids, int64_t M, int k, const std::vector<int32_t>& map,
               int Eg, int El, int align, AlignOut* out) {
  const int64_t cap = mc::moe_align_capacity(M, k, El, align);
  DevBuf<int32_t> d_ids(ids), d_map(map), d_counts(El), d_offsets(El + 1), d_perm(cap),
      d_s2r(static_cast<size_t>(M * k)), d_total(1), d_tok(cap);
  const size_t ws_bytes = mc::moe_align_workspace_bytes(M, k, El);
  DevBuf<uint8_t> d_ws(ws_bytes);
  d_counts.poison();
  d_offsets.poison();
  d_perm.poison();
  // Not 0xFF: -1 is what a padding row must hold, so an unwritten one would pass.
  CUDA_OK(cudaMemset(d_tok.get(), 0x5A, static_cast<size_t>(std::max<int64_t>(cap, 1)) * 4));
  d_s2r.poison();
  d_total.poison();
  d_ws.poison();
  mc::MoeAlignParams p;
  p.topk_ids = d_ids.get();
  p.num_tokens = M;
  p.top_k = k;
  p.expert_map = map.empty() ? nullptr : d_map.get();
  p.num_global_experts = Eg;
  p.num_local_experts = El;
  p.row_align = align;
  p.expert_counts = d_counts.get();
  p.expert_offsets = d_offsets.get();
  p.permuted_rows = d_perm.get();
  p.slot_to_row = d_s2r.get();
  p.total_rows = d_total.get();
  p.token_rows = d_tok.get();
  p.workspace = d_ws.get();
  p.workspace_bytes = ws_bytes;
  ASSERT_EQ(mc::moe_align_unsupported_reason(p), nullptr);
  CUDA_OK(mc::launch_moe_align(p, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  out->got.counts = d_counts.download();
  out->got.offsets = d_offsets.download();
  out->got.permuted = d_perm.download();
  out->got.slot_to_row = d_s2r.download();
  out->token_rows = d_tok.download();
  out->total = d_total.download()[0];
}

void check_align(const std::vector<int32_t>& ids, int64_t M, int k, const std::vector<int32_t>& map,
                 int Eg, int El, int align) {
  SCOPED_TRACE(testing::Message() << "M=" << M << " k=" << k << " Eg=" << Eg << " El=" << El
                                  << " align=" << align);
  const AlignRef ref = align_ref(ids, map, Eg, El, align, mc::moe_align_capacity(M, k, El, align));
  AlignOut out;
  run_align(ids, M, k, map, Eg, El, align, &out);
  EXPECT_EQ(out.got.counts, ref.counts);
  EXPECT_EQ(out.got.offsets, ref.offsets);
  EXPECT_EQ(out.total, ref.offsets.back());
  EXPECT_TRUE(out.got.permuted == ref.permuted) << "permuted_rows differ";
  EXPECT_TRUE(out.got.slot_to_row == ref.slot_to_row) << "slot_to_row differ";
  // Every row's token (the experts' gather index), written with the permutation.
  std::vector<int32_t> tokens(ref.permuted.size());
  for (size_t r = 0; r < tokens.size(); ++r)
    tokens[r] = ref.permuted[r] < 0 ? -1 : ref.permuted[r] / k;
  EXPECT_TRUE(out.token_rows == tokens) << "token_rows differ";
}

// Per-row distinct ids from [0, E) avoiding `empty_expert`, with a fraction of garbage ids.
std::vector<int32_t> random_ids(std::mt19937_64& rng, int64_t M, int k, int E, int empty_expert,
                                double garbage) {
  std::vector<int32_t> ids(static_cast<size_t>(M * k));
  std::vector<int32_t> pool;
  for (int e = 0; e < E; ++e)
    if (e != empty_expert) pool.push_back(e);
  std::uniform_real_distribution<double> u(0, 1);
  const int32_t junk[] = {-1, E, E + 1000, -5, 1 << 30};
  for (int64_t m = 0; m < M; ++m) {
    for (int j = 0; j < k; ++j) {
      const size_t pick = j + rng() % (pool.size() - j);
      std::swap(pool[j], pool[pick]);
      ids[m * k + j] = pool[j];
      if (u(rng) < garbage) ids[m * k + j] = junk[rng() % 5];
    }
  }
  return ids;
}

using AlignTest = GpuTest;

TEST_F(AlignTest, AllSizesNoMap) {
  std::mt19937_64 rng(11);
  for (int64_t M : {0, 1, 33, 8192, 65537}) {
    const auto ids = random_ids(rng, M, 8, 128, 7, 0.02);
    for (int align : {1, 64})
      check_align(ids, M, 8, {}, 128, 128, align);
  }
}

TEST_F(AlignTest, ExpertMapEp) {
  std::mt19937_64 rng(12);
  const int Eg = 512, El = 64;
  std::vector<int32_t> map(Eg, -1);
  std::vector<int32_t> perm(Eg);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int l = 0; l < El; ++l)
    map[perm[l]] = l;
  map[perm[El]] = El;       // out of the local range: skipped
  map[perm[El + 1]] = 999;  // likewise
  for (int64_t M : {1, 33, 600, 8192}) {
    const auto ids = random_ids(rng, M, 8, Eg, -1, 0.01);
    for (int align : {1, 128})
      check_align(ids, M, 8, map, Eg, El, align);
  }
}

TEST_F(AlignTest, EveryTokenOnOneExpert) {
  for (int64_t M : {33, 512, 65537}) {
    std::vector<int32_t> ids(static_cast<size_t>(M * 8), 3);
    check_align(ids, M, 8, {}, 16, 16, 128);
  }
}

TEST_F(AlignTest, ManyExpertsAndTopKEqualsE) {
  std::mt19937_64 rng(13);
  for (int64_t M : {1, 512, 513, 4096}) {
    const auto ids = random_ids(rng, M, 8, 512, 100, 0.0);
    check_align(ids, M, 8, {}, 512, 512, 16);
  }
  const auto ids = random_ids(rng, 33, 16, 16, -1, 0.0);
  check_align(ids, 33, 16, {}, 16, 16, 1);
  const auto ids2 = random_ids(rng, 1000, 16, 16, -1, 0.0);
  check_align(ids2, 1000, 16, {}, 16, 16, 8);
}

// The one-launch path around its chunk boundaries (M*k = 1024, 2048, ...) and its size limit
// (M*k = 8192; 8193 slots go to the three-launch path), large experts counts, row alignments
// that need the multi-block padding fill.
TEST_F(AlignTest, SmallPathBoundaries) {
  std::mt19937_64 rng(15);
  for (int E : {8, 128, 256, 512}) {
    for (int64_t M : {0, 1, 2, 64, 127, 128, 129, 256, 257, 512, 513, 1000, 1024, 1025}) {
      const int k = 8 < E ? 8 : E;
      const auto ids = random_ids(rng, M, k, E, E > 8 ? 5 : -1, 0.03);
      for (int align : {1, 3, 128})
        check_align(ids, M, k, {}, E, E, align);
    }
  }
  // k = 1 with 1024 slots on a single expert (the whole chunk in one warp group per warp).
  std::vector<int32_t> one(1024, 2);
  check_align(one, 1024, 1, {}, 4, 4, 256);
  // 8192 and 8193 slots on two experts (every chunk full of both; the limit and one past it).
  for (int64_t n : {8192, 8193}) {
    std::vector<int32_t> two(static_cast<size_t>(n));
    for (int64_t s = 0; s < n; ++s)
      two[static_cast<size_t>(s)] = static_cast<int32_t>((s / 3) % 2);
    check_align(two, n, 1, {}, 2, 2, 64);
  }
}

TEST_F(AlignTest, AllGarbage) {
  std::vector<int32_t> ids(33 * 4, -1);
  ids[5] = 1000;
  check_align(ids, 33, 4, {}, 8, 8, 4);
  std::vector<int32_t> big(6000 * 4, -1);
  check_align(big, 6000, 4, {}, 8, 8, 4);
}

// Router then align in one stream and in one graph, no host sync between them (the launches use
// programmatic dependent launch): align must see the router's ids, and the second router must not
// overwrite the ids while the first align still reads them.
TEST_F(AlignTest, RouterThenAlignChain) {
  const int64_t M = 64;
  const int E = 256, k = 8, align = 128;
  std::mt19937_64 rng(16);
  std::vector<float> la(static_cast<size_t>(M * E)), lb(la.size()), bias(E);
  for (float& v : la)
    v = rand_nonzero(rng, mc::ElemType::kBF16, -4.0f, 4.0f);
  for (float& v : lb)
    v = rand_nonzero(rng, mc::ElemType::kBF16, -4.0f, 4.0f);
  for (float& v : bias)
    v = rand_nonzero(rng, mc::ElemType::kF32, -1.0f, 1.0f);
  DevBuf<uint8_t> d_la(pack(mc::ElemType::kBF16, la)), d_lb(pack(mc::ElemType::kBF16, lb));
  DevBuf<float> d_bias(bias), d_w(static_cast<size_t>(M * k));
  DevBuf<int32_t> d_ids(static_cast<size_t>(M * k));
  mc::TopkRouterParams rp;
  rp.logits_type = mc::ElemType::kBF16;
  rp.logits_row_stride = E;
  rp.num_tokens = M;
  rp.num_experts = E;
  rp.top_k = k;
  rp.scoring = mc::RouterScoring::kSigmoid;
  rp.e_score_correction_bias = d_bias.get();
  rp.num_expert_group = 8;
  rp.topk_group = 4;
  rp.renormalize = true;
  rp.topk_weights = d_w.get();
  rp.topk_ids = d_ids.get();
  std::vector<int32_t> ids_a, ids_b;
  rp.logits = d_la.get();
  CUDA_OK(mc::launch_topk_router(rp, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  ids_a = d_ids.download();
  rp.logits = d_lb.get();
  CUDA_OK(mc::launch_topk_router(rp, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  ids_b = d_ids.download();
  ASSERT_NE(ids_a, ids_b);
  const int64_t cap = mc::moe_align_capacity(M, k, E, align);
  const AlignRef ref_a = align_ref(ids_a, {}, E, E, align, cap);
  const AlignRef ref_b = align_ref(ids_b, {}, E, E, align, cap);
  struct Out {
    DevBuf<int32_t> counts, offsets, perm, s2r;
    Out(int E_, int64_t cap_, int64_t n) : counts(E_), offsets(E_ + 1), perm(cap_), s2r(n) {}
  };
  Out o1(E, cap, M * k), o2(E, cap, M * k);
  auto align_params = [&](Out& o) {
    mc::MoeAlignParams ap;
    ap.topk_ids = d_ids.get();
    ap.num_tokens = M;
    ap.top_k = k;
    ap.num_global_experts = E;
    ap.num_local_experts = E;
    ap.row_align = align;
    ap.expert_counts = o.counts.get();
    ap.expert_offsets = o.offsets.get();
    ap.permuted_rows = o.perm.get();
    ap.slot_to_row = o.s2r.get();
    return ap;
  };
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int use_graph = 0; use_graph < 2; ++use_graph) {
    SCOPED_TRACE(testing::Message() << "graph " << use_graph);
    for (Out* o : {&o1, &o2}) {
      o->counts.poison();
      o->offsets.poison();
      o->perm.poison();
      o->s2r.poison();
    }
    CUDA_OK(cudaDeviceSynchronize());
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    if (use_graph) {
      CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    }
    rp.logits = d_la.get();
    CUDA_OK(mc::launch_topk_router(rp, stream));
    CUDA_OK(mc::launch_moe_align(align_params(o1), stream));
    rp.logits = d_lb.get();
    CUDA_OK(mc::launch_topk_router(rp, stream));
    CUDA_OK(mc::launch_moe_align(align_params(o2), stream));
    if (use_graph) {
      CUDA_OK(cudaStreamEndCapture(stream, &graph));
      CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
      for (int r = 0; r < 3; ++r)
        CUDA_OK(cudaGraphLaunch(exec, stream));
    }
    CUDA_OK(cudaStreamSynchronize(stream));
    CUDA_OK(cudaGetLastError());
    EXPECT_EQ(o1.counts.download(), ref_a.counts);
    EXPECT_EQ(o1.offsets.download(), ref_a.offsets);
    EXPECT_TRUE(o1.perm.download() == ref_a.permuted);
    EXPECT_TRUE(o1.s2r.download() == ref_a.slot_to_row);
    EXPECT_EQ(o2.counts.download(), ref_b.counts);
    EXPECT_TRUE(o2.perm.download() == ref_b.permuted);
    EXPECT_TRUE(o2.s2r.download() == ref_b.slot_to_row);
    EXPECT_EQ(d_ids.download(), ids_b);
    if (use_graph) {
      CUDA_OK(cudaGraphExecDestroy(exec));
      CUDA_OK(cudaGraphDestroy(graph));
    }
  }
  CUDA_OK(cudaStreamDestroy(stream));
}

TEST_F(AlignTest, RepeatableBitwise) {
  std::mt19937_64 rng(14);
  const auto ids = random_ids(rng, 20000, 8, 256, -1, 0.0);
  AlignOut a, b;
  run_align(ids, 20000, 8, {}, 256, 256, 64, &a);
  run_align(ids, 20000, 8, {}, 256, 256, 64, &b);
  EXPECT_TRUE(a.got.permuted == b.got.permuted);
  EXPECT_TRUE(a.got.slot_to_row == b.got.slot_to_row);
}

// ---- batched scatter / gather -------------------------------------------------------------------

void check_batched(int64_t M, int k, int E, int64_t H, int elem_bytes, int max_tokens, int align,
                   uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "M=" << M << " H=" << H << " eb=" << elem_bytes
                                  << " max_tokens=" << max_tokens);
  std::mt19937_64 rng(seed);
  const auto ids = random_ids(rng, M, k, E, 1, 0.05);
  const AlignRef ref = align_ref(ids, {}, E, E, align, mc::moe_align_capacity(M, k, E, align));
  const int64_t row_bytes = H * elem_bytes;
  std::vector<uint8_t> x(static_cast<size_t>(M * row_bytes));
  for (auto& b : x)
    b = static_cast<uint8_t>(1 + rng() % 255);  // never zero
  DevBuf<uint8_t> d_x(x);
  DevBuf<int32_t> d_perm(ref.permuted), d_off(ref.offsets), d_cnt(ref.counts),
      d_s2r(ref.slot_to_row);
  DevBuf<uint8_t> d_out(static_cast<size_t>(E) * max_tokens * row_bytes);
  DevBuf<int32_t> d_out_counts(E), d_over(1);
  d_out.poison();
  d_out_counts.poison();
  d_over.poison();
  mc::BatchedScatterParams sp;
  sp.x = d_x.get();
  sp.x_row_stride = H;
  sp.hidden = H;
  sp.elem_bytes = elem_bytes;
  sp.top_k = k;
  sp.permuted_rows = d_perm.get();
  sp.expert_offsets = d_off.get();
  sp.expert_counts = d_cnt.get();
  sp.num_local_experts = E;
  sp.max_tokens = max_tokens;
  sp.out = d_out.get();
  sp.out_counts = d_out_counts.get();
  sp.overflow = d_over.get();
  CUDA_OK(mc::launch_batched_scatter(sp, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const auto out = d_out.download();
  const auto oc = d_out_counts.download();
  bool over = false;
  for (int e = 0; e < E; ++e) {
    over |= ref.counts[e] > max_tokens;
    const int n = std::min(ref.counts[e], max_tokens);
    ASSERT_EQ(oc[e], n);
    for (int t = 0; t < n; ++t) {
      const int64_t token = ref.permuted[ref.offsets[e] + t] / k;
      ASSERT_EQ(0, std::memcmp(&out[(static_cast<size_t>(e) * max_tokens + t) * row_bytes],
                               &x[token * row_bytes], row_bytes))
          << "e=" << e << " t=" << t;
    }
  }
  EXPECT_EQ(d_over.download()[0], over ? 1 : 0);

  // Gather back to one row per slot.
  DevBuf<uint8_t> d_back(static_cast<size_t>(M * k * row_bytes));
  d_back.poison();
  mc::BatchedGatherParams gp;
  gp.batched = d_out.get();
  gp.hidden = H;
  gp.elem_bytes = elem_bytes;
  gp.num_slots = M * k;
  gp.slot_to_row = d_s2r.get();
  gp.expert_offsets = d_off.get();
  gp.num_local_experts = E;
  gp.max_tokens = max_tokens;
  gp.out = d_back.get();
  CUDA_OK(mc::launch_batched_gather(gp, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const auto back = d_back.download();
  const std::vector<uint8_t> zeros(static_cast<size_t>(row_bytes), 0);
  for (int64_t s = 0; s < M * k; ++s) {
    const int32_t r = ref.slot_to_row[s];
    bool valid = r >= 0;
    if (valid) {
      int e = 0;
      while (ref.offsets[e + 1] <= r)
        ++e;
      valid = r - ref.offsets[e] < max_tokens;
    }
    const uint8_t* want = valid ? &x[(s / k) * row_bytes] : zeros.data();
    ASSERT_EQ(0, std::memcmp(&back[s * row_bytes], want, row_bytes)) << "slot " << s;
  }
}

using BatchedTest = GpuTest;

TEST_F(BatchedTest, ScatterGatherRoundTrip) {
  check_batched(33, 4, 8, 72, 2, 64, 1, 21);   // 16-byte rows, no overflow
  check_batched(33, 4, 8, 70, 2, 10, 1, 22);   // 4-byte path, overflow
  check_batched(33, 4, 8, 33, 4, 20, 16, 23);  // f32 rows, padded align maps
  check_batched(1, 2, 8, 64, 2, 4, 1, 24);     // one token
  check_batched(2000, 8, 32, 256, 2, 300, 1, 25);
  check_batched(50, 3, 8, 7, 1, 8, 1, 26);  // byte path
}

// ---- activation ---------------------------------------------------------------------------------

double ref_act(mc::ActKind k, double g, double u, bool has_clamp, double L, double alpha) {
  auto sig = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  auto silu = [&](double v) { return v * sig(v); };
  auto gelu = [](double v) { return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))); };
  auto gelu_t = [](double v) {
    return 0.5 * v *
           (1.0 + std::tanh(std::sqrt(2.0 / 3.14159265358979323846) * (v + 0.044715 * v * v * v)));
  };
  auto clamp = [&](double v) { return std::min(std::max(v, -L), L); };
  switch (k) {
    case mc::ActKind::kSilu:
      return has_clamp ? silu(std::min(g, L)) * clamp(u) : silu(g) * u;
    case mc::ActKind::kGelu:
      return gelu(g) * u;
    case mc::ActKind::kGeluTanh:
      return gelu_t(g) * u;
    case mc::ActKind::kSwigluOai: {
      const double gc = std::min(g, L);
      return (clamp(u) + 1.0) * gc * sig(alpha * gc);
    }
    case mc::ActKind::kSwigluStep:
      return std::min(silu(g), L) * clamp(u);
    case mc::ActKind::kRelu2:
      return std::max(g, 0.0) * std::max(g, 0.0) * u;
    case mc::ActKind::kSiluNoMul:
      return silu(g);
    case mc::ActKind::kGeluNoMul:
      return gelu(g);
    case mc::ActKind::kGeluTanhNoMul:
      return gelu_t(g);
    default:
      return std::max(g, 0.0) * std::max(g, 0.0);
  }
}

struct ActCase {
  mc::ActKind kind;
  mc::ElemType in, out;
  int64_t rows, d;
  bool has_clamp = false;
  bool masks = false;
};

void check_activation(const ActCase& c, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "kind " << static_cast<int>(c.kind) << " in "
                                  << static_cast<int>(c.in) << " out " << static_cast<int>(c.out)
                                  << " rows " << c.rows << " d " << c.d);
  std::mt19937_64 rng(seed);
  const bool gated = mc::act_is_gated(c.kind);
  const int64_t in_cols = gated ? 2 * c.d : c.d;
  std::vector<float> in(static_cast<size_t>(c.rows * in_cols));
  for (float& v : in)
    v = rand_nonzero(rng, c.in, -8.0f, 8.0f);
  std::vector<int32_t> perm(static_cast<size_t>(c.rows));
  for (int64_t r = 0; r < c.rows; ++r)
    perm[r] = (r % 7 == 3) ? -1 : static_cast<int32_t>(r);
  const int32_t valid = static_cast<int32_t>(c.rows - 5);
  DevBuf<uint8_t> d_in(pack(c.in, in));
  const int ob = mc::elem_bytes(c.out);
  DevBuf<uint8_t> d_out(static_cast<size_t>(c.rows * c.d * ob));
  DevBuf<int32_t> d_perm(perm), d_valid(std::vector<int32_t>{valid});
  d_out.poison();
  mc::MoeActivationParams p;
  p.kind = c.kind;
  p.in = d_in.get();
  p.in_type = c.in;
  p.in_row_stride = in_cols;
  p.out = d_out.get();
  p.out_type = c.out;
  p.out_row_stride = c.d;
  p.rows = c.rows;
  p.d = c.d;
  p.has_clamp_limit = c.has_clamp;
  p.clamp_limit = 7.0f;
  p.alpha = 1.702f;
  if (c.masks) {
    p.valid_rows = d_valid.get();
    p.permuted_rows = d_perm.get();
  }
  ASSERT_EQ(mc::moe_activation_unsupported_reason(p), nullptr);
  CUDA_OK(mc::launch_moe_activation(p, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const auto raw = d_out.download();
  const auto out = unpack(c.out, raw);
  const ActTol tol = c.out == mc::ElemType::kF32    ? kActTolF32
                     : c.out == mc::ElemType::kBF16 ? kActTolBF16
                                                    : kActTolF16;
  const bool interleaved = c.kind == mc::ActKind::kSwigluOai;
  int64_t bad = 0;
  for (int64_t r = 0; r < c.rows && bad < 5; ++r) {
    const bool skipped = c.masks && (r >= valid || perm[r] < 0);
    for (int64_t i = 0; i < c.d; ++i) {
      const size_t o = static_cast<size_t>(r * c.d + i);
      if (skipped) {
        for (int b = 0; b < ob; ++b) {
          if (raw[o * ob + b] != 0xFF) {
            ADD_FAILURE() << "masked row " << r << " was written";
            ++bad;
            break;
          }
        }
        continue;
      }
      const float* row = &in[r * in_cols];
      const double g = interleaved ? row[2 * i] : row[i];
      const double u = !gated ? 1.0 : interleaved ? row[2 * i + 1] : row[c.d + i];
      const double want = ref_act(c.kind, g, u, c.has_clamp, 7.0, 1.702);
      // abs term: an ulp of the fp32 intermediates, scaled by the size of the product g * u.
      const double atol = tol.abs * std::max(1.0, std::fabs(g * u));
      if (!(std::fabs(out[o] - want) <= tol.rel * std::fabs(want) + atol)) {
        ADD_FAILURE() << "row " << r << " col " << i << ": gpu " << out[o] << " ref " << want
                      << " (g " << g << ", u " << u << ")";
        ++bad;
      }
    }
  }
}

using ActivationTest = GpuTest;

TEST_F(ActivationTest, AllKindsAllDtypes) {
  const mc::ActKind kinds[] = {mc::ActKind::kSilu,          mc::ActKind::kGelu,
                               mc::ActKind::kGeluTanh,      mc::ActKind::kSwigluOai,
                               mc::ActKind::kSwigluStep,    mc::ActKind::kRelu2,
                               mc::ActKind::kSiluNoMul,     mc::ActKind::kGeluNoMul,
                               mc::ActKind::kGeluTanhNoMul, mc::ActKind::kRelu2NoMul};
  const std::pair<mc::ElemType, mc::ElemType> types[] = {
      {mc::ElemType::kBF16, mc::ElemType::kBF16}, {mc::ElemType::kF16, mc::ElemType::kF16},
      {mc::ElemType::kF32, mc::ElemType::kF32},   {mc::ElemType::kBF16, mc::ElemType::kF32},
      {mc::ElemType::kF32, mc::ElemType::kBF16},  {mc::ElemType::kF16, mc::ElemType::kBF16}};
  uint64_t seed = 30;
  for (auto kind : kinds) {
    for (auto [ti, to] : types) {
      check_activation({kind, ti, to, 33, 96}, ++seed);  // 16-byte path
      check_activation({kind, ti, to, 17, 33}, ++seed);  // scalar path
    }
  }
}

TEST_F(ActivationTest, SiluClampAndMasks) {
  check_activation({mc::ActKind::kSilu, mc::ElemType::kBF16, mc::ElemType::kBF16, 40, 64, true},
                   60);
  check_activation(
      {mc::ActKind::kSilu, mc::ElemType::kBF16, mc::ElemType::kBF16, 40, 64, false, true}, 61);
  check_activation(
      {mc::ActKind::kSwigluOai, mc::ElemType::kF32, mc::ElemType::kBF16, 41, 24, false, true}, 62);
  check_activation(
      {mc::ActKind::kGeluNoMul, mc::ElemType::kF16, mc::ElemType::kF16, 40, 13, false, true}, 63);
}

TEST_F(ActivationTest, LargeRows) {
  check_activation({mc::ActKind::kSilu, mc::ElemType::kBF16, mc::ElemType::kBF16, 8192, 768}, 70);
  check_activation({mc::ActKind::kSilu, mc::ElemType::kBF16, mc::ElemType::kBF16, 1, 2048}, 71);
}

// ---- unpermute ----------------------------------------------------------------------------------

struct UnpermuteCase {
  int64_t M;
  int k;
  int64_t H;
  mc::ElemType yt, ot;
  bool on_input = false;
  bool accumulate = false;
  bool batched = false;
  int max_tokens = 0;
  bool skip_empty = false;  // rows with no valid slot keep what out held
};

void check_unpermute(const UnpermuteCase& c, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "M=" << c.M << " k=" << c.k << " H=" << c.H << " acc "
                                  << c.accumulate << " batched " << c.batched);
  std::mt19937_64 rng(seed);
  const int E = 16;
  // Routing maps from the reference align, with garbage slots (-1 rows) and one token with none.
  auto ids = random_ids(rng, c.M, c.k, E, c.k >= E ? -1 : 2, 0.1);
  if (c.M > 0)
    for (int j = 0; j < c.k; ++j)
      ids[j] = -1;
  const AlignRef ref = align_ref(ids, {}, E, E, 1, mc::moe_align_capacity(c.M, c.k, E, 1));
  const int64_t y_rows = c.batched ? static_cast<int64_t>(E) * c.max_tokens : c.M * c.k;
  std::vector<float> y(static_cast<size_t>(std::max<int64_t>(y_rows, 1) * c.H));
  for (float& v : y)
    v = rand_nonzero(rng, c.yt, -2.0f, 2.0f);
  std::vector<float> w(static_cast<size_t>(c.M * c.k));
  for (float& v : w)
    v = rand_nonzero(rng, mc::ElemType::kF32, 0.01f, 1.0f);
  std::vector<float> out0(static_cast<size_t>(c.M * c.H));
  for (float& v : out0)
    v = rand_nonzero(rng, c.ot, -1.0f, 1.0f);

  // Reference: fp32 fused multiply-adds in slot order, rounded once.
  std::vector<float> want(out0.size());
  for (int64_t m = 0; m < c.M; ++m) {
    std::vector<int64_t> src(c.k, -1);
    for (int j = 0; j < c.k; ++j) {
      const int32_t r = ref.slot_to_row[m * c.k + j];
      if (r < 0) continue;
      if (!c.batched) {
        src[j] = r;
      } else {
        int e = 0;
        while (ref.offsets[e + 1] <= r)
          ++e;
        const int t = r - ref.offsets[e];
        if (t < c.max_tokens) src[j] = static_cast<int64_t>(e) * c.max_tokens + t;
      }
    }
    const bool empty = std::all_of(src.begin(), src.end(), [](int64_t r) { return r < 0; });
    for (int64_t h = 0; h < c.H; ++h) {
      float acc = 0.0f;
      for (int j = 0; j < c.k; ++j) {
        if (src[j] < 0) continue;
        const float wj = c.on_input ? 1.0f : w[m * c.k + j];
        acc = std::fma(wj, y[src[j] * c.H + h], acc);
      }
      if (c.accumulate || (c.skip_empty && empty)) acc = out0[m * c.H + h] + acc;
      want[m * c.H + h] = round_to(c.ot, acc);
    }
  }

  DevBuf<uint8_t> d_y(pack(c.yt, y));
  DevBuf<int32_t> d_s2r(ref.slot_to_row), d_off(ref.offsets);
  DevBuf<float> d_w(w);
  DevBuf<uint8_t> d_out(static_cast<size_t>(c.M * c.H * mc::elem_bytes(c.ot)));
  if (c.accumulate || c.skip_empty) {
    d_out.upload(pack(c.ot, out0));
  } else {
    d_out.poison();
  }
  mc::MoeUnpermuteParams p;
  p.layout = c.batched ? mc::UnpermuteLayout::kBatched : mc::UnpermuteLayout::kStandard;
  p.y = d_y.get();
  p.y_type = c.yt;
  p.y_row_stride = c.H;
  p.slot_to_row = d_s2r.get();
  p.topk_weights = c.on_input ? nullptr : d_w.get();
  p.apply_router_weight_on_input = c.on_input;
  p.num_tokens = c.M;
  p.top_k = c.k;
  p.hidden = c.H;
  p.expert_offsets = d_off.get();
  p.num_local_experts = E;
  p.max_tokens = c.max_tokens;
  p.out = d_out.get();
  p.out_type = c.ot;
  p.out_row_stride = c.H;
  p.accumulate = c.accumulate;
  p.skip_empty_rows = c.skip_empty;
  ASSERT_EQ(mc::moe_unpermute_unsupported_reason(p), nullptr);
  CUDA_OK(mc::launch_moe_unpermute(p, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const auto got_raw = d_out.download();
  const auto want_raw = pack(c.ot, want);
  if (got_raw != want_raw) {
    const auto got = unpack(c.ot, got_raw);
    for (size_t i = 0; i < got.size(); ++i) {
      if (std::memcmp(&got_raw[i * mc::elem_bytes(c.ot)], &want_raw[i * mc::elem_bytes(c.ot)],
                      mc::elem_bytes(c.ot)) != 0) {
        ADD_FAILURE() << "first difference at " << i << ": gpu " << got[i] << " ref " << want[i];
        break;
      }
    }
  }
  if (c.M > 0 && !c.accumulate && !c.skip_empty) {  // token 0 has no valid slot: zeros
    const auto got = unpack(c.ot, got_raw);
    for (int64_t h = 0; h < c.H; ++h)
      ASSERT_EQ(got[h], 0.0f);
  }
}

using UnpermuteTest = GpuTest;

TEST_F(UnpermuteTest, StandardAllSizes) {
  for (int64_t M : {0, 1, 33, 8192}) {
    check_unpermute({M, 8, 256, mc::ElemType::kBF16, mc::ElemType::kBF16}, 80 + M);
    check_unpermute({M, 8, 100, mc::ElemType::kBF16, mc::ElemType::kBF16}, 81 + M);
  }
  check_unpermute({65537, 2, 64, mc::ElemType::kBF16, mc::ElemType::kBF16}, 82);
}

TEST_F(UnpermuteTest, DtypesOnInputAccumulate) {
  check_unpermute({33, 4, 128, mc::ElemType::kF32, mc::ElemType::kF32}, 90);
  check_unpermute({33, 4, 128, mc::ElemType::kF16, mc::ElemType::kF16}, 91);
  check_unpermute({33, 4, 128, mc::ElemType::kBF16, mc::ElemType::kF32}, 92);
  check_unpermute({33, 1, 64, mc::ElemType::kBF16, mc::ElemType::kBF16, true}, 93);
  check_unpermute({33, 6, 96, mc::ElemType::kBF16, mc::ElemType::kBF16, false, true}, 94);
  check_unpermute({40, 6, 30, mc::ElemType::kF32, mc::ElemType::kBF16, false, true}, 95);
  check_unpermute({16, 16, 64, mc::ElemType::kBF16, mc::ElemType::kBF16}, 96);  // top_k = E
}

// Rows with no valid slot left as they were (token 0 and every garbage-only token), the others
// written as usual.
TEST_F(UnpermuteTest, SkipsEmptyRows) {
  UnpermuteCase c{257, 4, 128, mc::ElemType::kBF16, mc::ElemType::kBF16};
  c.skip_empty = true;
  check_unpermute(c, 110);
  c.k = 1;
  check_unpermute(c, 111);
}

TEST_F(UnpermuteTest, BatchedCombine) {
  check_unpermute({33, 4, 128, mc::ElemType::kBF16, mc::ElemType::kBF16, false, false, true, 64},
                  100);
  check_unpermute({200, 4, 72, mc::ElemType::kBF16, mc::ElemType::kF32, false, false, true, 20},
                  101);  // overflowed slots skipped
}

}  // namespace

#else  // !MOEKIT_WITH_CUDA

TEST(MoeSupportKernels, NeedsCuda) {
  GTEST_SKIP() << "moekit was built without CUDA";
}

#endif
