// Determinism and batch invariance of a layer, on whatever device it runs: the same inputs give
// bitwise the same outputs run after run, and (in batch-invariant mode) a token's output does not
// depend on the other tokens of its batch.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "moekit/layer/moe_layer.h"
#include "testing.h"

namespace moekit::testing {

// Forwards host x (M, H) and logits (M, E) on the layer's device; returns the host output.
inline Tensor forward_on_host(MoELayer& layer, const Tensor& x, const Tensor& logits) {
  const Device d = layer.options().device.device();
  if (d.is_cpu()) return layer.forward(x, logits);
  return layer.forward(x.to(d), logits.to(d)).to(Device::cpu());
}

// Row r of a (M, ...) host tensor, copied.
inline Tensor row_of(const Tensor& t, int64_t r) {
  return t.slice(0, r, r + 1).clone();
}

// `runs` forwards of the same random batch of M tokens give bitwise identical outputs.
inline ::testing::AssertionResult deterministic(MoELayer& layer, int64_t M, int runs,
                                                uint64_t seed) {
  const ModelPreset& model = layer.model();
  const Tensor x = random_tensor({M, model.hidden_size}, layer.options().dtype, seed);
  const Tensor logits = random_tensor({M, model.num_experts}, DType::kF32, seed + 1, -3, 3);
  const Tensor first = forward_on_host(layer, x, logits);
  if (has_nan(first)) return ::testing::AssertionFailure() << "NaN in the output";
  for (int r = 1; r < runs; ++r) {
    if (!bitwise_equal(forward_on_host(layer, x, logits), first)) {
      return ::testing::AssertionFailure() << "run " << r << " differs from run 0 (M=" << M << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

// Each of `probes` tokens run alone gives bitwise the output it gets at a random position inside
// random batches of every size in `batch_sizes`.
inline ::testing::AssertionResult batch_invariant(MoELayer& layer,
                                                  const std::vector<int64_t>& batch_sizes,
                                                  int probes, uint64_t seed) {
  const ModelPreset& model = layer.model();
  const DType dtype = layer.options().dtype;
  const Tensor px = random_tensor({probes, model.hidden_size}, dtype, seed);
  const Tensor plogits = random_tensor({probes, model.num_experts}, DType::kF32, seed + 1, -3, 3);
  std::vector<Tensor> alone;
  for (int p = 0; p < probes; ++p)
    alone.push_back(forward_on_host(layer, row_of(px, p), row_of(plogits, p)));
  std::mt19937_64 rng(seed + 2);
  for (const int64_t M : batch_sizes) {
    Tensor x = random_tensor({M, model.hidden_size}, dtype, seed + 10 + M);
    Tensor logits = random_tensor({M, model.num_experts}, DType::kF32, seed + 11 + M, -3, 3);
    std::vector<int64_t> where(static_cast<size_t>(probes));
    for (int p = 0; p < probes && p < M; ++p) {
      where[p] = static_cast<int64_t>(rng() % static_cast<uint64_t>(M));
      x.slice(0, where[p], where[p] + 1).copy_from(row_of(px, p));
      logits.slice(0, where[p], where[p] + 1).copy_from(row_of(plogits, p));
    }
    const Tensor out = forward_on_host(layer, x, logits);
    for (int p = 0; p < probes && p < M; ++p) {
      // A later probe may have overwritten an earlier one's row.
      bool overwritten = false;
      for (int q = p + 1; q < probes && q < M; ++q)
        overwritten |= where[q] == where[p];
      if (overwritten) continue;
      if (!bitwise_equal(row_of(out, where[p]), alone[p])) {
        return ::testing::AssertionFailure()
               << "token " << p << " alone differs from the same token at row " << where[p]
               << " of a batch of " << M;
      }
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace moekit::testing
