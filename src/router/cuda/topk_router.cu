// Fused top-k router: one warp per token row.
//
// This kernel does, per row:
//   1. load the E logits, lane l holding experts l, l+32, ... (NaN -> -inf);
//   2. score them in fp32 (softmax with warp reductions, or sigmoid);
//   3. build 32-bit order-preserving selection keys from score (+ bias); experts of groups that are
//      not among the top `topk_group` groups get the lowest key class;
//   4. pick k times the warp-wide maximum of (key << 32 | ~expert_id), so ties go to the lower id
//      and every pick is a distinct valid expert;
//   5. gather the unbiased weights, renormalize and scale them, and store ids and weights.
#include "router/cuda/topk_router.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

namespace moekit::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr unsigned kFull = 0xffffffffu;

// Order-preserving map float -> uint32 (larger float, larger key). NaN counts as -inf. The result
// is >= 0x007fffff for every float, so 0 stays free for "excluded".
__device__ __forceinline__ uint32_t order_key(float v) {
  if (v != v) v = -INFINITY;
  const uint32_t u = __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(kFull, v, o);
  return v;
}

__device__ __forceinline__ uint64_t warp_max_u64(uint64_t v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const uint64_t w = __shfl_xor_sync(kFull, v, o);
    v = w > v ? w : v;
  }
  return v;
}

template <typename T>
__device__ __forceinline__ float to_f32(T v);
template <>
__device__ __forceinline__ float to_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <>
__device__ __forceinline__ float to_f32<__half>(__half v) {
  return __half2float(v);
}

template <typename T, int VPT>
__device__ __forceinline__ void load_row(const void* base, int E, int lane, float (&x)[VPT]) {
  const T* row = static_cast<const T*>(base);
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int e = i * 32 + lane;
    x[i] = e < E ? to_f32(row[e]) : -INFINITY;
  }
}

template <int VPT>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    topk_router_kernel(const TopkRouterParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= p.num_tokens) return;
  const int E = p.num_experts;

  // 1. load
  float x[VPT];
  switch (p.logits_type) {
    case LogitsType::kF32:
      load_row<float, VPT>(static_cast<const float*>(p.logits) + row * p.logits_row_stride, E, lane,
                           x);
      break;
    case LogitsType::kBF16:
      load_row<__nv_bfloat16, VPT>(
          static_cast<const __nv_bfloat16*>(p.logits) + row * p.logits_row_stride, E, lane, x);
      break;
    default:
      load_row<__half, VPT>(static_cast<const __half*>(p.logits) + row * p.logits_row_stride, E,
                            lane, x);
      break;
  }
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    if (x[i] != x[i]) x[i] = -INFINITY;
  }

  // 2. scores
  float s[VPT];
  if (p.scoring == RouterScoring::kSoftmax) {
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < VPT; ++i)
      m = fmaxf(m, x[i]);
    m = warp_max(m);
    const bool inf_max = isinf(m);  // all -inf (uniform) or some +inf (shared among the +inf)
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const bool valid = i * 32 + lane < E;
      const float ev = inf_max ? (x[i] == m ? 1.0f : 0.0f) : expf(x[i] - m);
      s[i] = valid ? ev : 0.0f;
      sum += s[i];
    }
    sum = warp_sum(sum);
    const float inv = 1.0f / sum;
#pragma unroll
    for (int i = 0; i < VPT; ++i)
      s[i] *= inv;
  } else {
#pragma unroll
    for (int i = 0; i < VPT; ++i)
      s[i] = 1.0f / (1.0f + expf(-x[i]));
  }

  // 3. selection keys
  const float* bias = p.e_score_correction_bias;
  const bool llama4 = p.scoring == RouterScoring::kLlama4;
  float sel[VPT];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int e = i * 32 + lane;
    float v = llama4 ? x[i] : s[i];
    if (bias != nullptr && e < E) v += bias[e];
    if (v != v) v = -INFINITY;
    sel[i] = v;
  }
  // NOTE: NaN and -inf logits select as -inf even when score + bias is finite: they come last.
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    if (x[i] == -INFINITY) sel[i] = -INFINITY;
  }

  uint32_t key[VPT];
#pragma unroll
  for (int i = 0; i < VPT; ++i)
    key[i] = i * 32 + lane < E ? order_key(sel[i]) : 0u;

  if (p.num_expert_group > 1) {
    const int G = p.num_expert_group;
    const int gsize = E / G;
    int grp[VPT];
#pragma unroll
    for (int i = 0; i < VPT; ++i)
      grp[i] = (i * 32 + lane) / gsize;  // >= G for padding lanes
    const bool top2 = bias != nullptr && gsize >= 2;
    uint32_t my_gkey = 0;  // lane g holds group g's key
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
      const float gscore = top2 ? a1 + a2 : a1;
      if (lane == g) my_gkey = order_key(gscore);
    }
    // Pick topk_group groups; ties go to the lower group id.
    uint64_t gk = lane < G ? (static_cast<uint64_t>(my_gkey) << 32) | (0xffffffffu - lane) : 0;
    uint32_t keep = 0;
    for (int t = 0; t < p.topk_group; ++t) {
      const uint64_t best = warp_max_u64(gk);
      const int g = static_cast<int>(0xffffffffu - static_cast<uint32_t>(best));
      keep |= 1u << g;
      if (lane == g) gk = 0;
    }
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      if (grp[i] < 32 && !((keep >> grp[i]) & 1u)) key[i] = 0u;  // excluded group (id still kept)
    }
  }

  // 4. top-k
  uint64_t k64[VPT];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int e = i * 32 + lane;
    k64[i] = e < E
                 ? (static_cast<uint64_t>(key[i]) << 32) | (0xffffffffu - static_cast<uint32_t>(e))
                 : 0ull;
  }
  int my_id = 0;
  float my_w = 0.0f;
  for (int j = 0; j < p.top_k; ++j) {
    uint64_t best = 0;
#pragma unroll
    for (int i = 0; i < VPT; ++i)
      best = k64[i] > best ? k64[i] : best;
    best = warp_max_u64(best);
    const int e = static_cast<int>(0xffffffffu - static_cast<uint32_t>(best));
    const int owner = e & 31;
    const int slot = e >> 5;
    float w = 0.0f;
    if (lane == owner) {
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        if (i == slot) {
          w = s[i];
          k64[i] = 0ull;
        }
      }
    }
    w = __shfl_sync(kFull, w, owner);
    if (lane == j) {
      my_id = e;
      my_w = w;
    }
  }

  // 5. weights
  if (p.renormalize) {
    const float total = warp_sum(lane < p.top_k ? my_w : 0.0f);
    if (total > 0.0f) my_w = my_w / total;
  }
  my_w *= p.routed_scaling_factor;
  if (lane < p.top_k) {
    p.topk_ids[row * p.top_k + lane] = my_id;
    p.topk_weights[row * p.top_k + lane] = my_w;
  }
}

}  // namespace

const char* topk_router_unsupported_reason(const TopkRouterParams& p) {
  if (p.num_tokens < 0) return "num_tokens < 0";
  if (p.num_experts < 1 || p.num_experts > 1024) return "num_experts must be in [1, 1024]";
  if (p.top_k < 1 || p.top_k > 32) return "top_k must be in [1, 32]";
  if (p.top_k > p.num_experts) return "top_k > num_experts";
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
  if (p.logits_type != LogitsType::kF32 && p.logits_type != LogitsType::kBF16 &&
      p.logits_type != LogitsType::kF16)
    return "unknown logits type";
  return nullptr;
}

cudaError_t launch_topk_router(const TopkRouterParams& p, cudaStream_t stream) {
  if (topk_router_unsupported_reason(p) != nullptr) return cudaErrorInvalidValue;
  if (p.num_tokens == 0) return cudaSuccess;
  const int64_t blocks = (p.num_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(blocks));
  const dim3 block(kWarpsPerBlock * 32);
  const int vpt = (p.num_experts + 31) / 32;
  if (vpt <= 1) {
    topk_router_kernel<1><<<grid, block, 0, stream>>>(p);
  } else if (vpt <= 2) {
    topk_router_kernel<2><<<grid, block, 0, stream>>>(p);
  } else if (vpt <= 4) {
    topk_router_kernel<4><<<grid, block, 0, stream>>>(p);
  } else if (vpt <= 8) {
    topk_router_kernel<8><<<grid, block, 0, stream>>>(p);
  } else if (vpt <= 16) {
    topk_router_kernel<16><<<grid, block, 0, stream>>>(p);
  } else {
    topk_router_kernel<32><<<grid, block, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace moekit::cuda
