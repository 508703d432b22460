// The device steps of the peer-memory exchange (ep_peer.h: buffer layout, order of a forward),
// each written once for the two forms of a forward: a sequence of launches (ep_peer.cu, one
// kernel per step) and the one persistent launch (ep_one_launch.cu), which walks the same steps
// with grid-wide barriers between them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstdio>

#include "core/cuda/elem_io.cuh"
#include "experts/cuda/ep_peer.h"

namespace moekit::cuda::ep {

inline constexpr int kMaxTopk = 32;
// A barrier that waits this long has lost a rank (it crashed, or ran a different number of
// forwards): the kernel reports which and traps rather than hang the process.
inline constexpr unsigned long long kBarrierTimeoutNs = 60ull * 1000 * 1000 * 1000;

__device__ __forceinline__ int owner_of(int32_t id, const ForwardArgs& a) {
  return id >= 0 && id < a.global_experts ? static_cast<int>(id / a.local_experts) : -1;
}

__device__ __forceinline__ size_t row_bytes(const PeerLayout& l) {
  return static_cast<size_t>(l.hidden) * l.elem;
}

// Copies one row of row_bytes (a multiple of 16) with the block's threads.
__device__ __forceinline__ void copy_row(char* dst, const char* src, size_t bytes) {
  const auto* s = reinterpret_cast<const uint4*>(src);
  auto* d = reinterpret_cast<uint4*>(dst);
  for (size_t i = threadIdx.x; i < bytes / 16; i += blockDim.x)
    d[i] = s[i];
}

__device__ __forceinline__ unsigned long long global_time_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// This rank's token count of the forward, into every rank's count[rank] (threads < world).
__device__ __forceinline__ void publish_count(const ForwardArgs& a) {
  const PeerLayout& l = a.layout;
  if (threadIdx.x < static_cast<unsigned>(l.world)) {
    reinterpret_cast<int32_t*>(a.peers.base[threadIdx.x] + l.count)[a.rank] =
        static_cast<int32_t>(a.M);
  }
}

// The block's shared memory of dispatch_token.
struct DispatchShared {
  int32_t ids[kMaxTopk];
  int owners[kMaxTopk];
  float weights[kMaxTopk];
};

// Token m of this rank, by the whole block: to every rank, its ids masked to that rank's experts,
// its weights and (where it has an expert there) its row. Block barriers inside: every thread of
// the block calls it with the same m.
__device__ __forceinline__ void dispatch_token(const ForwardArgs& a, int64_t m, DispatchShared& s) {
  const PeerLayout& l = a.layout;
  if (threadIdx.x < static_cast<unsigned>(l.topk)) {
    const int j = static_cast<int>(threadIdx.x);
    s.ids[j] = a.topk_ids[m * l.topk + j];
    s.owners[j] = owner_of(s.ids[j], a);
    s.weights[j] = a.topk_weights[m * l.topk + j];
  }
  __syncthreads();
  const size_t slot = static_cast<size_t>(a.rank) * l.capacity + m;
  for (int d = 0; d < l.world; ++d) {
    char* base = a.peers.base[d];
    if (threadIdx.x < static_cast<unsigned>(l.topk)) {
      const int j = static_cast<int>(threadIdx.x);
      reinterpret_cast<int32_t*>(base + l.ids)[slot * l.topk + j] =
          s.owners[j] == d ? s.ids[j] : -1;
      reinterpret_cast<float*>(base + l.w)[slot * l.topk + j] = s.weights[j];
    }
    bool needed = false;
    for (int j = 0; j < l.topk; ++j)
      needed |= s.owners[j] == d;
    if (needed) {
      copy_row(base + l.x + slot * row_bytes(l),
               static_cast<const char*>(a.x) + static_cast<size_t>(m) * row_bytes(l), row_bytes(l));
    }
  }
  __syncthreads();  // s is reused by the block's next token
}

// The ranks' barrier, by one warp: lane d raises this rank's flag on rank d to the next epoch,
// then waits until rank `lane` has raised its flag here to it. Release / acquire at system scope:
// what this rank wrote into the peers' buffers before the barrier is visible to them after it.
__device__ __forceinline__ void rank_barrier_warp(const ForwardArgs& a) {
  const PeerLayout& l = a.layout;
  auto* epoch = reinterpret_cast<unsigned long long*>(a.peers.base[a.rank] + l.epoch);
  const int lane = static_cast<int>(threadIdx.x & 31);
  unsigned long long e = 0;
  if (lane == 0) {
    e = *epoch + 1;
    *epoch = e;
  }
  e = __shfl_sync(0xffffffffu, e, 0);
  if (lane < l.world) {
    auto* theirs = reinterpret_cast<unsigned long long*>(a.peers.base[lane] + l.flag) + a.rank;
    __threadfence_system();
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(theirs), "l"(e) : "memory");
    const auto* mine =
        reinterpret_cast<const unsigned long long*>(a.peers.base[a.rank] + l.flag) + lane;
    const unsigned long long start = global_time_ns();
    for (;;) {
      unsigned long long v;
      asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(mine) : "memory");
      if (v >= e) break;
      if (global_time_ns() - start > kBarrierTimeoutNs) {
        printf("moekit: expert-parallel barrier %llu of rank %d: rank %d did not arrive in 60 s\n",
               e, a.rank, lane);
        __trap();
      }
      __nanosleep(256);
    }
  }
  __syncwarp();
}

// Token m of this rank, by the whole block: the sum, in rank order and fp32, of the partials of
// the ranks that hold one of its experts (zero when none does). `from` is block shared memory of
// kMaxRanks ints; block barriers inside.
template <typename T>
__device__ __forceinline__ void sum_token(const ForwardArgs& a, int64_t m, int* from) {
  const PeerLayout& l = a.layout;
  if (threadIdx.x < static_cast<unsigned>(l.world)) {
    bool needed = false;
    for (int j = 0; j < l.topk; ++j)
      needed |= owner_of(a.topk_ids[m * l.topk + j], a) == static_cast<int>(threadIdx.x);
    from[threadIdx.x] = needed;
  }
  __syncthreads();
  const char* base = a.peers.base[a.rank];
  constexpr int kVec = 16 / sizeof(T);
  T* out = static_cast<T*>(a.out) + m * l.hidden;
  for (int64_t c = threadIdx.x * static_cast<int64_t>(kVec); c < l.hidden;
       c += static_cast<int64_t>(blockDim.x) * kVec) {
    float acc[kVec] = {};
    for (int d = 0; d < l.world; ++d) {
      if (!from[d]) continue;
      const T* part = reinterpret_cast<const T*>(
          base + l.comb + (static_cast<size_t>(d) * l.capacity + m) * row_bytes(l));
      const uint4 raw = *reinterpret_cast<const uint4*>(part + c);
      const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int i = 0; i < kVec; ++i)
        acc[i] += to_f32(v[i]);
    }
    uint4 packed;
    T* o = reinterpret_cast<T*>(&packed);
#pragma unroll
    for (int i = 0; i < kVec; ++i)
      o[i] = from_f32<T>(acc[i]);
    *reinterpret_cast<uint4*>(out + c) = packed;
  }
  __syncthreads();  // from is reused by the block's next token
}

}  // namespace moekit::cuda::ep
