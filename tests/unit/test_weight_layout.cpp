// The blocks-of-32 gate/up row order used by a fused GEMM1 activation (core/elementwise.h), and the
// sm90 backends' WeightLayout that applies it (in place) and inverts it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/elementwise.h"
#include "experts/cuda/sm90/int4_layout.h"
#include "experts/cuda/sm90/mx_e4m3.h"
#include "experts/cuda/sm90/mxfp4_layout.h"
#include "experts/cuda/sm90/mxfp6_layout.h"
#include "moekit/core/error.h"
#include "moekit/core/half.h"
#include "moekit/experts/cpu_reference.h"
#include "moekit/experts/sm90_experts.h"
#include "moekit/modular/expert_weights.h"
#include "moekit/oracle/backend.h"
#include "moekit/oracle/mxfp4.h"
#include "moekit/oracle/plan.h"
#include "moekit/oracle/unquantized.h"
#include "moekit/oracle/w4a8.h"
#include "moekit/quant/formats.h"

namespace moekit {
namespace {

// w13 (E, 2I, K) whose every element holds its (expert, row) so the permutation reads off.
Tensor tagged(int64_t E, int64_t n, int64_t K) {
  std::vector<float> v(static_cast<size_t>(E * n * K));
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t k = 0; k < K; ++k)
        v[(e * n + r) * K + k] = static_cast<float>(e * 1000 + r);
    }
  }
  return Tensor::from_floats(v, {E, n, K}, DType::kF32);
}

TEST(WeightLayout, StandardGateUpIntoBlocksOf32) {
  const int64_t E = 2, I = 96, n = 2 * I, K = 3;
  const Tensor src = tagged(E, n, K);
  Tensor dst = Tensor::empty(src.shape(), DType::kF32);
  interleave_gate_up_blocks(dst, src, /*pairwise=*/false, Stream{});
  const std::vector<float> d = dst.to_float_vector();
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = 0; r < n; ++r) {
      const int64_t block = r / 64, w = r % 64, col = block * 32 + w % 32;
      const int64_t expect = w < 32 ? col : I + col;  // gate row col, or up row I + col
      for (int64_t k = 0; k < K; ++k) {
        ASSERT_EQ(d[(e * n + r) * K + k], static_cast<float>(e * 1000 + expect)) << e << " " << r;
      }
    }
  }
}

TEST(WeightLayout, PairwiseSwigluSourceAndBias) {
  const int64_t E = 3, n = 128;
  // A bias (E, 2I) is the K = 1 case.
  std::vector<float> v(static_cast<size_t>(E * n));
  for (int64_t i = 0; i < E * n; ++i)
    v[i] = static_cast<float>(i);
  const Tensor src = Tensor::from_floats(v, {E, n}, DType::kF32);
  Tensor dst = Tensor::empty(src.shape(), DType::kF32);
  interleave_gate_up_blocks(dst, src, /*pairwise=*/true, Stream{});
  const std::vector<float> d = dst.to_float_vector();
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = 0; r < n; ++r) {
      const int64_t col = (r / 64) * 32 + (r % 64) % 32;
      const int64_t src_row = (r % 64) < 32 ? 2 * col : 2 * col + 1;  // gate = 2i, up = 2i + 1
      EXPECT_EQ(d[e * n + r], static_cast<float>(e * n + src_row));
    }
  }
}

TEST(WeightLayout, RejectsWidthsNotMultipleOf64AndAliasing) {
  const Tensor src = tagged(1, 96, 2);
  Tensor dst = Tensor::empty(src.shape(), DType::kF32);
  try {
    interleave_gate_up_blocks(dst, src, false, Stream{});
    FAIL() << "2I=96 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("2I=96"), std::string::npos) << e.what();
  }
  Tensor same = tagged(1, 128, 2);
  EXPECT_THROW(interleave_gate_up_blocks(same, same, false, Stream{}), Error);
}

MoEConfig small_moe(Activation act) {
  MoEConfig m;
  m.num_experts = m.num_local_experts = m.num_logical_experts = 2;
  m.experts_per_token = 1;
  m.hidden_dim = 3;
  m.intermediate_size = 32;
  m.activation = act;
  return m;
}

// The chosen backend's weight layout (ExpertsBackend::layout_for): to_kernel rewrites w13 and its
// bias in place (the same storage); to_standard is its exact inverse on host copies of single
// experts.
TEST(WeightLayout, OnlyFusedSm90BackendsHaveALayout) {
  const MoEConfig gated = small_moe(Activation::kSilu);
  ASSERT_TRUE(sm90_fuses_activation(gated));
  UnquantizedMoEKernelOracle oracle(gated);
  // The CPU backends keep the standard layout.
  for (const char* name : {"cpu", "cpu_batched", "cpu_monolithic"}) {
    EXPECT_FALSE(oracle.backend(name).layout_for(gated).has_value()) << name;
  }
  for (const char* name : {"sm90_grouped", "sm90_batched"}) {
    const std::optional<WeightLayout> layout = oracle.backend(name).layout_for(gated);
    ASSERT_TRUE(layout.has_value()) << name;
    EXPECT_EQ(layout->name, "w13 gate/up rows in blocks of 32 (activation fused into GEMM1)");
    EXPECT_TRUE(static_cast<bool>(layout->to_kernel)) << name;
    EXPECT_TRUE(static_cast<bool>(layout->to_standard)) << name;
  }
  // A non-gated layer, or I not a multiple of 32, is never reordered.
  const MoEConfig plain = small_moe(Activation::kSiluNoMul);
  EXPECT_FALSE(sm90_fuses_activation(plain));
  MoEConfig odd = gated;
  odd.intermediate_size = 48;
  EXPECT_FALSE(sm90_fuses_activation(odd));
  for (const char* name : {"sm90_grouped", "sm90_batched"}) {
    EXPECT_FALSE(oracle.backend(name).layout_for(plain).has_value()) << name;
    EXPECT_FALSE(oracle.backend(name).layout_for(odd).has_value()) << name;
  }
}

// Runs `layout` on (w13 (E, 2I, K), w2, w13 bias (E, 2I)) and checks: w13 and its bias are
// rewritten in place with kernel row r holding standard row src_row(r), w2 is untouched, and
// to_standard on a host copy of each expert gives the standard tensors back exactly.
void check_sm90_layout(const MoEConfig& moe, const WeightLayout& layout,
                       const std::function<int64_t(int64_t)>& src_row) {
  const int64_t E = moe.num_local_experts, n = 2 * moe.intermediate_size, K = moe.hidden_dim;
  ExpertWeights w;
  w.w13 = tagged(E, n, K);
  w.w2 = tagged(E, K, moe.intermediate_size);
  std::vector<float> b(static_cast<size_t>(E * n));
  for (int64_t i = 0; i < E * n; ++i)
    b[static_cast<size_t>(i)] = static_cast<float>(i);
  w.w13_bias = Tensor::from_floats(b, {E, n}, DType::kF32);
  const std::vector<float> w13_standard = w.w13.to_float_vector();
  const std::vector<float> w2_standard = w.w2.to_float_vector();
  const void* w13_data = w.w13.data();
  const void* w2_data = w.w2.data();
  const void* bias_data = w.w13_bias.data();

  layout.to_kernel(w, moe, Stream{});
  EXPECT_EQ(w.w13.data(), w13_data) << "w13 is rewritten in place";
  EXPECT_EQ(w.w13_bias.data(), bias_data) << "the bias is rewritten in place";
  EXPECT_EQ(w.w2.data(), w2_data);
  EXPECT_EQ(w.w2.to_float_vector(), w2_standard);
  const std::vector<float> k13 = w.w13.to_float_vector();
  const std::vector<float> kb = w.w13_bias.to_float_vector();
  EXPECT_NE(k13, w13_standard);
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = 0; r < n; ++r) {
      const int64_t s = src_row(r);
      for (int64_t k = 0; k < K; ++k) {
        ASSERT_EQ(k13[static_cast<size_t>((e * n + r) * K + k)], static_cast<float>(e * 1000 + s))
            << e << " " << r;
      }
      ASSERT_EQ(kb[static_cast<size_t>(e * n + r)], static_cast<float>(e * n + s)) << e << " " << r;
    }
  }
  // The inverse, one expert at a time on host copies.
  for (int64_t e = 0; e < E; ++e) {
    ExpertWeights one;
    one.w13 = w.w13.slice(0, e, e + 1).clone();
    one.w2 = w.w2.slice(0, e, e + 1).clone();
    one.w13_bias = w.w13_bias.slice(0, e, e + 1).clone();
    layout.to_standard(one, moe);
    const std::vector<float> want13(w13_standard.begin() + e * n * K,
                                    w13_standard.begin() + (e + 1) * n * K);
    EXPECT_EQ(one.w13.to_float_vector(), want13) << "expert " << e;
    const std::vector<float> want_b(b.begin() + e * n, b.begin() + (e + 1) * n);
    EXPECT_EQ(one.w13_bias.to_float_vector(), want_b) << "expert " << e;
    const std::vector<float> want2(w2_standard.begin() + e * K * moe.intermediate_size,
                                   w2_standard.begin() + (e + 1) * K * moe.intermediate_size);
    EXPECT_EQ(one.w2.to_float_vector(), want2) << "expert " << e;
  }
}

TEST(WeightLayout, Sm90LayoutRewritesW13AndBiasInPlace) {
  MoEConfig gated = small_moe(Activation::kSilu);
  gated.intermediate_size = 64;  // two blocks of 64 rows
  const std::optional<WeightLayout> layout =
      UnquantizedMoEKernelOracle(gated).backend("sm90_grouped").layout_for(gated);
  ASSERT_TRUE(layout.has_value());
  const int64_t I = gated.intermediate_size;
  check_sm90_layout(gated, *layout, [I](int64_t r) {
    const int64_t block = r / 64, w = r % 64, col = block * 32 + w % 32;
    return w < 32 ? col : I + col;  // gate row col, or up row I + col
  });
  // The rows of the original example: with I = 32, kernel row 32 is the first up row.
  const MoEConfig small = small_moe(Activation::kSilu);
  ExpertWeights w;
  w.w13 = tagged(2, 64, 3);
  w.w2 = tagged(2, 3, 32);
  layout->to_kernel(w, small, Stream{});
  const std::vector<float> v = w.w13.to_float_vector();
  EXPECT_EQ(v[31 * 3], 31.f);          // gate row 31
  EXPECT_EQ(v[32 * 3], 32.f);          // up row 0 (source row I + 0 = 32)
  EXPECT_EQ(v[(64 + 5) * 3], 1005.f);  // expert 1, gate row 5
}

TEST(WeightLayout, Sm90LayoutOfSwigluOaiIsPairwise) {
  MoEConfig oai = small_moe(Activation::kSwigluOai);
  ASSERT_TRUE(sm90_fuses_activation(oai));
  const std::optional<WeightLayout> layout =
      UnquantizedMoEKernelOracle(oai).backend("sm90_batched").layout_for(oai);
  ASSERT_TRUE(layout.has_value());
  check_sm90_layout(oai, *layout, [](int64_t r) {
    const int64_t col = (r / 64) * 32 + (r % 64) % 32;
    return (r % 64) < 32 ? 2 * col : 2 * col + 1;  // gate = 2i, up = 2i + 1
  });
}

TEST(WeightLayout, PlanCarriesTheChosenBackendsLayout) {
  const MoEConfig gated = small_moe(Activation::kSilu);
  // On the CPU the plan chooses "cpu": the standard layout.
  MoEPlan plan = plan_moe(gated, QuantConfig::unquantized(), PlanOptions{.log = false});
  ASSERT_TRUE(plan.ok()) << plan.error();
  EXPECT_EQ(plan.backend->name, "cpu");
  EXPECT_FALSE(plan.weight_layout.has_value());
  // A backend with the sm90 layout that serves the CPU deployment (a stand-in: this build cannot
  // run the Hopper classes): the plan takes its layout.
  ExpertsBackend stand_in = UnquantizedMoEKernelOracle(gated).backend("sm90_grouped");
  stand_in.candidate_on = {};
  stand_in.classes = {&CpuReferenceExperts::klass()};
  {
    BackendRegistration reg(stand_in);
    plan = plan_moe(gated, QuantConfig::unquantized(), PlanOptions{.log = false});
    ASSERT_TRUE(plan.ok()) << plan.error();
    EXPECT_EQ(plan.backend->name, "sm90_grouped");
    ASSERT_TRUE(plan.weight_layout.has_value());
    EXPECT_EQ(plan.weight_layout->name,
              "w13 gate/up rows in blocks of 32 (activation fused into GEMM1)");
    // ... for a deployment whose activation is fused only.
    const MoEConfig plain = small_moe(Activation::kSiluNoMul);
    plan = plan_moe(plain, QuantConfig::unquantized(), PlanOptions{.log = false});
    ASSERT_TRUE(plan.ok()) << plan.error();
    EXPECT_EQ(plan.backend->name, "sm90_grouped");
    EXPECT_FALSE(plan.weight_layout.has_value());
  }
  plan = plan_moe(gated, QuantConfig::unquantized(), PlanOptions{.log = false});
  EXPECT_EQ(plan.backend->name, "cpu");
  EXPECT_FALSE(plan.weight_layout.has_value());
}

// A uint8 host tensor of `shape` filled with rng's bytes.
Tensor random_bytes(std::mt19937& rng, Shape shape) {
  Tensor t = Tensor::empty(shape, DType::kUInt8);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data_as<uint8_t>()[i] = static_cast<uint8_t>(rng() & 0xFF);
  return t;
}

// to_standard on each expert of `w` (in the kernel layout), alone, gives its standard bytes back.
void expect_each_expert_back(const WeightLayout& layout, const ExpertWeights& w,
                             const MoEConfig& moe, const Tensor& w13_standard,
                             const Tensor& w2_standard) {
  for (int64_t e = 0; e < w.w13.size(0); ++e) {
    ExpertWeights one;
    one.w13 = w.w13.slice(0, e, e + 1).clone();
    one.w2 = w.w2.slice(0, e, e + 1).clone();
    layout.to_standard(one, moe);
    const Tensor want13 = w13_standard.slice(0, e, e + 1).clone();
    const Tensor want2 = w2_standard.slice(0, e, e + 1).clone();
    EXPECT_EQ(std::memcmp(one.w13.data(), want13.data(), static_cast<size_t>(want13.numel())), 0)
        << "expert " << e;
    EXPECT_EQ(std::memcmp(one.w2.data(), want2.data(), static_cast<size_t>(want2.numel())), 0)
        << "expert " << e;
  }
}

// A 4-bit backend's layout (host tensors, k / 2 bytes per row): to_kernel rewrites w2's codes as
// `codes` does (w2 has no row reorder) and moves w13 (its rows and codes); to_standard on single
// experts gives the bytes back. `name_part`: what the layout's name says.
void expect_4bit_codes_layout(const std::optional<WeightLayout>& layout, const MoEConfig& moe,
                              const char* name_part, uint32_t seed,
                              const std::function<void(Tensor&)>& codes) {
  ASSERT_TRUE(layout.has_value());
  EXPECT_NE(layout->name.find(name_part), std::string::npos) << layout->name;
  const int64_t E = moe.num_local_experts, N = 2 * moe.intermediate_size, H = moe.hidden_dim;
  std::mt19937 rng(seed);
  ExpertWeights w;
  w.w13 = random_bytes(rng, {E, N, H / 2});
  w.w2 = random_bytes(rng, {E, H, moe.intermediate_size / 2});
  const Tensor w13_standard = w.w13.clone(), w2_standard = w.w2.clone();
  layout->to_kernel(w, moe, Stream{});
  Tensor w2_expect = w2_standard.clone();
  codes(w2_expect);
  EXPECT_EQ(std::memcmp(w.w2.data(), w2_expect.data(), static_cast<size_t>(w.w2.numel())), 0);
  EXPECT_NE(std::memcmp(w.w13.data(), w13_standard.data(), static_cast<size_t>(w.w13.numel())), 0);
  expect_each_expert_back(*layout, w, moe, w13_standard, w2_standard);
}

// sm90_mxfp4: the fused gate/up row blocks and every 16-byte group's codes in the kernel nibble
// order, w2's codes too. The kernel order is a permutation of each group (mxfp4_kernel_element).
TEST(WeightLayout, Sm90Mxfp4ReordersCodesOfBothWeightsAndInverts) {
  std::vector<int> seen(32, 0);
  for (int n = 0; n < 32; ++n)
    ++seen[static_cast<size_t>(cuda::sm90::mxfp4_kernel_element(n))];
  EXPECT_EQ(seen, std::vector<int>(32, 1));
  EXPECT_EQ(cuda::sm90::mxfp4_kernel_element(0), 0);  // pair (0, 1) at nibbles 0 and 4
  EXPECT_EQ(cuda::sm90::mxfp4_kernel_element(4), 1);
  EXPECT_EQ(cuda::sm90::mxfp4_kernel_element(1), 8);  // pair (8, 9) at nibbles 1 and 5
  EXPECT_EQ(cuda::sm90::mxfp4_kernel_element(8), 2);  // word 1 starts with lane 1's pair

  MoEConfig moe = small_moe(Activation::kSwigluOai);
  moe.hidden_dim = 64;
  moe.intermediate_size = 64;
  expect_4bit_codes_layout(Mxfp4MoEKernelOracle(moe).backend("sm90_mxfp4").layout_for(moe), moe,
                           "nibble order", 7, [](Tensor& t) {
                             cuda::sm90::mxfp4_reorder_groups(t.data_as<uint8_t>(), t.numel() / 16,
                                                              true);
                           });
}

// sm90_w4a8: the fused gate/up row blocks and both weights' int4 codes as the kernels' split
// codes (every word through int4_split_word).
TEST(WeightLayout, Sm90W4A8SplitsCodesOfBothWeightsAndInverts) {
  MoEConfig moe = small_moe(Activation::kSilu);
  moe.hidden_dim = 64;
  moe.intermediate_size = 64;
  expect_4bit_codes_layout(W4A8MoEKernelOracle(moe).backend("sm90_w4a8").layout_for(moe), moe,
                           "split codes", 11, [](Tensor& t) {
                             auto* words = static_cast<uint32_t*>(t.data());
                             for (int64_t i = 0; i < t.numel() / 4; ++i)
                               words[i] = cuda::sm90::int4_split_word(words[i]);
                           });
}

// sm90_mxfp6 (host tensors): the fused gate/up row blocks and every row repacked into the MXFP6
// kernel layout, w2 too; to_standard on single experts gives the bytes back.
TEST(WeightLayout, Sm90Mxfp6RepacksRowsOfBothWeightsAndInverts) {
  MoEConfig moe = small_moe(Activation::kSilu);
  moe.hidden_dim = 128;
  moe.intermediate_size = 64;
  const std::optional<WeightLayout> layout =
      Mxfp4MoEKernelOracle(moe).backend("sm90_mxfp6").layout_for(moe);
  ASSERT_TRUE(layout.has_value());
  EXPECT_NE(layout->name.find("top bits"), std::string::npos) << layout->name;
  const int64_t E = moe.num_local_experts, N = 2 * moe.intermediate_size, H = moe.hidden_dim;
  const int64_t I = moe.intermediate_size;
  std::mt19937 rng(9);
  ExpertWeights w;
  w.w13 = random_bytes(rng, {E, N, 3 * H / 4});
  w.w2 = random_bytes(rng, {E, H, 3 * I / 4});
  const Tensor w13_standard = w.w13.clone(), w2_standard = w.w2.clone();
  layout->to_kernel(w, moe, Stream{});
  // w2 has no row reorder: its rows are the standard ones repacked.
  Tensor w2_expect = w2_standard.clone();
  cuda::sm90::mxfp6_repack_rows(w2_expect.data_as<uint8_t>(), E * H, I, true);
  EXPECT_EQ(std::memcmp(w.w2.data(), w2_expect.data(), static_cast<size_t>(w.w2.numel())), 0);
  EXPECT_NE(std::memcmp(w.w13.data(), w13_standard.data(), static_cast<size_t>(w.w13.numel())), 0);
  expect_each_expert_back(*layout, w, moe, w13_standard, w2_standard);
  // Rows that are not 3k / 4 bytes with k a multiple of 64 are refused by name.
  ExpertWeights bad;
  bad.w13 = random_bytes(rng, {E, N, 3 * H / 4});
  bad.w2 = random_bytes(rng, {E, H, 24});
  EXPECT_THROW(layout->to_kernel(bad, moe, Stream{}), Error);
}

// mul.rn.bf16x2 emulated in float (exact where the products are bf16 values, as here).
uint32_t mul_bf16x2_host(uint32_t a, uint32_t b) {
  uint32_t out = 0;
  for (int h = 0; h < 2; ++h) {
    const float x = bf16_bits_to_float(static_cast<uint16_t>(a >> (16 * h)));
    const float y = bf16_bits_to_float(static_cast<uint16_t>(b >> (16 * h)));
    out |= static_cast<uint32_t>(float_to_bf16_bits(x * y)) << (16 * h);
  }
  return out;
}

// e2m1_pair_bits of pair p (a run-time index).
uint32_t e2m1_pair_bits_at(int p, uint32_t word) {
  namespace k = cuda::sm90;
  constexpr uint32_t (*kPairs[])(uint32_t) = {&k::e2m1_pair_bits<0>, &k::e2m1_pair_bits<1>,
                                              &k::e2m1_pair_bits<2>, &k::e2m1_pair_bits<3>};
  return kPairs[p](word);
}

// The W4A16 kernels' conversion (sm90/mxfp4_layout.h) on the host, with bf16 multiplies emulated
// in float (exact: every product is a power-of-two multiple of an e2m1 value): every pair of every
// byte pattern, every e8m0 scale the GPU tests cover (2^-119 .. 2^127) and NaN, gives the decoded
// value exactly.
TEST(WeightLayout, Mxfp4PairConversionIsExact) {
  int wrong = 0;
  for (uint32_t s = 8; s <= 255; ++s) {
    for (uint32_t codes = 0; codes < 256; ++codes) {  // (low, high) code of a pair
      for (int p = 0; p < 4; ++p) {
        const uint32_t word = ((codes & 0xFu) << (4 * p)) | ((codes >> 4) << (4 * (p + 4))) |
                              (0x5A5A5A5Au & ~((0xFu << (4 * p)) | (0xFu << (4 * (p + 4)))));
        uint32_t v = mul_bf16x2_host(e2m1_pair_bits_at(p, word), cuda::sm90::w4_first_factor(s));
        if (s > 128) v = mul_bf16x2_host(v, cuda::sm90::w4_second_factor(s));
        for (int h = 0; h < 2; ++h) {
          const float got = bf16_bits_to_float(static_cast<uint16_t>(v >> (16 * h)));
          const float want =
              quant::decode_fp4_e2m1(static_cast<uint8_t>((codes >> (4 * h)) & 0xFu)) *
              quant::decode_e8m0(static_cast<uint8_t>(s));
          const bool ok = s == 255 ? std::isnan(got) : got == want && !std::isnan(got);
          if (!ok && wrong++ < 5) {
            ADD_FAILURE() << "s=" << s << " codes=" << codes << " p=" << p << " h=" << h << ": got "
                          << got << ", want " << want;
          }
        }
      }
    }
  }
  EXPECT_EQ(wrong, 0);
}

// fp6_pair_bits of pair p (a run-time index).
template <bool kE3M2>
uint32_t fp6_pair_bits_at(int p, uint32_t word, uint32_t high) {
  namespace k = cuda::sm90;
  constexpr uint32_t (*kPairs[])(uint32_t, uint32_t) = {
      &k::fp6_pair_bits<0, kE3M2>, &k::fp6_pair_bits<1, kE3M2>, &k::fp6_pair_bits<2, kE3M2>,
      &k::fp6_pair_bits<3, kE3M2>};
  return kPairs[p](word, high);
}

// Pair p of an MXFP6 kernel word as the kernels will convert it (sm90/mxfp6_layout.h): the bits,
// the first factor, and the second where the scale needs it.
uint32_t fp6_pair_value(bool e3m2, int p, uint32_t word, uint32_t high, uint32_t s) {
  namespace k = cuda::sm90;
  const uint32_t bits =
      e3m2 ? fp6_pair_bits_at<true>(p, word, high) : fp6_pair_bits_at<false>(p, word, high);
  uint32_t v = mul_bf16x2_host(bits, k::mxfp6_first_factor(s, e3m2));
  if (k::mxfp6_two_steps(s, e3m2)) v = mul_bf16x2_host(v, k::mxfp6_second_factor(s, e3m2));
  return v;
}

// Every pair of 6-bit codes (both formats) at every position of a word, the other nibbles and
// high bits set to junk, and every e8m0 scale from 2^-111 up (the products stay bf16 normals or
// exact subnormals) and NaN: the decoded value times the scale, exactly.
TEST(WeightLayout, Mxfp6PairConversionIsExact) {
  int wrong = 0;
  for (const bool e3m2 : {false, true}) {
    for (uint32_t s = 16; s <= 255; ++s) {
      for (uint32_t codes = 0; codes < 4096; ++codes) {  // (low, high) code of a pair
        const uint32_t c[2] = {codes & 0x3Fu, codes >> 6};
        for (int p = 0; p < 4; ++p) {
          const uint32_t nibbles = (0xFu << (4 * p)) | (0xFu << (4 * (p + 4)));
          const uint32_t word = ((c[0] & 0xFu) << (4 * p)) | ((c[1] & 0xFu) << (4 * (p + 4))) |
                                (0xA5C3A5C3u & ~nibbles);
          const uint32_t fields = (0x3u << (2 * p)) | (0x3u << (2 * p + 16));
          const uint32_t high =
              ((c[0] >> 4) << (2 * p)) | ((c[1] >> 4) << (2 * p + 16)) | (0x6C396C39u & ~fields);
          const uint32_t v = fp6_pair_value(e3m2, p, word, high, s);
          for (int h = 0; h < 2; ++h) {
            const float got = bf16_bits_to_float(static_cast<uint16_t>(v >> (16 * h)));
            const auto code = static_cast<uint8_t>(c[h]);
            const float want =
                (e3m2 ? quant::decode_fp6_e3m2(code) : quant::decode_fp6_e2m3(code)) *
                quant::decode_e8m0(static_cast<uint8_t>(s));
            const bool ok = s == 255 ? std::isnan(got) : got == want && !std::isnan(got);
            if (!ok && wrong++ < 5) {
              ADD_FAILURE() << (e3m2 ? "e3m2" : "e2m3") << " s=" << s << " codes " << c[0] << ","
                            << c[1] << " p=" << p << " h=" << h << ": got " << got << ", want "
                            << want;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(wrong, 0);
}

// The load-time repack of MXFP6 rows (standard 6-bit packing -> low nibble plane + high 2-bit
// plane): random rows round-trip bit for bit, and the kernel layout, read the way the kernels
// will (word q of a group's low plane, H[q / 2] >> 8 (q % 2), pair p = elements 16 (p / 2) +
// 8 (p % 2) + 2q and + 1), gives every element the library's own decoder gives the standard row.
TEST(WeightLayout, Mxfp6RepackRoundTripsAndFeedsThePairConversion) {
  namespace k = cuda::sm90;
  std::mt19937 rng(606);
  for (const int64_t kk : {32, 96, 2880}) {
    for (const bool e3m2 : {false, true}) {
      const int64_t rows = 3, row_bytes = 3 * kk / 4;
      std::vector<uint8_t> standard(static_cast<size_t>(rows * row_bytes));
      for (auto& b : standard)
        b = static_cast<uint8_t>(rng());
      std::vector<uint8_t> kernel = standard;
      k::mxfp6_repack_rows(kernel.data(), rows, kk, /*to_kernel=*/true);
      EXPECT_NE(kernel, standard);
      std::vector<uint8_t> back = kernel;
      k::mxfp6_repack_rows(back.data(), rows, kk, /*to_kernel=*/false);
      EXPECT_EQ(back, standard) << "k=" << kk;

      const quant::Format format = e3m2 ? quant::Format::kFp6E3M2 : quant::Format::kFp6E2M3;
      const uint32_t s = 120 + static_cast<uint32_t>(rng() % 16);  // one scale: 2^-7 .. 2^8
      int wrong = 0;
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<float> want(static_cast<size_t>(kk));
        quant::decode_fp6_packed(
            format, std::span<const uint8_t>(standard.data() + r * row_bytes, row_bytes), want);
        const uint8_t* row = kernel.data() + r * row_bytes;
        for (int64_t g = 0; g < kk / 32; ++g) {
          for (int q = 0; q < 4; ++q) {
            uint32_t word = 0, high = 0;
            std::memcpy(&word, row + g * 16 + 4 * q, 4);
            std::memcpy(&high, row + kk / 2 + g * 8 + 4 * (q / 2), 4);
            high >>= 8 * (q % 2);
            for (int p = 0; p < 4; ++p) {
              const uint32_t v = fp6_pair_value(e3m2, p, word, high, s);
              const int64_t e = g * 32 + 16 * (p / 2) + 8 * (p % 2) + 2 * q;
              for (int h = 0; h < 2; ++h) {
                const float got = bf16_bits_to_float(static_cast<uint16_t>(v >> (16 * h)));
                const float expect =
                    want[static_cast<size_t>(e + h)] * quant::decode_e8m0(static_cast<uint8_t>(s));
                if (got != expect && wrong++ < 5) {
                  ADD_FAILURE() << "k=" << kk << " row " << r << " element " << e + h << ": got "
                                << got << ", want " << expect;
                }
              }
            }
          }
        }
      }
      EXPECT_EQ(wrong, 0) << "k=" << kk << (e3m2 ? " e3m2" : " e2m3");
    }
  }
}

// The W4A8 rows' int4 -> e4m3 conversion (sm90/int4_layout.h, the producer's byte permutes) on
// the host: every 16-bit pattern of four uint4b8 nibbles gives the e4m3 codes of their values
// (nibble - 8) exactly, in element order; the high half of a word is ignored.
TEST(WeightLayout, Int4ToE4m3ConversionIsExact) {
  auto perm = [](uint32_t lo, uint32_t hi, uint32_t sel) {
    return cuda::sm90::host_byte_perm(lo, hi, sel);
  };
  int wrong = 0;
  for (uint32_t nibbles = 0; nibbles < 0x10000u; ++nibbles) {
    const uint32_t got = cuda::sm90::int4x4_to_e4m3(nibbles | 0xA5A50000u, perm);
    for (int i = 0; i < 4; ++i) {
      const int value = static_cast<int>((nibbles >> (4 * i)) & 0xFu) - 8;
      const auto code = static_cast<uint8_t>(got >> (8 * i));
      const bool ok = quant::decode_e4m3(code) == static_cast<float>(value) &&
                      code == quant::encode_e4m3(static_cast<float>(value));
      if (!ok && wrong++ < 5) {
        ADD_FAILURE() << "nibbles=" << std::hex << nibbles << " element " << i << ": code 0x"
                      << static_cast<int>(code) << std::dec << ", want " << value;
      }
    }
  }
  EXPECT_EQ(wrong, 0);
}

// The split codes the W4A8 kernels read (sm90/int4_layout.h): the swap of bits 2 and 3 is its own
// inverse and permutes the codes of a nibble, and the two-permute lookup (the second permute in
// prmt's sign mode) gives, for every 16-bit pattern of four split codes, the e4m3 codes of the
// values the uint4b8 codes before the swap held, exactly, in element order; the high half of the
// word is ignored (the kernel passes the same word shifted for its high half).
TEST(WeightLayout, Int4SplitCodesConvertExactly) {
  using namespace cuda::sm90;  // NOLINT: the layout's names
  for (uint32_t u = 0; u < 16; ++u) {
    const uint32_t c = int4_split_word(u);
    EXPECT_LT(c, 16u);
    EXPECT_EQ(int4_split_word(c), u);
    EXPECT_EQ(int4_split_word(u << 28) >> 28, c) << "every nibble of a word alike";
  }
  auto perm = [](uint32_t lo, uint32_t hi, uint32_t sel) { return host_byte_perm(lo, hi, sel); };
  auto perm_sign = [](uint32_t lo, uint32_t hi, uint32_t sel) {
    return host_byte_perm_sign(lo, hi, sel);
  };
  // The sign mode itself: bit 3 of a selector nibble spreads the selected byte's sign bit.
  EXPECT_EQ(host_byte_perm_sign(0x80017F00u, 0x00FF0080u, 0x0B49u), 0x00FF8000u);
  int wrong = 0;
  for (uint32_t codes = 0; codes < 0x10000u; ++codes) {
    const uint32_t word = codes | 0x5A5A0000u;
    const uint32_t got =
        int4x4_split_to_e4m3(word, word & 0x77777777u, perm, perm_sign, kInt4SplitT0, kInt4SplitT1,
                             kInt4SplitS0, kInt4SplitS1);
    const uint32_t unsplit = int4_split_word(codes);
    for (int i = 0; i < 4; ++i) {
      const int value = static_cast<int>((unsplit >> (4 * i)) & 0xFu) - 8;
      const auto code = static_cast<uint8_t>(got >> (8 * i));
      const bool ok = quant::decode_e4m3(code) == static_cast<float>(value) &&
                      code == quant::encode_e4m3(static_cast<float>(value));
      if (!ok && wrong++ < 5) {
        ADD_FAILURE() << "split codes=" << std::hex << codes << " element " << i << ": code 0x"
                      << static_cast<int>(code) << std::dec << ", want " << value;
      }
    }
  }
  EXPECT_EQ(wrong, 0);
}

// The MXFP4 e4m3 rows' conversion (sm90/mx_e4m3.h) on the host. The reference exponent keeps the
// largest of a step's four groups at 2^6 and the step scale a normal f32; every e2m1 code under
// every shift d = s - r (d >= -8 exactly, e4m3 subnormals included; below, the nearest e4m3 value,
// ties to even; 0 below 2^-15 of a magnitude) through the byte permutes, both signs, in element
// order; the high half of a word is ignored.
TEST(WeightLayout, Mxfp4ToE4m3WithTheGroupShiftIsExact) {
  using cuda::sm90::kMxE4m3Table;
  using cuda::sm90::kMxShiftMin;
  EXPECT_EQ(cuda::sm90::mx_reference(0x7F7F7F7Fu), 121u);  // four groups of 2^0: 2^0 = 2^6 x 2^-6
  EXPECT_EQ(cuda::sm90::mx_reference(0x01808203u), 124u);  // the largest, 130, minus 6
  EXPECT_EQ(cuda::sm90::mx_reference(0x00000000u), 1u);    // never below 1: 2^-126, a normal f32
  EXPECT_EQ(cuda::sm90::mx_entry(130, 124), 6 - kMxShiftMin);
  EXPECT_EQ(cuda::sm90::mx_entry(3, 124), 0);  // far below: the all-zero entry
  // The kernel's arithmetic entries (normal shifts) are the table's.
  for (int d = -8; d <= cuda::sm90::kMxShiftMax; ++d) {
    if (!cuda::sm90::mx_normal_shift(d)) continue;
    for (int w = 0; w < 2; ++w)
      EXPECT_EQ(cuda::sm90::mx_normal_word(d, w), kMxE4m3Table.words[2 * (d - kMxShiftMin) + w])
          << "d=" << d << " word " << w;
  }
  EXPECT_FALSE(cuda::sm90::mx_normal_shift(-6));
  auto perm = [](uint32_t lo, uint32_t hi, uint32_t sel) {
    return cuda::sm90::host_byte_perm(lo, hi, sel);
  };
  int wrong = 0;
  for (int d = -40; d <= cuda::sm90::kMxShiftMax; ++d) {
    const int entry = cuda::sm90::mx_entry(static_cast<uint32_t>(d + 100), 100u);
    const uint32_t lo = kMxE4m3Table.words[2 * entry], hi = kMxE4m3Table.words[2 * entry + 1];
    for (uint32_t nibbles = 0; nibbles < 0x10000u; nibbles += (d == 0 ? 1 : 7)) {
      const uint32_t got = cuda::sm90::e2m1x4_to_e4m3(nibbles | 0x5A5A0000u, lo, hi, perm);
      for (int i = 0; i < 4; ++i) {
        const auto e2m1 = static_cast<uint8_t>((nibbles >> (4 * i)) & 0xFu);
        const double value = std::ldexp(static_cast<double>(quant::decode_fp4_e2m1(e2m1)), d);
        const auto code = static_cast<uint8_t>(got >> (8 * i));
        const double decoded = quant::decode_e4m3(code);
        // The nearest e4m3 value: exact from d = -8 on; below, within half a subnormal unit
        // (2^-10), ties to an even code; the sign kept (also for values rounded to zero).
        const bool exact = d >= -8 ? decoded == value : std::fabs(decoded - value) <= 0x1p-10;
        const bool even_tie = d >= -8 || std::fabs(decoded - value) < 0x1p-10 || (code & 1) == 0;
        const bool sign = (code & 0x80) == (e2m1 & 0x8 ? 0x80 : 0);
        if (!(exact && even_tie && sign) && wrong++ < 5) {
          ADD_FAILURE() << "d=" << d << " e2m1 0x" << std::hex << static_cast<int>(e2m1)
                        << ": code 0x" << static_cast<int>(code) << std::dec << " = " << decoded
                        << ", want " << value;
        }
      }
    }
  }
  EXPECT_EQ(wrong, 0);
}

// NVFP4's scales through the same pairs: every finite non-negative ue4m3 code (subnormals
// included) as its kernel scale code gives the factor s x 2^118, and every pair of every byte
// pattern times it is e2m1 x s x 2^-8 exactly (the 2^8 goes to the epilogue's global scale).
TEST(WeightLayout, Nvfp4PairConversionIsExact) {
  EXPECT_EQ(cuda::sm90::nvfp4_kernel_scale(0), 0);
  EXPECT_EQ(cuda::sm90::nvfp4_factor(0), 0u);
  std::set<uint32_t> kernel_codes;
  int wrong = 0;
  for (uint32_t c = 0; c < 0x7F; ++c) {
    const uint32_t b = cuda::sm90::nvfp4_kernel_scale(c);
    kernel_codes.insert(b);
    const uint32_t f = cuda::sm90::nvfp4_factor(b);
    const float s = quant::decode_ue4m3(static_cast<uint8_t>(c));
    EXPECT_EQ(f >> 16, f & 0xFFFFu) << "c=" << c;
    EXPECT_EQ(bf16_bits_to_float(static_cast<uint16_t>(f)), std::ldexp(s, 118)) << "c=" << c;
    for (uint32_t codes = 0; codes < 256; ++codes) {
      for (int p = 0; p < 4; ++p) {
        const uint32_t word = ((codes & 0xFu) << (4 * p)) | ((codes >> 4) << (4 * (p + 4))) |
                              (0xA5A5A5A5u & ~((0xFu << (4 * p)) | (0xFu << (4 * (p + 4)))));
        const uint32_t v = mul_bf16x2_host(e2m1_pair_bits_at(p, word), f);
        for (int h = 0; h < 2; ++h) {
          const float got = bf16_bits_to_float(static_cast<uint16_t>(v >> (16 * h))) *
                            cuda::sm90::kNvfp4PairExponentScale;
          const float want =
              quant::decode_fp4_e2m1(static_cast<uint8_t>((codes >> (4 * h)) & 0xFu)) * s;
          if ((got != want || std::isnan(got)) && wrong++ < 5) {
            ADD_FAILURE() << "c=" << c << " codes=" << codes << " p=" << p << " h=" << h << ": got "
                          << got << ", want " << want;
          }
        }
      }
    }
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(kernel_codes.size(), 0x7Fu);  // one kernel code per ue4m3 code
}

}  // namespace
}  // namespace moekit
