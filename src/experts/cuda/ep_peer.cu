// The peer-memory token exchange of Sm90EpPeerExperts (see ep_peer.h for the buffer layout and
// the order of a forward).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "core/cuda/cuda_check.cuh"
#include "core/cuda/elem_io.cuh"
#include "experts/cuda/ep_peer.h"

namespace moekit::cuda::ep {
namespace {

constexpr size_t kRegionAlign = 256;
constexpr int kMaxTopk = 32;
// A barrier that waits this long has lost a rank (it crashed, or ran a different number of
// forwards): the kernel reports which and traps rather than hang the process.
constexpr unsigned long long kBarrierTimeoutNs = 60ull * 1000 * 1000 * 1000;

size_t round_up(size_t v) {
  return (v + kRegionAlign - 1) / kRegionAlign * kRegionAlign;
}

// Restores the calling thread's current device.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    MOEKIT_CUDA_CHECK(cudaGetDevice(&previous_));
    MOEKIT_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceScope() { (void)cudaSetDevice(previous_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

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

// One block per token of this rank: to every rank, the token's ids masked to that rank's experts,
// its weights and (where it has an expert there) its row; block 0 also writes this rank's count.
__global__ void dispatch_kernel(ForwardArgs a) {
  const PeerLayout& l = a.layout;
  const int64_t m = blockIdx.x;
  if (m == 0 && threadIdx.x < l.world) {
    reinterpret_cast<int32_t*>(a.peers.base[threadIdx.x] + l.count)[a.rank] =
        static_cast<int32_t>(a.M);
  }
  if (m >= a.M) return;
  __shared__ int32_t ids[kMaxTopk];
  __shared__ int owners[kMaxTopk];
  __shared__ float weights[kMaxTopk];
  if (threadIdx.x < l.topk) {
    ids[threadIdx.x] = a.topk_ids[m * l.topk + threadIdx.x];
    owners[threadIdx.x] = owner_of(ids[threadIdx.x], a);
    weights[threadIdx.x] = a.topk_weights[m * l.topk + threadIdx.x];
  }
  __syncthreads();
  const size_t slot = static_cast<size_t>(a.rank) * l.capacity + m;
  for (int d = 0; d < l.world; ++d) {
    char* base = a.peers.base[d];
    if (threadIdx.x < l.topk) {
      const int j = threadIdx.x;
      reinterpret_cast<int32_t*>(base + l.ids)[slot * l.topk + j] = owners[j] == d ? ids[j] : -1;
      reinterpret_cast<float*>(base + l.w)[slot * l.topk + j] = weights[j];
    }
    bool needed = false;
    for (int j = 0; j < l.topk; ++j)
      needed |= owners[j] == d;
    if (needed) {
      copy_row(base + l.x + slot * row_bytes(l),
               static_cast<const char*>(a.x) + static_cast<size_t>(m) * row_bytes(l), row_bytes(l));
    }
  }
}

__device__ __forceinline__ unsigned long long global_time_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One warp: lane d raises this rank's flag on rank d to the next epoch, then waits until rank
// `lane` has raised its flag here to it. Release / acquire at system scope: what this rank wrote
// into the peers' buffers before the barrier is visible to them after it.
__global__ void barrier_kernel(ForwardArgs a) {
  const PeerLayout& l = a.layout;
  auto* epoch = reinterpret_cast<unsigned long long*>(a.peers.base[a.rank] + l.epoch);
  unsigned long long e = 0;
  if (threadIdx.x == 0) {
    e = *epoch + 1;
    *epoch = e;
  }
  e = __shfl_sync(0xffffffffu, e, 0);
  const int lane = static_cast<int>(threadIdx.x);
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

// Received rows past a source's count go nowhere this forward (their ids are stale).
__global__ void mask_kernel(ForwardArgs a) {
  const PeerLayout& l = a.layout;
  char* base = a.peers.base[a.rank];
  const auto* count = reinterpret_cast<const int32_t*>(base + l.count);
  auto* ids = reinterpret_cast<int32_t*>(base + l.ids);
  const int64_t total = l.world * l.capacity * l.topk;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / l.topk;
    if (row % l.capacity >= count[row / l.capacity]) ids[i] = -1;
  }
}

// Each received row that had an expert here sends its partial output back to its source rank.
__global__ void combine_kernel(ForwardArgs a) {
  const PeerLayout& l = a.layout;
  const char* base = a.peers.base[a.rank];
  const auto* count = reinterpret_cast<const int32_t*>(base + l.count);
  const auto* ids = reinterpret_cast<const int32_t*>(base + l.ids);
  const int64_t rows = l.world * l.capacity;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int s = static_cast<int>(row / l.capacity);
    const int64_t m = row % l.capacity;
    if (m >= count[s]) continue;
    bool here = false;
    for (int j = 0; j < l.topk; ++j)
      here |= ids[row * l.topk + j] >= 0;
    if (!here) continue;
    copy_row(
        a.peers.base[s] + l.comb + (static_cast<size_t>(a.rank) * l.capacity + m) * row_bytes(l),
        static_cast<const char*>(a.partial) + static_cast<size_t>(row) * row_bytes(l),
        row_bytes(l));
  }
}

// One block per token of this rank: the sum, in rank order and fp32, of the partials of the
// ranks that hold one of its experts (zero when none does).
template <typename T>
__global__ void sum_kernel(ForwardArgs a) {
  const PeerLayout& l = a.layout;
  const int64_t m = blockIdx.x;
  __shared__ int from[kMaxRanks];
  if (threadIdx.x < l.world) {
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
}

cudaStream_t stream_of(const ForwardArgs& a) {
  return static_cast<cudaStream_t>(a.stream);
}

}  // namespace

PeerLayout make_peer_layout(int world, int64_t capacity, int64_t hidden, int topk, size_t elem) {
  PeerLayout l;
  l.world = world;
  l.capacity = capacity;
  l.hidden = hidden;
  l.topk = topk;
  l.elem = elem;
  const size_t rows = static_cast<size_t>(world) * static_cast<size_t>(capacity);
  size_t at = 0;
  auto region = [&at](size_t bytes) {
    const size_t start = at;
    at = round_up(at + bytes);
    return start;
  };
  l.x = region(rows * static_cast<size_t>(hidden) * elem);
  l.ids = region(rows * static_cast<size_t>(topk) * sizeof(int32_t));
  l.w = region(rows * static_cast<size_t>(topk) * sizeof(float));
  l.comb = region(rows * static_cast<size_t>(hidden) * elem);
  l.count = region(static_cast<size_t>(world) * sizeof(int32_t));
  l.flag = region(static_cast<size_t>(world) * sizeof(unsigned long long));
  l.epoch = region(sizeof(unsigned long long));
  l.bytes = at;
  return l;
}

OwnBuffer allocate_peer_buffer(const PeerLayout& layout, int device) {
  DeviceScope scope(device);
  OwnBuffer b;
  void* p = nullptr;
  MOEKIT_CUDA_CHECK(cudaMalloc(&p, layout.bytes));
  b.base = static_cast<char*>(p);
  // Zero counts, flags and the epoch (and the rest: no stale NaN ever reaches a GEMM) before any
  // peer can learn the handle.
  MOEKIT_CUDA_CHECK(cudaMemset(p, 0, layout.bytes));
  MOEKIT_CUDA_CHECK(cudaDeviceSynchronize());
  cudaIpcMemHandle_t h;
  MOEKIT_CUDA_CHECK(cudaIpcGetMemHandle(&h, p));
  static_assert(sizeof(h) == sizeof(b.handle));
  std::memcpy(b.handle.data(), &h, sizeof(h));
  return b;
}

char* open_peer_buffer(const std::array<int64_t, 8>& handle, int device) {
  DeviceScope scope(device);
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  void* p = nullptr;
  MOEKIT_CUDA_CHECK(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
  return static_cast<char*>(p);
}

void close_peer_buffer(char* base) {
  if (base != nullptr) (void)cudaIpcCloseMemHandle(base);
}

void free_peer_buffer(char* base) {
  if (base != nullptr) (void)cudaFree(base);
}

int launch_dispatch(const ForwardArgs& a) {
  dispatch_kernel<<<static_cast<unsigned>(std::max<int64_t>(a.M, 1)), 128, 0, stream_of(a)>>>(a);
  return static_cast<int>(cudaGetLastError());
}

int launch_barrier(const ForwardArgs& a) {
  barrier_kernel<<<1, 32, 0, stream_of(a)>>>(a);
  return static_cast<int>(cudaGetLastError());
}

int launch_mask_received(const ForwardArgs& a) {
  const int64_t total = a.layout.world * a.layout.capacity * a.layout.topk;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, 1024));
  mask_kernel<<<std::max(blocks, 1u), 256, 0, stream_of(a)>>>(a);
  return static_cast<int>(cudaGetLastError());
}

int launch_combine(const ForwardArgs& a) {
  const int64_t rows = a.layout.world * a.layout.capacity;
  combine_kernel<<<static_cast<unsigned>(std::min<int64_t>(rows, 2048)), 128, 0, stream_of(a)>>>(a);
  return static_cast<int>(cudaGetLastError());
}

int launch_sum(const ForwardArgs& a) {
  if (a.M == 0) return 0;
  const auto blocks = static_cast<unsigned>(a.M);
  if (a.f16) {
    sum_kernel<__half><<<blocks, 128, 0, stream_of(a)>>>(a);
  } else {
    sum_kernel<__nv_bfloat16><<<blocks, 128, 0, stream_of(a)>>>(a);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace moekit::cuda::ep
