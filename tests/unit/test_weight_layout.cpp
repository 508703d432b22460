// The blocks-of-32 gate/up row order used by a fused GEMM1 activation (core/elementwise.h).
#include <gtest/gtest.h>

#include <vector>

#include "core/elementwise.h"
#include "moekit/core/error.h"
#include "moekit/experts/sm90_experts.h"
#include "moekit/oracle/unquantized.h"

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

TEST(WeightLayout, OracleConvertsOnlyForFusedSm90Backends) {
  const MoEConfig gated = small_moe(Activation::kSilu);
  ASSERT_TRUE(sm90_fuses_activation(gated));
  UnquantizedMoEKernelOracle oracle(gated);
  const Tensor w13 = tagged(2, 64, 3);
  const Tensor w2 = tagged(2, 3, 32);
  // The CPU reference keeps the standard layout: the very same tensors come back.
  auto [c13, c2] = oracle.convert_to_kernel_format(UnquantizedMoeBackend::kCpu, gated, w13, w2);
  EXPECT_EQ(c13.data(), w13.data());
  EXPECT_EQ(c2.data(), w2.data());
  // sm90: a reordered copy of w13 (with I = 32, kernel row 32 is the first up row), w2 unchanged.
  auto [k13, k2] =
      oracle.convert_to_kernel_format(UnquantizedMoeBackend::kSm90Grouped, gated, w13, w2);
  EXPECT_NE(k13.data(), w13.data());
  EXPECT_EQ(k2.data(), w2.data());
  const std::vector<float> v = k13.to_float_vector();
  EXPECT_EQ(v[31 * 3], 31.f);          // gate row 31
  EXPECT_EQ(v[32 * 3], 32.f);          // up row 0 (source row I + 0 = 32)
  EXPECT_EQ(v[(64 + 5) * 3], 1005.f);  // expert 1, gate row 5
  // The bias follows the rows; a non-gated layer is never reordered.
  const Tensor bias = Tensor::from_floats(std::vector<float>(128, 1.f), {2, 64}, DType::kF32);
  EXPECT_NE(
      oracle.convert_w13_bias_to_kernel_format(UnquantizedMoeBackend::kSm90Batched, gated, bias)
          .data(),
      bias.data());
  const MoEConfig plain = small_moe(Activation::kSiluNoMul);
  EXPECT_FALSE(sm90_fuses_activation(plain));
  auto [p13, p2] =
      oracle.convert_to_kernel_format(UnquantizedMoeBackend::kSm90Grouped, plain, w13, w2);
  EXPECT_EQ(p13.data(), w13.data());
}

}  // namespace
}  // namespace moekit
