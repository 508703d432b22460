// Launch state of the Hopper grouped GEMMs that depends only on the device and the weights, built
// once (Experts::bind_weights, outside any graph capture) instead of at every launch: the SM count,
// the kernels' dynamic shared-memory attribute (set while building it), and W's TMA descriptor
// for every table row whose mainloop loads W by TMA. Plain data, no CUDA headers.
#pragma once

#include <array>
#include <cstdint>

#include "core/cuda/elem_type.h"
#include "experts/cuda/sm90/tiles.h"

namespace moekit::cuda::sm90 {

// An encoded CUtensorMap (128 bytes, 128-byte aligned), opaque to host code.
struct alignas(128) TmaDescriptor {
  std::array<unsigned char, 128> bytes{};
};

// One weight tensor W (num_experts, n, k), as a launch sees it.
struct WeightLaunchCache {
  const void* w = nullptr;  // null: nothing prepared (every launch prepares itself)
  int64_t n = 0, k = 0, num_experts = 0;
  ElemType dtype = ElemType::kBF16;
  ElemType out_dtype = ElemType::kBF16;  // C of the kernels prepared (fp8 operands: bf16 or f16)
  int sms = 0;                           // multiprocessors of W's device
  std::array<TmaDescriptor, kNumTiles> tma{};  // per table row; unused for rows without TMA
  // Per CUDA-core row: the decode pair kernel's resident CTAs per multiprocessor (0: not prepared).
  std::array<int, kNumTiles> pair_blocks{};
  // Per cluster row (TileConfig::cluster > 1): its clusters resident at once on the device.
  std::array<int, kNumTiles> clusters{};

  // Whether this cache describes exactly this W.
  bool matches(const void* w_, int64_t n_, int64_t k_, int64_t experts, ElemType dt,
               ElemType out) const {
    return w != nullptr && w == w_ && n == n_ && k == k_ && num_experts == experts && dtype == dt &&
           out_dtype == out;
  }
};

}  // namespace moekit::cuda::sm90
