// Fused top-k router: one warp per token row; lane l owns the contiguous experts l*VPT ..
// l*VPT+VPT-1 (vector loads; a DeepSeek group of 32 experts spans 4 lanes).
//
// This kernel does, per row:
//   1. load the E logits (and the bias) of the lane's run;
//   2. score them in fp32 (softmax with warp reductions, or sigmoid) with the NaN / Inf rules of
//      include/moekit/router/router.h (the CPU router's), so both paths give the same ids;
//   3. build 32-bit order-preserving selection keys from score (+ bias); experts of groups that are
//      not among the top `topk_group` groups get the lowest key class (group top-2 by log2(L) xor
//      levels when a group is L whole lanes, L a power of two; else a full-warp reduction per
//      group), groups ranked by broadcast shuffles, ties to the lower group id;
//   4. pick k times: the warp max of the lanes' best keys (redux.sync.max), then the lowest expert
//      id holding it (redux.sync.min), so ties go to the lower id and every pick is distinct;
//   5. gather the unbiased weights, renormalize and scale them, and store ids and weights.
// Launched with programmatic dependent launch (core/cuda/pdl.cuh).
#include "router/cuda/topk_router.h"

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/cuda/elem_io.cuh"
#include "core/cuda/pdl.cuh"

namespace moekit::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr unsigned kFull = 0xffffffffu;

// Order-preserving map float -> uint32 (larger float, larger key). NaN counts as -inf and -0 as +0
// (they compare equal, so ties go to the lower id as on the CPU). The result is >= 0x007fffff for
// every float, so 0 and 1 stay free for "picked / padding" and "excluded group".
__device__ __forceinline__ uint32_t order_key(float v) {
  if (v != v) v = -INFINITY;
  v += 0.0f;  // NOTE: -0 + +0 = +0 under round-to-nearest; not folded away without fast-math
  const uint32_t u = __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(kFull, v, o);
  return v;
}

template <typename T, int VPT>
__device__ __forceinline__ void load_run(const T* run, int valid, float (&x)[VPT], float pad) {
  constexpr int kBytes = VPT * static_cast<int>(sizeof(T));
  constexpr int kVec = kBytes % 16 == 0 ? 16 : kBytes % 8 == 0 ? 8 : kBytes % 4 == 0 ? 4 : 0;
  if constexpr (kVec != 0) {
    if (valid >= VPT && (reinterpret_cast<uintptr_t>(run) % kVec) == 0) {
      alignas(16) T buf[VPT];
      using V = typename std::conditional<
          kVec == 16, uint4, typename std::conditional<kVec == 8, uint2, uint32_t>::type>::type;
#pragma unroll
      for (int j = 0; j < kBytes / kVec; ++j)
        reinterpret_cast<V*>(buf)[j] = __ldg(reinterpret_cast<const V*>(run) + j);
#pragma unroll
      for (int i = 0; i < VPT; ++i)
        x[i] = to_f32(buf[i]);
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < VPT; ++i)
    x[i] = i < valid ? to_f32(run[i]) : pad;
}

__device__ __forceinline__ float key_to_float(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

template <typename T, int VPT>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    topk_router_kernel(const TopkRouterParams p) {
  pdl_wait_and_release();
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= p.num_tokens) return;
  const int E = p.num_experts;
  const int e0 = lane * VPT;
  int nvalid = E - e0;
  nvalid = nvalid < 0 ? 0 : (nvalid > VPT ? VPT : nvalid);

  // 1. load (and the bias, independent of the logits)
  float x[VPT];
  load_run<T, VPT>(static_cast<const T*>(p.logits) + row * p.logits_row_stride + e0, nvalid, x,
                   -INFINITY);
  const float* bias = p.e_score_correction_bias;
  float b[VPT];
  if (bias != nullptr) {
    load_run<float, VPT>(bias + e0, nvalid, b, 0.0f);
  }

  // 2. scores (NOTE: router.h's rules: NaN scores 0 and stays out of the softmax normalization;
  // +inf experts share the mass, or all non-NaN experts when every one is -inf)
  float s[VPT];
  if (p.scoring == RouterScoring::kSoftmax) {
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < VPT; ++i)
      m = fmaxf(m, x[i]);  // fmaxf ignores NaN
    m = key_to_float(__reduce_max_sync(kFull, order_key(m)));
    const bool inf_max = isinf(m);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const float ev = x[i] != x[i] ? 0.0f : inf_max ? (x[i] == m ? 1.0f : 0.0f) : expf(x[i] - m);
      s[i] = i < nvalid ? ev : 0.0f;
      sum += s[i];
    }
    sum = warp_sum(sum);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;  // 0: a row of only NaN
#pragma unroll
    for (int i = 0; i < VPT; ++i)
      s[i] *= inv;
  } else {
#pragma unroll
    for (int i = 0; i < VPT; ++i)
      s[i] = x[i] != x[i] ? 0.0f : 1.0f / (1.0f + expf(-x[i]));
  }

  // 3. selection values and keys (0: padding or already picked; 1: excluded group)
  const bool llama4 = p.scoring == RouterScoring::kLlama4;
  float sel[VPT];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    float v = llama4 ? x[i] : s[i];
    if (!llama4 && bias != nullptr && i < nvalid) v += b[i];
    if (x[i] != x[i] || v != v) v = -INFINITY;  // a NaN logit selects last; -inf is not special
    sel[i] = v;
  }
  uint32_t key[VPT];
#pragma unroll
  for (int i = 0; i < VPT; ++i)
    key[i] = i < nvalid ? order_key(sel[i]) : 0u;

  if (p.num_expert_group > 1) {
    const int G = p.num_expert_group;
    const int gsize = E / G;
    const bool top2 = bias != nullptr && gsize >= 2;
    const int L = gsize / VPT;  // lanes per group on the fast path
    if (gsize % VPT == 0 && (L & (L - 1)) == 0) {
      // Fast path: every group is L whole lanes, L a power of two.
      float a1 = -INFINITY, a2 = -INFINITY;
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const float v = sel[i];
        if (v > a1) {
          a2 = a1;
          a1 = v;
        } else if (v > a2) {
          a2 = v;
        }
      }
      for (int o = 1; o < L; o <<= 1) {
        const float b1 = __shfl_xor_sync(kFull, a1, o);
        const float b2 = __shfl_xor_sync(kFull, a2, o);
        const float hi = fmaxf(a1, b1);
        a2 = fmaxf(fminf(a1, b1), fmaxf(a2, b2));
        a1 = hi;
      }
      const uint32_t gk = order_key(top2 ? a1 + a2 : a1);
      const int g = lane / L;
      int rank = 0;
      for (int j = 0; j < G; ++j) {
        const uint32_t kj = __shfl_sync(kFull, gk, j * L);
        rank += (kj > gk || (kj == gk && j < g)) ? 1 : 0;
      }
      if (g < G && rank >= p.topk_group) {
#pragma unroll
        for (int i = 0; i < VPT; ++i)
          key[i] = i < nvalid ? 1u : 0u;
      }
    } else {
      int grp[VPT];
#pragma unroll
      for (int i = 0; i < VPT; ++i)
        grp[i] = (e0 + i) / gsize;  // >= G for padding
      uint32_t my_gkey = 0;         // lane g holds group g's key
      for (int g = 0; g < G; ++g) {
        float a1 = -INFINITY, a2 = -INFINITY;
#pragma unroll
        for (int i = 0; i < VPT; ++i) {
          if (grp[i] == g) {
            const float v = sel[i];
            if (v > a1) {
              a2 = a1;
              a1 = v;
            } else if (v > a2) {
              a2 = v;
            }
          }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
          const float b1 = __shfl_xor_sync(kFull, a1, o);
          const float b2 = __shfl_xor_sync(kFull, a2, o);
          const float hi = fmaxf(a1, b1);
          a2 = fmaxf(fminf(a1, b1), fmaxf(a2, b2));
          a1 = hi;
        }
        if (lane == g) my_gkey = order_key(top2 ? a1 + a2 : a1);
      }
      int rank = 0;
      for (int j = 0; j < G; ++j) {
        const uint32_t kj = __shfl_sync(kFull, my_gkey, j);
        rank += (kj > my_gkey || (kj == my_gkey && j < lane)) ? 1 : 0;
      }
      const uint32_t keep = __ballot_sync(kFull, lane < G && rank < p.topk_group);
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        if (i < nvalid && !((keep >> grp[i]) & 1u)) key[i] = 1u;
      }
    }
  }

  // 4. top-k: per round, warp max of the lanes' best keys, then the lowest id holding it.
  uint32_t bk = key[0];
  float bs = s[0];
  int bi = 0;
#pragma unroll
  for (int i = 1; i < VPT; ++i) {
    if (key[i] > bk) {
      bk = key[i];
      bs = s[i];
      bi = i;
    }
  }
  int my_id = 0;
  float my_w = 0.0f;
  float total = 0.0f;
  for (int j = 0; j < p.top_k; ++j) {
    const uint32_t wmax = __reduce_max_sync(kFull, bk);
    const uint32_t cand = bk == wmax ? static_cast<uint32_t>(e0 + bi) : 0xffffffffu;
    const int e = static_cast<int>(__reduce_min_sync(kFull, cand));
    const int owner = e / VPT;
    const float w = __shfl_sync(kFull, bs, owner);
    if (lane == owner) {
      const int slot = e - e0;
#pragma unroll
      for (int i = 0; i < VPT; ++i)
        if (i == slot) key[i] = 0u;
      bk = key[0];
      bs = s[0];
      bi = 0;
#pragma unroll
      for (int i = 1; i < VPT; ++i) {
        if (key[i] > bk) {
          bk = key[i];
          bs = s[i];
          bi = i;
        }
      }
    }
    total += w;
    if (lane == j) {
      my_id = e;
      my_w = w;
    }
  }

  // 5. weights
  if (p.renormalize && total > 0.0f) my_w = my_w / total;
  my_w *= p.routed_scaling_factor;
  const int64_t stride = p.top_k + p.extra_slots;
  if (lane < p.top_k) {
    p.topk_ids[row * stride + lane] = my_id;
    p.topk_weights[row * stride + lane] = my_w;
  }
  for (int j = lane; j < p.extra_slots; j += 32) {
    p.topk_ids[row * stride + p.top_k + j] = p.extra_first_id + j;
    p.topk_weights[row * stride + p.top_k + j] = 1.0f;
  }
}

template <typename T, int VPT>
cudaError_t launch_vpt(const TopkRouterParams& p, dim3 grid, dim3 block, cudaStream_t stream) {
  return launch_pdl(topk_router_kernel<T, VPT>, grid, block, 0, stream, p);
}

// Experts per lane: the smallest of 1, 2, 4, 8, 16, 32 that covers E (up to 1024).
template <typename T>
cudaError_t launch_typed(const TopkRouterParams& p, dim3 grid, dim3 block, cudaStream_t stream) {
  const int vpt = (p.num_experts + 31) / 32;
  if (vpt <= 1) return launch_vpt<T, 1>(p, grid, block, stream);
  if (vpt <= 2) return launch_vpt<T, 2>(p, grid, block, stream);
  if (vpt <= 4) return launch_vpt<T, 4>(p, grid, block, stream);
  if (vpt <= 8) return launch_vpt<T, 8>(p, grid, block, stream);
  if (vpt <= 16) return launch_vpt<T, 16>(p, grid, block, stream);
  return launch_vpt<T, 32>(p, grid, block, stream);
}

}  // namespace

const char* topk_router_unsupported_reason(const TopkRouterParams& p) {
  if (p.num_tokens < 0) return "num_tokens < 0";
  if (p.num_experts < 1 || p.num_experts > 1024) return "num_experts must be in [1, 1024]";
  if (p.top_k < 1 || p.top_k > 32) return "top_k must be in [1, 32]";
  if (p.top_k > p.num_experts) return "top_k > num_experts";
  if (p.extra_slots < 0 || p.extra_first_id < 0) return "extra_slots / extra_first_id < 0";
  if (p.num_tokens > 0 &&
      (p.logits == nullptr || p.topk_weights == nullptr || p.topk_ids == nullptr))
    return "null logits / topk_weights / topk_ids pointer";
  if (p.logits_row_stride < p.num_experts) return "logits_row_stride < num_experts";
  if (p.num_expert_group > 1) {
    if (p.num_expert_group > 32) return "num_expert_group > 32 is not supported";
    if (p.num_experts % p.num_expert_group != 0) return "num_experts % num_expert_group != 0";
    if (p.topk_group < 1 || p.topk_group > p.num_expert_group)
      return "topk_group must be in [1, num_expert_group]";
  }
  if (p.scoring != RouterScoring::kSoftmax && p.scoring != RouterScoring::kSigmoid &&
      p.scoring != RouterScoring::kLlama4)
    return "unknown scoring";
  if (!is_float_storage(p.logits_type)) return "logits type must be f32, bf16 or f16";
  return nullptr;
}

cudaError_t launch_topk_router(const TopkRouterParams& p, cudaStream_t stream) {
  if (topk_router_unsupported_reason(p) != nullptr) return cudaErrorInvalidValue;
  if (p.num_tokens == 0) return cudaSuccess;
  const int64_t blocks = (p.num_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(blocks));
  const dim3 block(kWarpsPerBlock * 32);
  cudaError_t err = cudaSuccess;
  dispatch_float_type(p.logits_type,
                      [&](auto tag) { err = launch_typed<decltype(tag)>(p, grid, block, stream); });
  if (err != cudaSuccess) return err;
  return cudaGetLastError();
}

}  // namespace moekit::cuda
